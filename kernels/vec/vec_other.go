//go:build !amd64

package vec

// HasSIMD reports whether the assembly kernels are in use.
const HasSIMD = false

func dot(a, b []float32) float32 { return dotGeneric(a, b) }

func sum(a []float32) float32 { return sumGeneric(a) }

func dotBF16(x []float32, w []uint16) float32 { return dotBF16Generic(x, w) }

func dotF16(x []float32, w []uint16) float32 { return dotF16Generic(x, w) }

func dotQ8(xq []int8, xd []float32, _ []int32, q []int8, d []float32) float32 {
	return dotQ8Generic(xq, xd, q, d)
}

// Dot2x4 sets out[i*4+j] = Dot(x[i*ldx:][:k], w[j*ldw:][:k]).
func Dot2x4(x []float32, ldx int, w []float32, ldw int, k int, out *[8]float32) {
	for i := range 2 {
		for j := range 4 {
			out[i*4+j] = dotGeneric(x[i*ldx:i*ldx+k], w[j*ldw:j*ldw+k])
		}
	}
}

// Dot1x4 sets out[j] = Dot(x[:k], w[j*ldw:][:k]), as Dot2x4 does for a row.
func Dot1x4(x []float32, w []float32, ldw int, k int, out *[4]float32) {
	for j := range 4 {
		out[j] = dotGeneric(x[:k], w[j*ldw:j*ldw+k])
	}
}

// Gemm4x16 adds to a 4×16 tile of c the product of 4 rows of a and a k×16
// block of b.
func Gemm4x16(a []float32, lda int, b []float32, ldb int, k int, c []float32, ldc int) {
	gemm4x16Generic(a, lda, b, ldb, k, c, ldc)
}

// ExpSub sets x[i] = exp(x[i] − m) and returns the sum.
func ExpSub(x []float32, m float32) float32 { return expSubGeneric(x, m) }

func dotQ8Rows(y []float32, xq []int8, xd []float32, xs []int32, q []int8, d []float32) bool {
	return false
}

func dot16Rows(y, x []float32, w []uint16, f16 bool) bool { return false }

func scaleMax(x []float32, s float32) float32 { return scaleMaxGeneric(x, s) }

func scale(x []float32, s float32) { scaleGeneric(x, s) }

func axpy(y, x []float32, a float32) { axpyGeneric(y, x[:len(y)], a) }

// HasBF16Dot reports whether DotBF16x4x4 runs on AVX512_BF16.
const HasBF16Dot = false

func dotBF16x4x4(x []uint16, ldx int, w []uint16, ldw int, k int, out *[16]float32) {
	dotBF16x4x4Generic(x, ldx, w, ldw, k, out)
}

// Has16Dot reports whether Dot16x4x4 runs on AVX-512.
const Has16Dot = false

func dot16x4x4(x []float32, ldx int, w []uint16, ldw int, k int, f16 bool, out *[16]float32) {
	dot16x4x4Generic(x, ldx, w, ldw, k, f16, out)
}

// HasQ8Gemm reports whether GemmQ8x6x16 runs on AVX-512 VNNI.
const HasQ8Gemm = false

func gemmQ8x6x16(x []uint32, ldx int, xd []float32, xc []int32, ldd int, w []uint32, wd []float32, nb int, y []float32, ldy int) {
	gemmQ8x6x16Generic(x, ldx, xd, xc, ldd, w, wd, nb, y, ldy)
}
