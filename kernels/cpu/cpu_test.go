package cpu

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/agemem/agemem/kernels"
	"github.com/agemem/agemem/kernels/half"
)

func randVec(r *rand.Rand, n int) []float32 {
	v := make([]float32, n)
	for i := range v {
		v[i] = float32(r.NormFloat64())
	}
	return v
}

// TestAttentionMatchesReference checks causal GQA attention with a padding
// mask against a float64 loop written from the definition.
func TestAttentionMatchesReference(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 1))
	const tNew, start, heads, kvHeads, d = 3, 4, 4, 2, 8
	total := start + tNew
	q := randVec(r, tNew*heads*d)
	kc := randVec(r, total*kvHeads*d)
	vc := randVec(r, total*kvHeads*d)
	valid := []bool{false, true, true, false, true, true, true} // two padded cache slots
	out := make([]float32, tNew*heads*d)
	Attention(out, q, kc, vc, valid, tNew, start, heads, kvHeads, d)
	for i := range tNew {
		for h := range heads {
			kvh := h / (heads / kvHeads)
			var sc []float64
			var idx []int
			for j := 0; j <= start+i; j++ {
				if !valid[j] {
					continue
				}
				s := 0.0
				for x := range d {
					s += float64(q[(i*heads+h)*d+x]) * float64(kc[(j*kvHeads+kvh)*d+x])
				}
				sc = append(sc, s/math.Sqrt(d))
				idx = append(idx, j)
			}
			mx := math.Inf(-1)
			for _, s := range sc {
				mx = math.Max(mx, s)
			}
			z := 0.0
			for k := range sc {
				sc[k] = math.Exp(sc[k] - mx)
				z += sc[k]
			}
			for x := range d {
				want := 0.0
				for k, j := range idx {
					want += sc[k] / z * float64(vc[(j*kvHeads+kvh)*d+x])
				}
				if got := out[(i*heads+h)*d+x]; math.Abs(float64(got)-want) > 1e-5 {
					t.Fatalf("t%d h%d x%d: %g want %g", i, h, x, got, want)
				}
			}
		}
	}
	// A query whose every key is masked yields zeros, not NaN.
	Attention(out[:heads*d], q[:heads*d], kc, vc, []bool{false, false, false, false, false}, 1, 0, heads, kvHeads, d)
	for _, v := range out[:heads*d] {
		if v != 0 {
			t.Fatalf("fully masked query gave %g", v)
		}
	}
}

func TestLogSoftmaxAndRope(t *testing.T) {
	x := []float32{1000, 1001, 999} // large: must not overflow
	y := make([]float32, 3)
	LogSoftmax(y, x)
	s := 0.0
	for _, v := range y {
		s += math.Exp(float64(v))
	}
	if math.Abs(s-1) > 1e-6 || math.IsNaN(float64(y[0])) {
		t.Fatalf("log-softmax: %v (sum of exp %g)", y, s)
	}
	// Rotation keeps each pair's norm and composes: pos 2 = pos 1 twice.
	cos, sin := RopeTables(4, 8, 10000)
	r := rand.New(rand.NewPCG(2, 2))
	a := randVec(r, 8)
	b := append([]float32(nil), a...)
	Rope(a, []int{2}, 1, 8, cos, sin)
	Rope(b, []int{1}, 1, 8, cos, sin)
	Rope(b, []int{1}, 1, 8, cos, sin)
	for i := range a {
		if math.Abs(float64(a[i]-b[i])) > 1e-5 {
			t.Fatalf("rope(2) != rope(1)∘rope(1): %v vs %v", a, b)
		}
	}
}

func TestMatMulTAndRMSNorm(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 3))
	const m, k, n = 5, 37, 300 // n*m*k large enough for the parallel path
	x, w, b := randVec(r, m*k), randVec(r, n*k), randVec(r, n)
	y := make([]float32, m*n)
	MatMulT(y, x, w, b, m, k, n)
	for i := range m {
		for j := range n {
			want := float64(b[j])
			for c := range k {
				want += float64(x[i*k+c]) * float64(w[j*k+c])
			}
			if math.Abs(float64(y[i*n+j])-want) > 1e-4 {
				t.Fatalf("y[%d,%d] = %g want %g", i, j, y[i*n+j], want)
			}
		}
	}
	g := []float32{1, 2, 0.5, 1}
	out := make([]float32, 4)
	RMSNorm(out, []float32{1, 2, 3, 4}, g, 4, 0)
	rms := math.Sqrt((1 + 4 + 9 + 16) / 4.0)
	for i, v := range []float64{1, 2, 3, 4} {
		if want := v / rms * float64(g[i]); math.Abs(float64(out[i])-want) > 1e-6 {
			t.Fatalf("rmsnorm[%d] = %g want %g", i, out[i], want)
		}
	}
}

