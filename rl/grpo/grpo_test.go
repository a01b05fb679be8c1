package grpo

import (
	"math"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/agemem/agemem/internal/testkit"
)

func TestGroupAdvantagesByHand(t *testing.T) {
	// Group 1: rewards 1,0,0,1: mean 0.5, unbiased variance (4·0.25)/3 = 1/3,
	// std 0.5773502692, so A = ±0.5/0.5773502692 = ±0.8660254038.
	// Group 2: all equal, zero variance: zeros, not NaN.
	adv, err := GroupAdvantages([]float64{1, 0, 0, 1, 2, 2, 2, 2}, 4, 0, ScaleGroup)
	if err != nil {
		t.Fatal(err)
	}
	want := []float64{0.8660254038, -0.8660254038, -0.8660254038, 0.8660254038, 0, 0, 0, 0}
	for i := range want {
		if math.Abs(adv[i]-want[i]) > 1e-9 {
			t.Fatalf("A[%d] = %g, want %g", i, adv[i], want[i])
		}
	}
	// ε in the denominator: rewards 0 and 2, std √2, A = ±1/(√2 + 0.5).
	adv, _ = GroupAdvantages([]float64{0, 2}, 2, 0.5, ScaleGroup)
	testkit.Near(t, "A with eps", adv[1], 1/(math.Sqrt2+0.5), 1e-9)
	// Groups of one carry no preference.
	adv, _ = GroupAdvantages([]float64{3, -1}, 1, 1e-6, ScaleGroup)
	if adv[0] != 0 || adv[1] != 0 {
		t.Fatalf("groups of one: %v", adv)
	}
	if _, err := GroupAdvantages([]float64{1, 2, 3}, 2, 0, ScaleGroup); err == nil || !strings.Contains(err.Error(), "groups of 2") {
		t.Fatalf("ragged groups: %v", err)
	}
	if _, err := GroupAdvantages([]float64{1, 2}, 2, 0, "std"); err == nil || !strings.Contains(err.Error(), `"std"`) {
		t.Fatalf("an unknown scaling: %v", err)
	}
	// Groups 1, 1.01 (the same answer, contexts a few tokens apart) and
	// 0, 1 (one right, one wrong). By group both become ±0.7071 (each
	// std/√2 away from its mean, std = spread/√2). By batch: rewards
	// 1, 1.01, 0, 1 have mean 0.7525 and unbiased variance
	// (0.06125625+0.06630625+0.56625625+0.06125625)/3 = 0.251691667, std
	// 0.501688815: A = ±0.005/0.501688815 = ±0.0099663374 and
	// ±0.5/0.501688815 = ±0.9966337408. None: ±0.005 and ±0.5.
	r := []float64{1, 1.01, 0, 1}
	for _, c := range []struct {
		scale string
		want  []float64
	}{
		{ScaleGroup, []float64{-0.7071067812, 0.7071067812, -0.7071067812, 0.7071067812}},
		{ScaleBatch, []float64{-0.0099663374, 0.0099663374, -0.9966337408, 0.9966337408}},
		{ScaleNone, []float64{-0.005, 0.005, -0.5, 0.5}},
	} {
		adv, err := GroupAdvantages(r, 2, 0, c.scale)
		if err != nil {
			t.Fatal(err)
		}
		for i := range r {
			testkit.Near(t, c.scale, adv[i], c.want[i], 1e-8)
		}
	}
}

func TestVariedByHand(t *testing.T) {
	// Groups of 3: all right, one wrong, all wrong, a 1e-12 wobble, one
	// partial answer.
	got, err := Varied([]float64{1, 1, 1, 1, 0, 1, 0, 0, 0, 0.5, 0.5 + 1e-12, 0.5, 0, 0.5, 0}, 3)
	if err != nil {
		t.Fatal(err)
	}
	want := []bool{false, true, false, false, true}
	for g := range want {
		if got[g] != want[g] {
			t.Fatalf("group %d varied = %v, want %v (all: %v)", g, got[g], want[g], got)
		}
	}
	if _, err := Varied([]float64{1, 2, 3}, 2); err == nil || !strings.Contains(err.Error(), "groups of 2") {
		t.Fatalf("ragged groups: %v", err)
	}
}

func TestBroadcast(t *testing.T) {
	got := Broadcast([]float64{0.5, -0.25}, []int{0, 0, 1, 0, 1})
	want := []float64{0.5, 0.5, -0.25, 0.5, -0.25}
	for i := range want {
		testkit.Near(t, "broadcast", got[i], want[i], 1e-9)
	}
}

