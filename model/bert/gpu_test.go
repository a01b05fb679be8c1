package bert

import (
	"context"
	"errors"
	"math"
	"testing"

	"github.com/agemem/agemem/kernels"
	"github.com/agemem/agemem/kernels/cpu"
	"github.com/agemem/agemem/kernels/cuda"
	"github.com/agemem/agemem/model/optim"
)

// gpu is the first GPU, or a skip where there is none.
func gpu(t *testing.T) *cuda.Backend {
	t.Helper()
	g, err := cuda.New(0)
	if errors.Is(err, cuda.ErrNoDevice) {
		t.Skipf("GPU test skipped: %v", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	return g
}

// TestEncoderOnGPU: the encoder's batches on the GPU give the CPU's
// embeddings, for BERT and RoBERTa position ids, both GELUs and every
// pooling, with sequences packed several to a batch.
func TestEncoderOnGPU(t *testing.T) {
	g := gpu(t)
	texts := []string{"Marla Quenby was born in Oslo in 1971.", "the capital of norway", "Oslo!", "a river flows through the city of oslo, marla", "x"}
	for _, typ := range []string{"bert", "roberta"} {
		cfg := tinyCfg
		cfg.ModelType = typ
		cfg.Layers = 3
		if typ == "roberta" {
			cfg.PadTokenID = 0
			cfg.HiddenAct = "gelu_new"
		}
		dir := tinyBERT(t, cfg)
		for _, pool := range []string{PoolCLS, PoolCLSMLP, PoolMean} {
			onCPU, err := LoadEncoder(dir, pool, 40, nil)
			if err != nil {
				t.Fatal(err)
			}
			onGPU, err := LoadEncoder(dir, pool, 40, g)
			if err != nil {
				t.Fatal(err)
			}
			want, err := onCPU.Embed(context.Background(), texts)
			if err != nil {
				t.Fatal(err)
			}
			got, err := onGPU.Embed(context.Background(), texts)
			if err != nil {
				t.Fatal(err)
			}
			worst := 0.0
			for i := range want {
				for j := range want[i] {
					worst = math.Max(worst, math.Abs(float64(got[i][j]-want[i][j])))
				}
			}
			t.Logf("%s %s: GPU vs CPU max abs difference %.2e", typ, pool, worst)
			if worst > 2e-5 {
				t.Errorf("%s %s: GPU embeddings differ from the CPU's by %.2e", typ, pool, worst)
			}
		}
	}
}

// TestTrainerOnGPU: the encoder's training step on the GPU (bert.Trainer
// over the CUDA backend's encoder kernels) gives the CPU backend's pooled
// vectors and gradients, with hidden and attention dropout on (both
// backends draw the masks from the same counters), and the same AdamW
// step.
func TestTrainerOnGPU(t *testing.T) {
	g := gpu(t)
	cfg := tinyCfg
	cfg.Layers = 3
	dir := tinyBERT(t, cfg)
	tok, _ := LoadWordPiece(dir)
	batch := [][]int{tok.Encode("marla was born in oslo", 0), tok.Encode("the capital of norway", 0), tok.Encode("oslo", 0), tok.Encode("a river", 0)}
	const lr = 1e-3
	for _, pool := range []string{PoolMean, PoolCLSMLP} {
		var pooled [2][]float32
		var grads [2]map[string][]float32
		var after [2]*Weights[float32]
		for i, be := range []kernels.EncoderTrainer{cpu.New(), g} {
			w, err := Load[float32](dir, true)
			if err != nil {
				t.Fatal(err)
			}
			tr := NewTrainer(be, w, func(string) bool { return true })
			p, pass, err := tr.Forward(batch, pool, 0.1, 0.1, 7)
			if err != nil {
				t.Fatal(err)
			}
			dp := make([]float32, len(p))
			for j := range dp {
				dp[j] = float32(j%5) - 2
			}
			if err := pass.Backward(dp); err != nil {
				t.Fatal(err)
			}
			pooled[i], grads[i] = p, tr.Gradients()
			tr.Step(optim.DefaultConfig().AdamW(), 1, lr, 1)
			tr.Download(nil, 1)
			after[i] = w
		}
		worst := func(a, b []float32) float64 {
			m := 0.0
			for j := range a {
				m = math.Max(m, math.Abs(float64(a[j]-b[j]))/math.Max(1, math.Abs(float64(a[j]))))
			}
			return m
		}
		if d := worst(pooled[0], pooled[1]); d > 1e-4 {
			t.Errorf("%s: pooled vectors differ by %.2e", pool, d)
		}
		for name, gc := range grads[0] {
			if d := worst(gc, grads[1][name]); d > 1e-3 {
				t.Errorf("%s: %s gradient differs by %.2e", pool, name, d)
			}
		}
		// AdamW's first step moves a weight by lr·g/(|g|+eps): about lr
		// whatever |g| is, so where the gradient is zero in exact
		// arithmetic (a key bias, which softmax cancels; an output
		// LayerNorm bias in the dimensions where this dp sums to zero)
		// the two backends' rounding noise, of opposite signs, moves it
		// by up to ±lr. There the step is held to AdamW's bound; where
		// the gradient is real, to the CPU's step.
		for j, n := range after[0].Named {
			g, ok := grads[0][n.Name]
			if !ok {
				t.Fatalf("%s: no gradient for %s", pool, n.Name)
			}
			got := after[1].Named[j].V.Val
			for k, v := range n.V.Val {
				d := math.Abs(float64(v - got[k]))
				if math.Abs(float64(g[k])) < 1e-5 {
					if d > 2.1*lr {
						t.Errorf("%s: %s[%d] (gradient %.1e) moved %.2e apart, more than two AdamW steps", pool, n.Name, k, g[k], d)
						break
					}
				} else if d > 1e-5*math.Max(1, math.Abs(float64(v))) {
					t.Errorf("%s: %s[%d] after the step differs by %.2e (gradient %.2e)", pool, n.Name, k, d, g[k])
					break
				}
			}
		}
	}
}
