package tape

import (
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"testing"
)

func randVals(r *rand.Rand, n int) []float64 {
	v := make([]float64, n)
	for i := range v {
		v[i] = r.NormFloat64()
	}
	return v
}

// graph builds an op's output from parameter variables on a fresh tape.
type graph func(tp *Tape[float64], ps []*Var[float64]) *Var[float64]

// checkOp compares the tape's gradients of L = Σ r∘y with central finite
// differences, for every element of every parameter.
func checkOp(t *testing.T, name string, ps []*Var[float64], build graph) {
	t.Helper()
	rng := rand.New(rand.NewPCG(99, 1))
	tp := New[float64]()
	y := build(tp, ps)
	r := randVals(rng, len(y.Val))
	for _, p := range ps {
		clear(p.Grad)
	}
	tp.Backward(y, r)
	loss := func() float64 {
		y := build(New[float64](), ps)
		s := 0.0
		for i, v := range y.Val {
			s += r[i] * v
		}
		return s
	}
	const h = 1e-6
	for pi, p := range ps {
		if !p.Requires {
			continue
		}
		worst := 0.0
		for i := range p.Val {
			orig := p.Val[i]
			p.Val[i] = orig + h
			up := loss()
			p.Val[i] = orig - h
			down := loss()
			p.Val[i] = orig
			num := (up - down) / (2 * h)
			worst = math.Max(worst, math.Abs(num-p.Grad[i])/math.Max(1, math.Abs(num)))
		}
		if worst > 1e-6 {
			t.Errorf("%s: input %d: finite differences disagree, max relative error %.2e", name, pi, worst)
		}
	}
}

func params(r *rand.Rand, shapes ...[2]int) []*Var[float64] {
	var ps []*Var[float64]
	for _, s := range shapes {
		ps = append(ps, Param(randVals(r, s[0]*s[1]), s[0], s[1], true))
	}
	return ps
}