func TestClippedSurrogateByHand(t *testing.T) {
	ln := math.Log
	for _, c := range []struct {
		name           string
		logp, old, adv float64
		loss, grad     float64
		clipped        bool
	}{
		// ρ = 1: loss −A, gradient −A·ρ.
		{"on-policy, A>0", 0, 0, 2, -2, -2, false},
		// ρ = 1.5, A = 1: min(1.5, 1.2) = 1.2 is the clipped term: no gradient.
		{"ratio above 1+ε, A>0", ln(1.5), 0, 1, -1.2, 0, true},
		// ρ = 1.5, A = −1: min(−1.5, −1.2) = −1.5, unclipped: loss 1.5, grad 1.5.
		{"ratio above 1+ε, A<0", ln(1.5), 0, -1, 1.5, 1.5, false},
		// ρ = 0.5, A = −1: min(−0.5, −0.8) = −0.8 clipped.
		{"ratio below 1−ε, A<0", ln(0.5), 0, -1, 0.8, 0, true},
		// ρ = 0.5, A = 1: min(0.5, 0.8) = 0.5 unclipped: loss −0.5, grad −0.5.
		{"ratio below 1−ε, A>0", ln(0.5), 0, 1, -0.5, -0.5, false},
		{"zero advantage", ln(3), 0, 0, 0, 0, false},
	} {
		loss, grad, clipped := ClippedSurrogate(c.logp, c.old, c.adv, 0.2)
		testkit.Near(t, c.name+" loss", loss, c.loss, 1e-9)
		testkit.Near(t, c.name+" grad", grad, c.grad, 1e-9)
		if clipped != c.clipped {
			t.Fatalf("%s: clipped %v", c.name, clipped)
		}
	}
}

func TestKLk3ByHand(t *testing.T) {
	kl, g := KLk3(-1.3, -1.3)
	testkit.Near(t, "kl at the reference", kl, 0, 1e-9)
	testkit.Near(t, "grad at the reference", g, 0, 1e-9)
	// logp = ref + ln 2: d = −ln 2, e^d = 0.5: kl = 0.5 + ln 2 − 1, grad 0.5.
	kl, g = KLk3(math.Ln2, 0)
	testkit.Near(t, "kl", kl, 0.5+math.Ln2-1, 1e-9)
	testkit.Near(t, "grad", g, 0.5, 1e-9)
}

func TestLossAggregationAndGradient(t *testing.T) {
	toks := []Token{
		{Seq: 0, Logp: -1, OldLogp: -1, RefLogp: -1, Adv: 1},
		{Seq: 0, Logp: -2, OldLogp: -2, RefLogp: -2, Adv: 1},
		{Seq: 0, Logp: -0.5, OldLogp: -0.5, RefLogp: -0.5, Adv: 1},
		{Seq: 1, Logp: -1, OldLogp: -1, RefLogp: -1, Adv: -2},
	}
	seqs := []int{0, 0, 0, 1}
	c := Config{Clip: 0.2, Beta: 0.1}
	// On-policy at the reference: surrogate per token −A, KL 0.
	w, err := TokenWeights("token-mean", seqs)
	if err != nil {
		t.Fatal(err)
	}
	st, grad := Loss(c, toks, w)
	testkit.Near(t, "token-mean loss", st.Loss, (-1-1-1+2)/4.0, 1e-9)
	testkit.Near(t, "token-mean grad", grad[3], 2/4.0, 1e-9)
	w, _ = TokenWeights("seq-mean-token-mean", seqs)
	st, grad = Loss(c, toks, w)
	testkit.Near(t, "seq-mean loss", st.Loss, (-1+2)/2.0, 1e-9)
	testkit.Near(t, "seq-mean grad of a 3-token response", grad[0], -1/6.0, 1e-9)
	testkit.Near(t, "seq-mean grad of a 1-token response", grad[3], 1, 1e-9)
	// Micro-batches of a minibatch add up to the whole.
	a, _ := Loss(c, toks[:2], w[:2])
	b, _ := Loss(c, toks[2:], w[2:])
	testkit.Near(t, "split loss", a.Loss+b.Loss, st.Loss, 1e-9)
	if _, err := TokenWeights("sum", seqs); err == nil {
		t.Fatal("unknown aggregation accepted")
	}
	// Off-policy and off-reference: the gradient matches finite differences.
	toks = []Token{
		{Seq: 0, Logp: -0.7, OldLogp: -0.9, RefLogp: -1.2, Adv: 0.8},
		{Seq: 0, Logp: -2.1, OldLogp: -1.6, RefLogp: -2.0, Adv: 0.8},
		{Seq: 1, Logp: -0.3, OldLogp: -0.35, RefLogp: -0.1, Adv: -1.1},
	}
	w, _ = TokenWeights("seq-mean-token-mean", []int{0, 0, 1})
	_, grad = Loss(c, toks, w)
	for i := range toks {
		const h = 1e-6
		up, down := append([]Token(nil), toks...), append([]Token(nil), toks...)
		up[i].Logp += h
		down[i].Logp -= h
		lu, _ := Loss(c, up, w)
		ld, _ := Loss(c, down, w)
		if num := (lu.Loss - ld.Loss) / (2 * h); math.Abs(num-grad[i]) > 1e-6 {
			t.Fatalf("token %d: dL/dlogp %g, finite differences %g", i, grad[i], num)
		}
	}
	if st, _ := Loss(c, toks, w); st.Clipped != 1 {
		t.Fatalf("%d tokens clipped, want 1: only token 0 (ratio e^0.2 > 1.2, A > 0)", st.Clipped)
	}
}

