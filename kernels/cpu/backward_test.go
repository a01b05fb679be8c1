package cpu

import (
	"math"
	"math/rand/v2"
	"testing"
)

// Finite-difference checks of every backward kernel in float64. Each op's
// forward is written plainly here in float64; the loss is L = Σ r∘y for a
// fixed random r, so dL/dy = r, and every input element is perturbed by ±h.

func r64(r *rand.Rand, n int) []float64 {
	v := make([]float64, n)
	for i := range v {
		v[i] = r.NormFloat64()
	}
	return v
}

func dotLoss(r, y []float64) float64 {
	s := 0.0
	for i := range y {
		s += r[i] * y[i]
	}
	return s
}

// checkFD compares analytic with central differences of loss over x.
func checkFD(t *testing.T, name string, x []float64, analytic []float64, loss func() float64) {
	t.Helper()
	const h = 1e-6
	worst := 0.0
	for i := range x {
		orig := x[i]
		x[i] = orig + h
		up := loss()
		x[i] = orig - h
		down := loss()
		x[i] = orig
		num := (up - down) / (2 * h)
		err := math.Abs(num-analytic[i]) / math.Max(1, math.Abs(num))
		worst = math.Max(worst, err)
	}
	if worst > 1e-6 {
		t.Fatalf("%s: finite differences disagree, max relative error %.2e", name, worst)
	}
}

func TestMatMulTBackwardFD(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 1))
	const m, k, n = 3, 5, 4
	x, w, b, r := r64(rng, m*k), r64(rng, n*k), r64(rng, n), r64(rng, m*n)
	dx, dw, db := make([]float64, m*k), make([]float64, n*k), make([]float64, n)
	MatMulTBackward(dx, dw, db, r, x, w, m, k, n)
	loss := func() float64 { return dotLoss(r, MatMulTRef(x, w, b, m, k, n)) }
	checkFD(t, "matmul dx", x, dx, loss)
	checkFD(t, "matmul dw", w, dw, loss)
	checkFD(t, "matmul db", b, db, loss)
}

func TestRMSNormBackwardFD(t *testing.T) {
	rng := rand.New(rand.NewPCG(2, 2))
	const rows, d = 3, 6
	x, w, r := r64(rng, rows*d), r64(rng, d), r64(rng, rows*d)
	dx, dw := make([]float64, rows*d), make([]float64, d)
	RMSNormBackward(dx, dw, r, x, w, d, 1e-6)
	loss := func() float64 { return dotLoss(r, RMSNormRef(x, w, d, 1e-6)) }
	checkFD(t, "rmsnorm dx", x, dx, loss)
	checkFD(t, "rmsnorm dw", w, dw, loss)
}

func TestRopeBackwardFD(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 3))
	pos := []int{0, 3, 17}
	const heads, hd = 2, 8
	x, r := r64(rng, len(pos)*heads*hd), r64(rng, len(pos)*heads*hd)
	dx := append([]float64(nil), r...)
	RopeBackward(dx, pos, heads, hd, 10000)
	checkFD(t, "rope dx", x, dx, func() float64 { return dotLoss(r, RopeRef(x, pos, heads, hd, 10000)) })
}

func TestSiLUMulBackwardFD(t *testing.T) {
	rng := rand.New(rand.NewPCG(4, 4))
	g, u, r := r64(rng, 20), r64(rng, 20), r64(rng, 20)
	dg, du := make([]float64, 20), make([]float64, 20)
	SiLUMulBackward(dg, du, r, g, u)
	loss := func() float64 {
		s := 0.0
		for i := range g {
			s += r[i] * g[i] / (1 + math.Exp(-g[i])) * u[i]
		}
		return s
	}
	checkFD(t, "silu dg", g, dg, loss)
	checkFD(t, "silu du", u, du, loss)
}

func TestEmbeddingAndLogProbBackwardFD(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 5))
	const vocab, d = 7, 4
	table := r64(rng, vocab*d)
	ids := []int{3, 1, 3, 6} // a repeated id must accumulate
	r := r64(rng, len(ids)*d)
	dt := make([]float64, vocab*d)
	EmbeddingBackward(dt, r, ids, d)
	checkFD(t, "embedding", table, dt, func() float64 {
		s := 0.0
		for i, id := range ids {
			for c := range d {
				s += r[i*d+c] * table[id*d+c]
			}
		}
		return s
	})
	logits := r64(rng, 3*vocab)
	targets := []int{2, -1, 6}
	rw := r64(rng, 3)
	dl := make([]float64, 3*vocab)
	LogProbGatherBackward(dl, rw, logits, targets, vocab)
	checkFD(t, "log-prob gather", logits, dl, func() float64 { return dotLoss(rw, LogProbGather(logits, targets, vocab)) })
}