func TestOpsFiniteDifferences(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	segs := []Segment{{0, 3, 0}, {3, 5, 3}, {5, 9, 3}, {9, 11, 0}}
	pos := []int{0, 1, 2, 3, 4, 3, 4, 5, 6, 0, 1}
	cases := []struct {
		name   string
		shapes [][2]int
		build  graph
	}{
		{"linear with bias", [][2]int{{3, 5}, {4, 5}, {1, 4}}, func(tp *Tape[float64], p []*Var[float64]) *Var[float64] { return tp.Linear(p[0], p[1], p[2]) }},
		{"linear, x used twice", [][2]int{{3, 5}, {5, 5}}, func(tp *Tape[float64], p []*Var[float64]) *Var[float64] {
			return tp.Add(tp.Linear(p[0], p[1], nil), p[0])
		}},
		{"rmsnorm", [][2]int{{3, 6}, {1, 6}}, func(tp *Tape[float64], p []*Var[float64]) *Var[float64] { return tp.RMSNorm(p[0], p[1], 1e-6) }},
		{"rmsnorm per head (Qwen3 q/k norm)", [][2]int{{3, 8}, {1, 4}}, func(tp *Tape[float64], p []*Var[float64]) *Var[float64] { return tp.RMSNorm(p[0], p[1], 1e-6) }},
		{"rope", [][2]int{{3, 16}}, func(tp *Tape[float64], p []*Var[float64]) *Var[float64] {
			return tp.Rope(p[0], []int{0, 5, 9}, 2, 8, 10000)
		}},
		{"swiglu", [][2]int{{3, 7}, {3, 7}}, func(tp *Tape[float64], p []*Var[float64]) *Var[float64] { return tp.SiLUMul(p[0], p[1]) }},
		{"embedding with a repeated id", [][2]int{{6, 4}}, func(tp *Tape[float64], p []*Var[float64]) *Var[float64] { return tp.Embedding(p[0], []int{2, 5, 2}) }},
		{"gather", [][2]int{{5, 3}}, func(tp *Tape[float64], p []*Var[float64]) *Var[float64] { return tp.Gather(p[0], []int{4, 0, 4}) }},
		{"scale and dropout", [][2]int{{4, 5}}, func(tp *Tape[float64], p []*Var[float64]) *Var[float64] {
			return tp.Dropout(tp.Scale(p[0], 0.7), 0.3, 11)
		}},
		{"log-probs with a skipped row", [][2]int{{3, 9}}, func(tp *Tape[float64], p []*Var[float64]) *Var[float64] { return tp.LogProbs(p[0], []int{4, -1, 8}) }},
		{"GQA attention over packed segments with a shared prefix", [][2]int{{11, 4 * 4}, {11, 2 * 4}, {11, 2 * 4}}, func(tp *Tape[float64], p []*Var[float64]) *Var[float64] {
			return tp.Attention(tp.Rope(p[0], pos, 4, 4, 100), tp.Rope(p[1], pos, 2, 4, 100), p[2], segs, 4, 2, 4)
		}},
		{"layernorm", [][2]int{{3, 6}, {1, 6}, {1, 6}}, func(tp *Tape[float64], p []*Var[float64]) *Var[float64] { return tp.LayerNorm(p[0], p[1], p[2], 1e-5) }},
		{"gelu (erf)", [][2]int{{3, 5}}, func(tp *Tape[float64], p []*Var[float64]) *Var[float64] { return tp.GELU(p[0], false) }},
		{"gelu (tanh)", [][2]int{{3, 5}}, func(tp *Tape[float64], p []*Var[float64]) *Var[float64] { return tp.GELU(p[0], true) }},
		{"tanh", [][2]int{{3, 5}}, func(tp *Tape[float64], p []*Var[float64]) *Var[float64] { return tp.Tanh(p[0]) }},
		{"bidirectional attention over packed segments", [][2]int{{7, 2 * 3}, {7, 2 * 3}, {7, 2 * 3}}, func(tp *Tape[float64], p []*Var[float64]) *Var[float64] {
			return tp.BiAttention(p[0], p[1], p[2], []Segment{{0, 3, 0}, {3, 4, 0}, {4, 7, 0}}, 2, 3, 0, 0)
		}},
		{"bidirectional attention with dropout on the probabilities", [][2]int{{7, 2 * 3}, {7, 2 * 3}, {7, 2 * 3}}, func(tp *Tape[float64], p []*Var[float64]) *Var[float64] {
			return tp.BiAttention(p[0], p[1], p[2], []Segment{{0, 3, 0}, {3, 4, 0}, {4, 7, 0}}, 2, 3, 0.3, 9)
		}},
		{"mean pool and l2 normalise", [][2]int{{7, 4}}, func(tp *Tape[float64], p []*Var[float64]) *Var[float64] {
			return tp.L2Normalize(tp.MeanPool(p[0], []Segment{{0, 3, 0}, {3, 4, 0}, {4, 7, 0}}))
		}},
		{"InfoNCE: normalised similarities, scaled, log-softmax", [][2]int{{3, 4}, {3, 4}}, func(tp *Tape[float64], p []*Var[float64]) *Var[float64] {
			return tp.LogProbs(tp.Scale(tp.Linear(tp.L2Normalize(p[0]), tp.L2Normalize(p[1]), nil), 20), []int{0, 1, 2})
		}},
		{"recomputed block", [][2]int{{3, 5}, {5, 5}, {1, 5}}, func(tp *Tape[float64], p []*Var[float64]) *Var[float64] {
			return tp.Recompute(p[0], func(s *Tape[float64], x *Var[float64]) *Var[float64] {
				return s.Add(x, s.SiLUMul(s.Linear(s.RMSNorm(x, p[2], 1e-6), p[1], nil), x))
			})
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			checkOp(t, c.name, params(r, c.shapes...), c.build)
		})
	}
}