// TestAccumulateMatchesLoss: the float32 entry point training runs gives
// Loss's gradient and sums, with π_old and without (ratio 1), across
// clipped and unclipped tokens of both advantage signs.
func TestAccumulateMatchesLoss(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	const n = 500
	c := Config{Clip: 0.2, Beta: 0.04}
	lp, old, ref, adv, w, ent := make([]float32, n), make([]float32, n), make([]float32, n), make([]float32, n), make([]float32, n), make([]float32, n)
	toks := make([]Token, n)
	weights := make([]float64, n)
	for i := range n {
		lp[i] = float32(-3 * r.Float64())
		old[i] = lp[i] + float32(0.4*r.NormFloat64())
		ref[i] = lp[i] + float32(0.5*r.NormFloat64())
		adv[i] = float32(r.NormFloat64())
		w[i] = float32(r.Float64() / n)
		ent[i] = float32(r.Float64())
		weights[i] = float64(w[i])
	}
	clippedSomewhere := false
	for _, withOld := range []bool{true, false} {
		o := old
		if !withOld {
			o = nil
		}
		var entSum float64
		for i := range n {
			toks[i] = Token{Logp: float64(lp[i]), OldLogp: float64(lp[i]), RefLogp: float64(ref[i]), Adv: float64(adv[i])}
			if withOld {
				toks[i].OldLogp = float64(old[i])
			}
			entSum += float64(ent[i])
		}
		want, grad := Loss(c, toks, weights)
		d := make([]float32, n)
		st := c.Accumulate(d, lp, o, ref, adv, w)
		var ents float64
		for _, e := range ent {
			ents += float64(e)
		}
		got := [4]float64{st.Surrogate, st.KL, float64(st.Clipped), ents}
		for i := range n {
			if math.Abs(float64(d[i])-grad[i]) > 1e-7*math.Max(1, math.Abs(grad[i])) {
				t.Fatalf("token %d: gradient %v, Loss's %v", i, d[i], grad[i])
			}
		}
		if math.Abs(got[0]-want.Surrogate) > 1e-9 || math.Abs(got[1]-want.KL) > 1e-9 || int(got[2]) != want.Clipped || math.Abs(got[3]-entSum) > 1e-6 {
			t.Fatalf("sums %v, Loss's surrogate %v, KL %v, clipped %d, entropy %v", got, want.Surrogate, want.KL, want.Clipped, entSum)
		}
		clippedSomewhere = clippedSomewhere || want.Clipped > 0
	}
	if !clippedSomewhere {
		t.Fatal("no token was clipped: the test does not reach the clipped branch")
	}
}

// TestAccumulateWithoutReference: with no reference (rl.beta 0) every kl is
// 0 and the gradient is the clipped surrogate's alone: Loss's gradient at
// β = 0 whatever the reference would have been.
func TestAccumulateWithoutReference(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	const n = 200
	lp, old, ref, adv, w := make([]float32, n), make([]float32, n), make([]float32, n), make([]float32, n), make([]float32, n)
	for i := range n {
		lp[i] = float32(-3 * r.Float64())
		old[i] = lp[i] + float32(0.3*r.NormFloat64())
		ref[i] = lp[i] + float32(0.5*r.NormFloat64())
		adv[i] = float32(r.NormFloat64())
		w[i] = 1.0 / n
	}
	want := make([]float32, n)
	ws := Config{Clip: 0.2, Beta: 0}.Accumulate(want, lp, old, ref, adv, w)
	if ws.KL <= 0 {
		t.Fatalf("KL %v against a reference 0.5 nats away", ws.KL)
	}
	for _, beta := range []float64{0, 0.1} { // β multiplies a kl of 0
		got := make([]float32, n)
		st := Config{Clip: 0.2, Beta: beta}.Accumulate(got, lp, old, nil, adv, w)
		if st.KL != 0 || st.Loss != st.Surrogate || math.Abs(st.Surrogate-ws.Surrogate) > 1e-12 {
			t.Fatalf("β %v without a reference: %+v; with one at β 0: %+v", beta, st, ws)
		}
		for i := range n {
			if got[i] != want[i] {
				t.Fatalf("β %v, token %d: gradient %v without a reference, %v at β 0", beta, i, got[i], want[i])
			}
		}
	}
}