func TestAttentionBackwardFD(t *testing.T) {
	rng := rand.New(rand.NewPCG(6, 6))
	const tn, start, heads, kvh, d = 3, 2, 4, 2, 4
	total := start + tn
	for _, valid := range [][]bool{nil, {true, false, true, true, true}} {
		q, kc, vc := r64(rng, tn*heads*d), r64(rng, total*kvh*d), r64(rng, total*kvh*d)
		r := r64(rng, tn*heads*d)
		dq, dk, dv := make([]float64, len(q)), make([]float64, len(kc)), make([]float64, len(vc))
		AttentionBackward(dq, dk, dv, r, q, kc, vc, valid, tn, start, heads, kvh, d)
		loss := func() float64 { return dotLoss(r, AttentionRef(q, kc, vc, valid, tn, start, heads, kvh, d)) }
		checkFD(t, "attention dq", q, dq, loss)
		checkFD(t, "attention dk", kc, dk, loss)
		checkFD(t, "attention dv", vc, dv, loss)
	}
}

// TestBackwardFloat32MatchesFloat64 runs the float32 instantiation the
// trainer uses against the float64 one.
func TestBackwardFloat32MatchesFloat64(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 7))
	const m, k, n = 4, 33, 5
	x, w, r := r64(rng, m*k), r64(rng, n*k), r64(rng, m*n)
	dx64 := make([]float64, m*k)
	MatMulTBackward(dx64, nil, nil, r, x, w, m, k, n)
	f := func(v []float64) []float32 {
		o := make([]float32, len(v))
		for i := range v {
			o[i] = float32(v[i])
		}
		return o
	}
	dx32 := make([]float32, m*k)
	MatMulTBackward(dx32, nil, nil, f(r), f(x), f(w), m, k, n)
	for i := range dx64 {
		if math.Abs(float64(dx32[i])-dx64[i]) > 1e-4 {
			t.Fatalf("float32 dx[%d] = %g, float64 %g", i, dx32[i], dx64[i])
		}
	}
}

// TestLogProbFloat32MatchesFloat64: the float32 log-softmax (vector
// exponentials, rows in parallel, the softmax from the stored exponentials)
// against the float64 one, on rows wide enough for the vector kernel and
// its tail, with large logits and a skipped row.
func TestLogProbFloat32MatchesFloat64(t *testing.T) {
	rng := rand.New(rand.NewPCG(8, 8))
	const rows, vocab = 300, 2051
	logits := r64(rng, rows*vocab)
	for i := range logits {
		logits[i] *= 8
	}
	targets := make([]int, rows)
	dout := r64(rng, rows)
	for i := range targets {
		targets[i] = rng.IntN(vocab)
	}
	targets[7] = -1
	f := func(v []float64) []float32 {
		o := make([]float32, len(v))
		for i := range v {
			o[i] = float32(v[i])
		}
		return o
	}
	lp64, lp32 := LogProbGather(logits, targets, vocab), LogProbGather(f(logits), targets, vocab)
	for i := range lp64 {
		if math.Abs(float64(lp32[i])-lp64[i]) > 1e-4*max(1, math.Abs(lp64[i])) {
			t.Fatalf("row %d: float32 log-prob %g, float64 %g", i, lp32[i], lp64[i])
		}
	}
	d64, d32 := make([]float64, rows*vocab), make([]float32, rows*vocab)
	LogProbGatherBackward(d64, dout, logits, targets, vocab)
	LogProbGatherBackward(d32, f(dout), f(logits), targets, vocab)
	for i := range d64 {
		if math.Abs(float64(d32[i])-d64[i]) > 1e-5*max(1, math.Abs(d64[i])) {
			t.Fatalf("dlogits[%d] (row %d): float32 %g, float64 %g", i, i/vocab, d32[i], d64[i])
		}
	}
}

// TestAttentionBackwardMatMul checks the matmul form against the plain
// float64 kernel, with a cache offset and grouped heads.
// The last two cases span several blocks of attnBlock query rows.
func TestAttentionBackwardMatMul(t *testing.T) {
	rng := rand.New(rand.NewPCG(8, 8))
	for _, c := range []struct{ tn, start, heads, kvh, d int }{{5, 0, 4, 2, 8}, {7, 9, 6, 2, 16}, {1, 3, 2, 1, 4}, {40, 33, 4, 4, 24}, {150, 0, 4, 2, 8}, {130, 21, 2, 1, 8}} {
		total := c.start + c.tn
		q, kc, vc := r64(rng, c.tn*c.heads*c.d), r64(rng, total*c.kvh*c.d), r64(rng, total*c.kvh*c.d)
		r := r64(rng, c.tn*c.heads*c.d)
		dq, dk, dv := make([]float64, len(q)), make([]float64, len(kc)), make([]float64, len(vc))
		AttentionBackward(dq, dk, dv, r, q, kc, vc, nil, c.tn, c.start, c.heads, c.kvh, c.d)
		f := func(v []float64) []float32 {
			o := make([]float32, len(v))
			for i := range v {
				o[i] = float32(v[i])
			}
			return o
		}
		dq32, dk32, dv32 := make([]float32, len(q)), make([]float32, len(kc)), make([]float32, len(vc))
		AttentionBackwardMatMul(dq32, dk32, dv32, f(r), f(q), f(kc), f(vc), c.tn, c.start, c.heads, c.kvh, c.d)
		for name, pair := range map[string][2]any{"dq": {dq32, dq}, "dk": {dk32, dk}, "dv": {dv32, dv}} {
			got, want := pair[0].([]float32), pair[1].([]float64)
			for i := range want {
				if math.Abs(float64(got[i])-want[i]) > 1e-4*math.Max(1, math.Abs(want[i])) {
					t.Fatalf("%+v %s[%d]: matmul form %g, plain %g", c, name, i, got[i], want[i])
				}
			}
		}
	}
}

