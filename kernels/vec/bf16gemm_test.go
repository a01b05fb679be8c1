package vec

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/agemem/agemem/kernels/half"
)

// TestGemmBF16x6x32: the tile on AVX512_BF16 (where the CPU has it) and in
// Go against a float64 sum of the same bf16 products, for lengths that
// leave the loop one pair and many, rows wider than the pairs used.
func TestGemmBF16x6x32(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for _, kp := range []int{0, 1, 7, 64, 448} {
		ldx, ldy := kp+3, 40
		x := make([]uint32, 5*ldx+kp+1)
		w := make([]uint32, kp*32+1)
		pair := func() uint32 {
			return uint32(half.F32ToBF16(float32(r.NormFloat64()))) | uint32(half.F32ToBF16(float32(r.NormFloat64())))<<16
		}
		for i := range x {
			x[i] = pair()
		}
		for i := range w {
			w[i] = pair()
		}
		for name, f := range map[string]func(x []uint32, ldx int, w []uint32, kp int, y []float32, ldy int){
			"dispatch": GemmBF16x6x32, "generic": gemmBF16x6x32Generic,
		} {
			y := make([]float32, 5*ldy+32)
			for i := range y {
				y[i] = float32(math.NaN()) // every element of the tile is written
			}
			f(x, ldx, w, kp, y, ldy)
			for row := range 6 {
				for c := range 32 {
					var want, mag float64
					for p := range kp {
						a, b := x[row*ldx+p], w[p*32+c]
						lo := float64(bf16Lo(a)) * float64(bf16Lo(b))
						hi := float64(bf16Hi(a)) * float64(bf16Hi(b))
						want += lo + hi
						mag += math.Abs(lo) + math.Abs(hi)
					}
					got := float64(y[row*ldy+c])
					if math.Abs(got-want) > 1e-6*mag+1e-30 || math.IsNaN(got) {
						t.Fatalf("%s kp %d: y[%d][%d] = %g, want %g (products' magnitude %g)", name, kp, row, c, got, want, mag)
					}
				}
			}
		}
	}
	t.Logf("AVX512_BF16: %v", HasBF16Dot)
}