// TestSegmentsMatchWholeSequences: a batch packing a shared prefix and two
// continuations gives each continuation the outputs and gradients it gets
// when run whole, prefix included.
func TestSegmentsMatchWholeSequences(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	const heads, kvh, hd, P = 2, 1, 4, 3
	pre := randVals(r, P*heads*hd)
	preK := randVals(r, P*kvh*hd)
	sfx := [][]float64{randVals(r, 2*heads*hd), randVals(r, 3*heads*hd)}
	sfxK := [][]float64{randVals(r, 2*kvh*hd), randVals(r, 3*kvh*hd)}
	cat := func(a ...[]float64) []float64 {
		var o []float64
		for _, x := range a {
			o = append(o, x...)
		}
		return o
	}
	// Packed: [prefix | s0 | s1].
	tp := New[float64]()
	q := Param(cat(pre, sfx[0], sfx[1]), P+5, heads*hd, true)
	kv := Param(cat(preK, sfxK[0], sfxK[1]), P+5, kvh*hd, true)
	y := tp.Attention(q, kv, kv, []Segment{{0, P, 0}, {P, P + 2, P}, {P + 2, P + 5, P}}, heads, kvh, hd)
	packed := append([]float64(nil), y.Val...)
	tp.Backward(y, ones(len(y.Val)))
	// Whole: each suffix with its own copy of the prefix; the prefix's
	// gradient is the sum over both, less the prefix's own rows counted
	// twice.
	var wantQ = make([]float64, len(q.Val))
	for s := range 2 {
		n := P + len(sfx[s])/(heads*hd)
		tw := New[float64]()
		qw := Param(cat(pre, sfx[s]), n, heads*hd, true)
		kw := Param(cat(preK, sfxK[s]), n, kvh*hd, true)
		yw := tw.Attention(qw, kw, kw, []Segment{{0, n, 0}}, heads, kvh, hd)
		lo := []int{P, P + 2}[s]
		for i := P * heads * hd; i < len(yw.Val); i++ {
			if d := math.Abs(yw.Val[i] - packed[lo*heads*hd+i-P*heads*hd]); d > 1e-12 {
				t.Fatalf("suffix %d output %d differs by %g", s, i, d)
			}
		}
		g := ones(len(yw.Val))
		if s == 1 {
			clear(g[:P*heads*hd]) // count the prefix's own outputs once
		}
		tw.Backward(yw, g)
		for i := range P * heads * hd {
			wantQ[i] += qw.Grad[i]
		}
		copy(wantQ[lo*heads*hd:], qw.Grad[P*heads*hd:])
	}
	for i := range wantQ {
		if math.Abs(wantQ[i]-q.Grad[i]) > 1e-10 {
			t.Fatalf("dq[%d] = %g packed, %g whole", i, q.Grad[i], wantQ[i])
		}
	}
}

func ones(n int) []float64 {
	o := make([]float64, n)
	for i := range o {
		o[i] = 1
	}
	return o
}

// TestFloat32MatchesFloat64 runs each op's fast float32 kernels against the
// float64 reference ones, forward and backward.
func TestFloat32MatchesFloat64(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	const rows, k, n = 37, 48, 33
	x, w, b := randVals(r, rows*k), randVals(r, n*k), randVals(r, n)
	nw := randVals(r, 8)
	pos := make([]int, rows)
	for i := range pos {
		pos[i] = i % 13
	}
	segs := []Segment{{0, 20, 0}, {20, 30, 20}, {30, 37, 20}}
	run64 := func() ([]float64, [][]float64) {
		tp := New[float64]()
		px, pw, pb, pn := Param(append([]float64(nil), x...), rows, k, true), Param(append([]float64(nil), w...), n, k, true), Param(append([]float64(nil), b...), 1, n, true), Param(append([]float64(nil), nw...), 1, 8, true)
		y := build(tp, px, pw, pb, pn, pos, segs)
		out := append([]float64(nil), y.Val...)
		tp.Backward(y, ones(len(y.Val)))
		return out, [][]float64{px.Grad, pw.Grad, pb.Grad, pn.Grad}
	}
	run32 := func() ([]float32, [][]float32) {
		tp := New[float32]()
		px, pw, pb, pn := Param(to32(x), rows, k, true), Param(to32(w), n, k, true), Param(to32(b), 1, n, true), Param(to32(nw), 1, 8, true)
		y := build(tp, px, pw, pb, pn, pos, segs)
		out := append([]float32(nil), y.Val...)
		tp.Backward(y, make32(len(y.Val)))
		return out, [][]float32{px.Grad, pw.Grad, pb.Grad, pn.Grad}
	}
	y64, g64 := run64()
	y32, g32 := run32()
	compare(t, "output", y32, y64)
	for i := range g64 {
		compare(t, fmt.Sprintf("gradient %d", i), g32[i], g64[i])
	}
}

