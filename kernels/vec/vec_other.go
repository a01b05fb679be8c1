//go:build !amd64

package vec

// HasSIMD reports whether the assembly kernels are in use.
const HasSIMD = false

func dot(a, b []float32) float32 { return dotGeneric(a, b) }

func sum(a []float32) float32 { return sumGeneric(a) }

func dotBF16(x []float32, w []uint16) float32 { return dotBF16Generic(x, w) }

// Dot2x4 sets out[i*4+j] = Dot(x[i*ldx:][:k], w[j*ldw:][:k]).
func Dot2x4(x []float32, ldx int, w []float32, ldw int, k int, out *[8]float32) {
	for i := range 2 {
		for j := range 4 {
			out[i*4+j] = dotGeneric(x[i*ldx:i*ldx+k], w[j*ldw:j*ldw+k])
		}
	}
}