func TestAttentionMatMulMatchesAttention(t *testing.T) {
	rng := rand.New(rand.NewPCG(9, 9))
	f := func(n int) []float32 {
		o := make([]float32, n)
		for i := range o {
			o[i] = float32(rng.NormFloat64())
		}
		return o
	}
	// The last two span several blocks of attnBlock query rows.
	for _, c := range []struct{ tn, start, heads, kvh, d int }{{13, 6, 4, 2, 8}, {150, 0, 4, 2, 8}, {140, 37, 2, 1, 16}} {
		total := c.start + c.tn
		q, kc, vc := f(c.tn*c.heads*c.d), f(total*c.kvh*c.d), f(total*c.kvh*c.d)
		want, got := make([]float32, len(q)), make([]float32, len(q))
		Attention(want, q, kc, vc, nil, c.tn, c.start, c.heads, c.kvh, c.d)
		AttentionMatMul(got, q, kc, vc, c.tn, c.start, c.heads, c.kvh, c.d)
		for i := range want {
			if math.Abs(float64(got[i]-want[i])) > 1e-5 {
				t.Fatalf("%+v out[%d]: matmul form %g, kernel %g", c, i, got[i], want[i])
			}
		}
	}
}

func TestMatMulNNAdd(t *testing.T) {
	rng := rand.New(rand.NewPCG(10, 10))
	for _, c := range [][3]int{{4, 24, 16}, {7, 24, 37}, {1, 300, 5}, {33, 513, 70}} {
		m, k, n := c[0], c[1], c[2]
		x, b := r64(rng, m*k), r64(rng, k*n)
		bT := make([]float64, n*k)
		for p := range k {
			for j := range n {
				bT[j*k+p] = b[p*n+j]
			}
		}
		want := MatMulTRef(x, bT, nil, m, k, n)
		f := func(v []float64) []float32 {
			o := make([]float32, len(v))
			for i := range v {
				o[i] = float32(v[i])
			}
			return o
		}
		y := make([]float32, m*n)
		for i := range y {
			y[i] = 1
		}
		MatMulNNAdd(y, f(x), f(b), m, k, n)
		for i := range want {
			if math.Abs(float64(y[i])-1-want[i]) > 1e-3*math.Max(1, math.Abs(want[i])) {
				t.Fatalf("%v: y[%d] = %g, want %g", c, i, y[i]-1, want[i])
			}
		}
	}
}

// The float32 SwiGLU (vector exponential, parallel chunks) against the
// float64 reference, forward and backward, across chunk edges and at
// magnitudes where a naive exp(−g) overflows.
func TestSiLUMulFloat32MatchesFloat64(t *testing.T) {
	rng := rand.New(rand.NewPCG(6, 6))
	for _, n := range []int{1, 7, 511, 513, 40000} {
		g, u, dy := make([]float32, n), make([]float32, n), make([]float32, n)
		for i := range g {
			g[i] = float32(rng.NormFloat64() * 4)
			u[i], dy[i] = float32(rng.NormFloat64()), float32(rng.NormFloat64())
		}
		g[0] = -200 // exp(200) overflows float32
		if n > 1 {
			g[1] = 150
		}
		g64, u64, dy64 := to64(g), to64(u), to64(dy)
		out := make([]float32, n)
		SiLUMul(out, g, u)
		want := SiLUMulRef(g64, u64)
		dg, du := make([]float32, n), make([]float32, n)
		dg[0], du[0] = 1, -1 // gradients accumulate
		SiLUMulBackward(dg, du, dy, g, u)
		wdg, wdu := make([]float64, n), make([]float64, n)
		wdg[0], wdu[0] = 1, -1
		SiLUMulBackward(wdg, wdu, dy64, g64, u64)
		for i := range n {
			for _, c := range []struct {
				name string
				got  float32
				want float64
			}{{"silu", out[i], want[i]}, {"dg", dg[i], wdg[i]}, {"du", du[i], wdu[i]}} {
				if math.IsNaN(float64(c.got)) || math.Abs(float64(c.got)-c.want) > 2e-6*math.Max(1, math.Abs(c.want)) {
					t.Fatalf("n=%d %s[%d] (g %g) = %g, want %g", n, c.name, i, g[i], c.got, c.want)
				}
			}
		}
	}
}

func to64(x []float32) []float64 {
	y := make([]float64, len(x))
	for i, v := range x {
		y[i] = float64(v)
	}
	return y
}