// build is a small block touching every op that has a fast float32 kernel.
func build[T Float](tp *Tape[T], x, w, b, nw *Var[T], pos []int, segs []Segment) *Var[T] {
	z := tp.SiLUMul(tp.Linear(x, w, b), tp.Linear(tp.RMSNorm(x, nw, 1e-6), w, nil)) // [37, 33]
	q := tp.Rope(tp.Linear(z, fixed[T](32, 33, 1), nil), pos, 4, 8, 1e4)
	k := tp.Rope(tp.Linear(z, fixed[T](16, 33, 2), nil), pos, 2, 8, 1e4)
	v := tp.Linear(z, fixed[T](16, 33, 3), nil)
	a := tp.Attention(q, k, v, segs, 4, 2, 8)
	targets := make([]int, a.Rows)
	for i := range targets {
		targets[i] = (i * 7) % a.Cols
	}
	return tp.LogProbs(a, targets)
}

// fixed is a constant [r, c] projection with seeded values.
func fixed[T Float](r, c int, seed uint64) *Var[T] {
	g := rand.New(rand.NewPCG(seed, 0))
	v := make([]T, r*c)
	for i := range v {
		v[i] = T(g.NormFloat64() / 4)
	}
	return Const(v, r, c)
}

func to32(v []float64) []float32 {
	o := make([]float32, len(v))
	for i, x := range v {
		o[i] = float32(x)
	}
	return o
}

func make32(n int) []float32 {
	o := make([]float32, n)
	for i := range o {
		o[i] = 1
	}
	return o
}

func compare(t *testing.T, what string, got []float32, want []float64) {
	t.Helper()
	scale := 0.0
	for _, v := range want {
		scale = math.Max(scale, math.Abs(v))
	}
	for i := range want {
		if d := math.Abs(float64(got[i]) - want[i]); d > 2e-5*math.Max(1, scale) {
			t.Fatalf("%s[%d]: float32 %g, float64 %g", what, i, got[i], want[i])
		}
	}
}

// TestRecomputeSavesMemory: a stack of recomputed blocks gives the same
// gradients as the plain stack and holds fewer activation bytes at peak.
func TestRecomputeSavesMemory(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 8))
	const rows, d, layers = 16, 24, 6
	x0 := randVals(r, rows*d)
	ws := make([][]float64, layers)
	for i := range ws {
		ws[i] = randVals(r, d*d)
	}
	run := func(recompute bool) ([]float64, int64) {
		tp := New[float64]()
		var ps []*Var[float64]
		for _, w := range ws {
			ps = append(ps, Param(append([]float64(nil), w...), d, d, true))
		}
		x := Param(append([]float64(nil), x0...), rows, d, true)
		h := x
		for _, p := range ps {
			block := func(s *Tape[float64], x *Var[float64]) *Var[float64] {
				return s.Add(x, s.SiLUMul(s.Linear(x, p, nil), s.Linear(x, p, nil)))
			}
			if recompute {
				h = tp.Recompute(h, block)
			} else {
				h = block(tp, h)
			}
		}
		tp.Backward(h, ones(len(h.Val)))
		var g []float64
		for _, p := range ps {
			g = append(g, p.Grad...)
		}
		return append(g, x.Grad...), tp.Mem().Peak
	}
	gPlain, peakPlain := run(false)
	gRe, peakRe := run(true)
	for i := range gPlain {
		if math.Abs(gPlain[i]-gRe[i]) > 1e-9*math.Max(1, math.Abs(gPlain[i])) {
			t.Fatalf("gradient %d: %g plain, %g recomputed", i, gPlain[i], gRe[i])
		}
	}
	if peakRe*2 > peakPlain {
		t.Fatalf("recomputation peak %d bytes, plain %d: expected at most half", peakRe, peakPlain)
	}
	t.Logf("peak activation bytes: plain %d, recomputed %d", peakPlain, peakRe)
}

func TestBadShapesPanicWithTheOpName(t *testing.T) {
	defer func() {
		if r := recover(); r == nil || !strings.Contains(fmt.Sprint(r), "linear") {
			t.Fatalf("recovered %v, want a linear shape error", r)
		}
	}()
	tp := New[float64]()
	tp.Linear(Const(make([]float64, 6), 2, 3), Const(make([]float64, 8), 2, 4), nil)
}
