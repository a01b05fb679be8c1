package vec

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/agemem/agemem/kernels/half"
)

// TestDotBF16x4x4: the tile on AVX512_BF16 (where the CPU has it) and in
// Go against a float64 sum of the same bf16 products, for lengths of
// whole 32-value steps (one and many), one the Go tile takes alone (40),
// and rows wider than the values used.
func TestDotBF16x4x4(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for _, k := range []int{0, 32, 40, 96, 896} {
		ldx, ldw := k+5, k+64
		x, w := make([]uint16, 3*ldx+k), make([]uint16, 3*ldw+k)
		for i := range x {
			x[i] = half.F32ToBF16(float32(r.NormFloat64()))
		}
		for i := range w {
			w[i] = half.F32ToBF16(float32(r.NormFloat64()))
		}
		for name, f := range map[string]func([]uint16, int, []uint16, int, int, *[16]float32){
			"dispatch": DotBF16x4x4, "generic": dotBF16x4x4Generic,
		} {
			var out [16]float32
			for i := range out {
				out[i] = float32(math.NaN()) // every element is written
			}
			f(x, ldx, w, ldw, k, &out)
			for row := range 4 {
				for c := range 4 {
					var want, mag float64
					for i := range k {
						v := float64(half.BF16ToF32(x[row*ldx+i])) * float64(half.BF16ToF32(w[c*ldw+i]))
						want += v
						mag += math.Abs(v)
					}
					got := float64(out[4*row+c])
					if math.IsNaN(got) || math.Abs(got-want) > 1e-6*mag+1e-30 {
						t.Fatalf("%s k %d: out[%d][%d] = %g, want %g (products' magnitude %g)", name, k, row, c, got, want, mag)
					}
				}
			}
		}
	}
	t.Logf("AVX512_BF16: %v", HasBF16Dot)
}

// TestDot16x4x4: the AVX-512 tiles (where the CPU has them) and the Go
// one, for f16 and bf16 weights, against a float64 sum of the same
// float32 × 16-bit products, for whole 16-value steps (one and many), a
// length the Go tile takes alone (40), and rows wider than the values
// used; the halves include subnormals and the largest finite value, which
// VCVTPH2PS must widen exactly.
func TestDot16x4x4(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	for _, f16 := range []bool{true, false} {
		widen, narrow := half.BF16ToF32, half.F32ToBF16
		if f16 {
			widen, narrow = half.F16ToF32, half.F32ToF16
		}
		for _, k := range []int{0, 16, 40, 96, 896} {
			ldx, ldw := k+3, k+48
			x, w := make([]float32, 3*ldx+k), make([]uint16, 3*ldw+k)
			for i := range x {
				x[i] = float32(r.NormFloat64())
			}
			for i := range w {
				w[i] = narrow(float32(r.NormFloat64()))
				if f16 && i%97 == 5 {
					w[i] = 0x0001 | uint16(r.IntN(2))<<15 // the smallest subnormal
				}
				if f16 && i%97 == 11 {
					w[i] = 0x7bff // 65504
				}
			}
			for name, f := range map[string]func([]float32, int, []uint16, int, int, bool, *[16]float32){
				"dispatch": Dot16x4x4, "generic": dot16x4x4Generic,
			} {
				var out [16]float32
				for i := range out {
					out[i] = float32(math.NaN()) // every element is written
				}
				f(x, ldx, w, ldw, k, f16, &out)
				for row := range 4 {
					for c := range 4 {
						var want, mag float64
						for i := range k {
							v := float64(x[row*ldx+i]) * float64(widen(w[c*ldw+i]))
							want += v
							mag += math.Abs(v)
						}
						got := float64(out[4*row+c])
						if math.IsNaN(got) || math.Abs(got-want) > 1e-6*mag+1e-30 {
							t.Fatalf("%s f16 %v k %d: out[%d][%d] = %g, want %g (products' magnitude %g)", name, f16, k, row, c, got, want, mag)
						}
					}
				}
			}
		}
	}
	t.Logf("AVX-512: %v", Has16Dot)
}

// TestGemmQ8x6x16: the VNNI tile (where the CPU has it) and the Go one
// against float64 sums of the exact block dot products times both scales,
// with w's quants offset to unsigned and xc undoing it, over 0, 1 and many
// blocks and rows wider than the blocks used.
func TestGemmQ8x6x16(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	for _, nb := range []int{0, 1, 3, 28} {
		ldx, ldd, ldy := 8*nb+8, nb+2, 20
		xq := make([]int8, 6*ldx*4)
		for i := range xq {
			xq[i] = int8(r.IntN(255) - 127)
		}
		x := make([]uint32, 6*ldx)
		for i := range x {
			for b := range 4 {
				x[i] |= uint32(uint8(xq[4*i+b])) << (8 * b)
			}
		}
		xd, xc := make([]float32, 6*ldd), make([]int32, 6*ldd)
		for row := range 6 {
			for b := range nb {
				xd[row*ldd+b] = float32(r.Float64()) / 64
				for _, v := range xq[(row*ldx+b*8)*4 : (row*ldx+b*8+8)*4] {
					xc[row*ldd+b] -= 128 * int32(v)
				}
			}
		}
		wq := make([]int8, nb*512) // [block][column][32]
		for i := range wq {
			wq[i] = int8(r.IntN(255) - 127)
		}
		w, wd := make([]uint32, nb*128), make([]float32, nb*16)
		for b := range nb {
			for c := range 16 {
				for g := range 8 {
					for k := range 4 {
						w[b*128+g*16+c] |= uint32(uint8(wq[(b*16+c)*32+g*4+k])^0x80) << (8 * k)
					}
				}
				wd[b*16+c] = float32(r.Float64()) / 64
			}
		}
		for name, f := range map[string]func([]uint32, int, []float32, []int32, int, []uint32, []float32, int, []float32, int){
			"dispatch": GemmQ8x6x16, "generic": gemmQ8x6x16Generic,
		} {
			y := make([]float32, 5*ldy+16)
			for i := range y {
				y[i] = float32(math.NaN())
			}
			f(x, ldx, xd, xc, ldd, w, wd, nb, y, ldy)
			for row := range 6 {
				for c := range 16 {
					var want, mag float64
					for b := range nb {
						var s int64
						for i := range 32 {
							s += int64(xq[(row*ldx+b*8)*4+i]) * int64(wq[(b*16+c)*32+i])
						}
						v := float64(s) * float64(xd[row*ldd+b]) * float64(wd[b*16+c])
						want += v
						mag += math.Abs(v)
					}
					got := float64(y[row*ldy+c])
					if math.IsNaN(got) || math.Abs(got-want) > 1e-6*mag+1e-30 {
						t.Fatalf("%s nb %d: y[%d][%d] = %g, want %g", name, nb, row, c, got, want)
					}
				}
			}
		}
	}
	t.Logf("AVX-512 VNNI: %v", HasQ8Gemm)
}
