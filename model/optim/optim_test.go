package optim

import (
	"fmt"
	"math"
	"testing"
)

func near(a, b, tol float64) bool { return math.Abs(a-b) <= tol }

// TestAdamWByHand checks two steps against numbers worked by hand.
func TestAdamWByHand(t *testing.T) {
	a := NewAdamW(AdamWConfig{Beta1: 0.9, Beta2: 0.999, Eps: 1e-8, WeightDecay: 0.1})
	w := []float32{1.0, 2.0}
	ps := []Param{{Name: "layer.weight", W: w, G: []float32{0.5, -0.5}, Decay: true}, {Name: "layer.norm", W: []float32{1}, G: []float32{0.5}, Decay: false}}
	a.Step(ps, 0.01)
	// Step 1: m̂ = g, v̂ = g², so the update is lr·sign(g) (ε aside);
	// decay first: 1·(1 − 0.01·0.1) = 0.999, then 0.999 − 0.01 = 0.989.
	if !near(float64(w[0]), 0.989, 1e-6) || !near(float64(w[1]), 2*0.999+0.01, 1e-6) {
		t.Fatalf("step 1: %v", w)
	}
	if !near(float64(ps[1].W[0]), 0.99, 1e-6) {
		t.Fatalf("a norm weight must not decay: %v", ps[1].W[0])
	}
	// Step 2 with g = 0.5 again: m = 0.9·0.05 + 0.1·0.5 = 0.095,
	// v = 0.999·0.00025 + 0.001·0.25 = 0.00049975; m̂ = 0.095/0.19 = 0.5,
	// v̂ = 0.00049975/0.001999 = 0.25, so the update is 0.01·0.5/0.5 again.
	ps[0].G[0] = 0.5
	a.Step(ps, 0.01)
	want := 0.989*0.999 - 0.01*0.5/(math.Sqrt(0.00049975/0.001999)+1e-8)
	if !near(float64(w[0]), want, 1e-6) {
		t.Fatalf("step 2: %v want %v", w[0], want)
	}
}

func TestAdamWMinimisesAQuadratic(t *testing.T) {
	a := NewAdamW(AdamWConfig{Beta1: 0.9, Beta2: 0.999, Eps: 1e-8})
	w := []float32{5, -3}
	g := make([]float32, 2)
	ps := []Param{{Name: "w", W: w, G: g}}
	for range 2000 {
		for i := range w { // f = Σ (w − 1)²
			g[i] = 2 * (w[i] - 1)
		}
		a.Step(ps, 0.05)
	}
	if !near(float64(w[0]), 1, 1e-2) || !near(float64(w[1]), 1, 1e-2) {
		t.Fatalf("did not converge: %v", w)
	}
	if err := a.Step([]Param{{Name: "bad", W: make([]float32, 2), G: make([]float32, 3)}}, 0.1); err == nil {
		t.Fatal("mismatched gradient length must fail")
	}
}

func TestClipAndSchedule(t *testing.T) {
	ps := []Param{{G: []float32{3}}, {G: []float32{4}}}
	if n := ClipGlobalNorm(ps, 1); !near(n, 5, 1e-9) || !near(GlobalNorm(ps), 1, 1e-5) {
		t.Fatalf("clip: norm %v, after %v", n, GlobalNorm(ps))
	}
	ps = []Param{{G: []float32{0.3, 0.4}}}
	ClipGlobalNorm(ps, 1)
	if ps[0].G[0] != 0.3 {
		t.Fatal("a gradient under the limit must not change")
	}
	s := Schedule{Warmup: 10, Total: 110, Cosine: true, MinRatio: 0.1}
	for _, c := range []struct {
		step int
		want float64
	}{{0, 0.1}, {9, 1}, {10, 1}, {60, 0.55}, {110, 0.1}, {500, 0.1}} {
		if got := s.LR(1, c.step); !near(got, c.want, 1e-9) {
			t.Errorf("LR(step %d) = %v, want %v", c.step, got, c.want)
		}
	}
	if (Schedule{Warmup: 2}).LR(3, 50) != 3 {
		t.Error("constant after warmup")
	}
	if DecayFor("model.layers.0.input_layernorm.weight") || DecayFor("model.layers.0.self_attn.q_proj.bias") || !DecayFor("model.layers.0.mlp.up_proj.weight") {
		t.Error("DecayFor")
	}
}

// TestLargeParametersMatchSmallOnes: the parallel update and norm of a
// parameter big enough to be split across cores equal the serial ones.
func TestLargeParametersMatchSmallOnes(t *testing.T) {
	const n = 1<<17 + 3
	w1, g1 := make([]float32, n), make([]float32, n)
	for i := range w1 {
		w1[i], g1[i] = float32(i%7)-3, float32(i%11)/10-0.5
	}
	w2, g2 := append([]float32(nil), w1...), append([]float32(nil), g1...)
	big := []Param{{Name: "w", W: w1, G: g1, Decay: true}}
	var small []Param // the same values as many small parameters, updated serially
	for lo := 0; lo < n; lo += 1000 {
		hi := min(lo+1000, n)
		small = append(small, Param{Name: fmt.Sprint(lo), W: w2[lo:hi], G: g2[lo:hi], Decay: true})
	}
	if a, b := GlobalNorm(big), GlobalNorm(small); math.Abs(a-b) > 1e-9*a {
		t.Fatalf("norm %v split, %v serial", a, b)
	}
	cfg := AdamWConfig{Beta1: 0.9, Beta2: 0.999, Eps: 1e-8, WeightDecay: 0.1}
	NewAdamW(cfg).Step(big, 0.01)
	NewAdamW(cfg).Step(small, 0.01)
	for i := range w1 {
		if w1[i] != w2[i] {
			t.Fatalf("weight %d: %v split, %v serial", i, w1[i], w2[i])
		}
	}
}