// TestMatMul16 checks every path of bf16 and f16 weights (decode rows,
// prefill tiles of widened weights, and f16's AVX-512 tiles where k is a
// multiple of 16) against float64 on the widened weights, with ragged
// edges: m not a multiple of 4 and a last group of fewer than 4 weight rows.
func TestMatMul16(t *testing.T) {
	r := rand.New(rand.NewPCG(4, 4))
	for _, f16 := range []bool{false, true} {
		for _, k := range []int{1030, 1024} {
			for _, m := range []int{1, 3, 5, 33} {
				const n = 37
				x := randVec(r, m*k)
				w := Matrix{Rows: n, Cols: k}
				bits := make([]uint16, n*k)
				for i := range bits {
					v := float32(r.NormFloat64())
					if f16 {
						bits[i] = half.F32ToF16(v)
					} else {
						bits[i] = half.F32ToBF16(v)
					}
				}
				if f16 {
					w.F16 = bits
				} else {
					w.BF16 = bits
				}
				b := randVec(r, n)
				y := make([]float32, m*n)
				MatMul(y, x, w, b, m)
				row := make([]float32, k)
				for j := range n {
					w.RowTo(row, j)
					for i := range m {
						want := float64(b[j])
						for c := range k {
							want += float64(x[i*k+c]) * float64(row[c])
						}
						if math.Abs(float64(y[i*n+j])-want) > 1e-3 {
							t.Fatalf("f16 %v k %d m %d: y[%d,%d] = %g want %g", f16, k, m, i, j, y[i*n+j], want)
						}
					}
				}
			}
		}
	}
}

// TestMatMulRowsDoNotDependOnTheBatch: a row's product is bit for bit the
// same whatever rows share its batch, so a sequence decoded alone or beside
// others (continuous batching forms batches as requests arrive) follows
// the same tokens, and a seeded run is reproducible.
func TestMatMulRowsDoNotDependOnTheBatch(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 3))
	for _, shape := range [][2]int{{37, 21}, {1030, 9}, {64, 40}} {
		k, n := shape[0], shape[1]
		w := make([]float32, n*k)
		for i := range w {
			w[i] = float32(r.NormFloat64())
		}
		for _, m := range []int{1, 2, 3, 5, 17} {
			x := make([]float32, m*k)
			for i := range x {
				x[i] = float32(r.NormFloat64())
			}
			all := make([]float32, m*n)
			MatMulT(all, x, w, nil, m, k, n)
			for i := range m {
				one := make([]float32, n)
				MatMulT(one, x[i*k:(i+1)*k], w, nil, 1, k, n)
				for j := range n {
					if one[j] != all[i*n+j] {
						t.Fatalf("k %d, n %d: row %d of %d: %v alone, %v in the batch", k, n, i, m, one[j], all[i*n+j])
					}
				}
			}
		}
	}
}

// TestMatMulBF16Activations: with Backend.BF16 a GEMM on bf16 weights is
// x rounded to bf16 times the weights (float64 sums of the same products)
// on every path (VDPBF16PS tiles from 4 rows where the CPU has them and k
// is a multiple of 32, the float32 kernels otherwise), for shapes that
// leave partial row and output groups and an odd k, with a bias; with
// BF16 off x stays float32.
func TestMatMulBF16Activations(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	for _, s := range []struct{ m, k, n int }{{4, 64, 32}, {7, 33, 45}, {13, 96, 45}, {6, 64, 47}, {3, 64, 32}} {
		x, wf, bias := make([]float32, s.m*s.k), make([]float32, s.n*s.k), make([]float32, s.n)
		for i := range x {
			x[i] = float32(r.NormFloat64())
		}
		bits := make([]uint16, len(wf))
		for i := range wf {
			bits[i] = half.F32ToBF16(float32(r.NormFloat64()))
			wf[i] = half.BF16ToF32(bits[i])
		}
		for i := range bias {
			bias[i] = float32(r.NormFloat64())
		}
		want := func(round bool) []float64 {
			out := make([]float64, s.m*s.n)
			for i := range s.m {
				for j := range s.n {
					acc := float64(bias[j])
					for p := range s.k {
						xv := x[i*s.k+p]
						if round {
							xv = half.BF16ToF32(half.F32ToBF16(xv))
						}
						acc += float64(xv) * float64(wf[j*s.k+p])
					}
					out[i*s.n+j] = acc
				}
			}
			return out
		}
		for _, on := range []bool{false, true} {
			b := &Backend{BF16: on}
			y := b.Zeros(s.m, s.n)
			b.MatMul(y, b.FromHost(x, s.m, s.k), b.Upload(kernels.Weight{Rows: s.n, Cols: s.k, BF16: bits}), b.FromHost(bias, s.n))
			ref, other := want(on), want(!on)
			var far, farOther float64
			for i, v := range b.ToHost(y) {
				far = max(far, math.Abs(float64(v)-ref[i]))
				farOther = max(farOther, math.Abs(float64(v)-other[i]))
			}
			if far > 1e-4 {
				t.Fatalf("%+v BF16 %v: off the reference by %g", s, on, far)
			}
			if farOther < 10*far {
				t.Fatalf("%+v BF16 %v: %g from the reference, %g from the other rounding: the case does not tell them apart", s, on, far, farOther)
			}
		}
	}
}
