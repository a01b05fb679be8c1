package cpu

import (
	"math"
	"math/rand/v2"
	"testing"
)

// TestSegmentAttentionMatchesReference: each query of a packed sequence
// attends exactly to its own sequence. The reference is the causal
// float64 AttentionRef asked for one query placed after every key of its
// sequence, which makes it see them all.
func TestSegmentAttentionMatchesReference(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	bounds := []int{0, 3, 4, 11, 20}
	const heads, d = 3, 8
	tn := bounds[len(bounds)-1]
	q, k, v := randVec(r, tn*heads*d), randVec(r, tn*heads*d), randVec(r, tn*heads*d)
	out := make([]float32, tn*heads*d)
	SegmentAttention(out, q, k, v, bounds, heads, d)
	w := heads * d
	for s := range len(bounds) - 1 {
		lo, hi := bounds[s], bounds[s+1]
		for i := lo; i < hi; i++ {
			want := AttentionRef(q[i*w:(i+1)*w], k[lo*w:hi*w], v[lo*w:hi*w], nil, 1, hi-lo-1, heads, heads, d)
			for x := range w {
				if got := out[i*w+x]; math.Abs(float64(got-want[x])) > 1e-5 {
					t.Fatalf("segment %d row %d [%d] = %v, reference %v", s, i, x, got, want[x])
				}
			}
		}
	}
}

func TestLayerNormGELUSegmentMean(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	const rows, d = 5, 13
	x, w, b := randVec(r, rows*d), randVec(r, d), randVec(r, d)
	for i := range d { // an offset large next to the spread
		x[i] += 100
	}
	y := make([]float32, rows*d)
	LayerNorm(y, x, w, b, 1e-12)
	for rr := range rows {
		var mean, v float64
		for i := range d {
			mean += float64(x[rr*d+i]) / d
		}
		for i := range d {
			v += (float64(x[rr*d+i]) - mean) * (float64(x[rr*d+i]) - mean) / d
		}
		for i := range d {
			want := (float64(x[rr*d+i])-mean)/math.Sqrt(v+1e-12)*float64(w[i]) + float64(b[i])
			if math.Abs(float64(y[rr*d+i])-want) > 1e-5 {
				t.Fatalf("layernorm [%d,%d] = %v, want %v", rr, i, y[rr*d+i], want)
			}
		}
	}
	// GELU at points whose values PyTorch prints: F.gelu(x) and
	// F.gelu(x, approximate="tanh").
	in := []float32{-3, -1, 0, 0.5, 1, 2}
	exact := []float64{-0.0040496, -0.1586553, 0, 0.3457312, 0.8413447, 1.9544998}
	approx := []float64{-0.0036374, -0.1588080, 0, 0.3457140, 0.8411920, 1.9545977}
	out := make([]float32, len(in))
	for _, c := range []struct {
		tanh bool
		want []float64
	}{{false, exact}, {true, approx}} {
		GELU(out, in, c.tanh)
		for i := range in {
			if math.Abs(float64(out[i])-c.want[i]) > 2e-6 {
				t.Errorf("gelu(%v, tanh=%v) = %v, want %v", in[i], c.tanh, out[i], c.want[i])
			}
		}
	}
	bounds := []int{0, 1, 5}
	m := make([]float32, 2*d)
	SegmentMean(m, x, bounds, d)
	for i := range d {
		want := (x[1*d+i] + x[2*d+i] + x[3*d+i] + x[4*d+i]) / 4
		if m[i] != x[i] || math.Abs(float64(m[d+i]-want)) > 1e-5 {
			t.Fatalf("segment mean column %d: %v %v, want %v %v", i, m[i], m[d+i], x[i], want)
		}
	}
}

func TestTopK(t *testing.T) {
	be := New()
	r := rand.New(rand.NewPCG(7, 8))
	const n, d = 50, 6
	idx := randVec(r, n*d)
	for i := range n { // unit rows: row 30 as the query scores best
		var s float32
		for _, v := range idx[i*d : (i+1)*d] {
			s += v * v
		}
		for x := range d {
			idx[i*d+x] /= float32(math.Sqrt(float64(s)))
		}
	}
	copy(idx[7*d:8*d], idx[30*d:31*d]) // a tie: row 7 must come before row 30
	q := append(append([]float32(nil), idx[30*d:31*d]...), randVec(r, d)...)
	rows, scores, err := be.TopK(be.FromHost(idx, n, d), be.FromHost(q, 2, d), 5)
	if err != nil {
		t.Fatal(err)
	}
	if rows[0][0] != 7 || rows[0][1] != 30 || scores[0][0] != scores[0][1] {
		t.Fatalf("tied best rows %v scores %v, want 7 then 30", rows[0][:2], scores[0][:2])
	}
	for qi := range 2 {
		for j := range 5 {
			s := float32(0)
			for x := range d {
				s += q[qi*d+x] * idx[rows[qi][j]*d+x]
			}
			if math.Abs(float64(s-scores[qi][j])) > 1e-5 || (j > 0 && scores[qi][j] > scores[qi][j-1]) {
				t.Fatalf("query %d hit %d: score %v (dot %v), scores %v", qi, j, scores[qi][j], s, scores[qi])
			}
		}
		// Nothing outside the top 5 scores higher than the 5th.
		in := map[int]bool{}
		for _, rr := range rows[qi] {
			in[rr] = true
		}
		for rr := range n {
			s := float32(0)
			for x := range d {
				s += q[qi*d+x] * idx[rr*d+x]
			}
			if !in[rr] && s > scores[qi][4]+1e-6 {
				t.Fatalf("query %d: row %d scores %v above the 5th best %v", qi, rr, s, scores[qi][4])
			}
		}
	}
	rows, _, _ = be.TopK(be.FromHost(idx[:3*d], 3, d), be.FromHost(q[:d], 1, d), 5)
	if len(rows[0]) != 3 {
		t.Fatalf("an index of 3 rows gave %d hits for k = 5", len(rows[0]))
	}
	if _, _, err := be.TopK(be.FromHost(idx, n, d), be.FromHost(q, 2, d), 65); err == nil {
		t.Fatal("k = 65 must be refused")
	}
}
