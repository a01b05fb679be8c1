package bert

import (
	"math"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/agemem/agemem/kernels"
	"github.com/agemem/agemem/kernels/cpu"
	"github.com/agemem/agemem/model/optim"
	"github.com/agemem/agemem/model/tape"
)

// TestTrainerMatchesTheTape: the device trainer (here on the CPU backend,
// as simulated devices run) computes the tape's pooled vectors and, given
// the same gradient of them, the tape's gradient of every parameter, with
// hidden dropout on (the same masks from the same seed), for each pooling.
func TestTrainerMatchesTheTape(t *testing.T) {
	dir := tinyBERT(t, tinyCfg)
	tok, _ := LoadWordPiece(dir)
	batch := [][]int{tok.Encode("marla was born in oslo", 0), tok.Encode("the capital of norway", 0), tok.Encode("oslo", 0)}
	for _, pool := range []string{PoolMean, PoolCLS, PoolCLSMLP} {
		w, err := Load[float32](dir, true)
		if err != nil {
			t.Fatal(err)
		}
		h := w.HiddenSize
		r := rand.New(rand.NewPCG(7, 7))
		dp := make([]float32, len(batch)*h)
		for i := range dp {
			dp[i] = float32(r.NormFloat64())
		}
		// The tape: the same pooling without the L2 normalisation.
		tp := tape.New[float32]()
		x, segs, err := w.Forward(tp, batch, 0.1, 0, 42)
		if err != nil {
			t.Fatal(err)
		}
		var p *tape.Var[float32]
		switch pool {
		case PoolMean:
			p = tp.MeanPool(x, segs)
		default:
			rows := []int{segs[0].Lo, segs[1].Lo, segs[2].Lo}
			p = tp.Gather(x, rows)
			if pool == PoolCLSMLP {
				p = tp.Tanh(tp.Linear(p, w.Pooler.W, w.Pooler.B))
			}
		}
		tp.Backward(p, dp)

		tr := NewTrainer(cpu.New(), w, func(string) bool { return true })
		got, pass, err := tr.Forward(batch, pool, 0.1, 0, 42)
		if err != nil {
			t.Fatal(err)
		}
		for i := range got {
			if d := math.Abs(float64(got[i] - p.Val[i])); d > 1e-5 {
				t.Fatalf("%s: pooled[%d] = %g, tape %g", pool, i, got[i], p.Val[i])
			}
		}
		if err := pass.Backward(dp); err != nil {
			t.Fatal(err)
		}
		grads := tr.Gradients()
		for _, n := range w.Named {
			g := grads[n.Name]
			worst, scale := 0.0, 0.0
			for i := range g {
				var want float64
				if n.V.Grad != nil {
					want = float64(n.V.Grad[i])
				}
				worst = math.Max(worst, math.Abs(float64(g[i])-want))
				scale = math.Max(scale, math.Abs(want))
			}
			if worst > 1e-4*math.Max(1, scale) {
				t.Errorf("%s: %s gradient differs from the tape's by %.3g (largest %.3g)", pool, n.Name, worst, scale)
			}
		}
	}
}

// TestTrainerStepIsAdamW: a step on the device is the host optimiser's
// step on the same gradients (clipping included), and Download brings the
// weights and moments back.
func TestTrainerStepIsAdamW(t *testing.T) {
	dir := tinyBERT(t, tinyCfg)
	tok, _ := LoadWordPiece(dir)
	batch := [][]int{tok.Encode("marla was born in oslo", 0), tok.Encode("oslo", 0)}
	w, _ := Load[float32](dir, true)
	host, _ := Load[float32](dir, true)
	decay := func(name string) bool {
		return !strings.Contains(name, "LayerNorm") && !strings.HasSuffix(name, ".bias")
	}
	tr := NewTrainer(cpu.New(), w, decay)
	_, pass, err := tr.Forward(batch, PoolMean, 0, 0, 1)
	if err != nil {
		t.Fatal(err)
	}
	dp := make([]float32, 2*w.HiddenSize)
	for i := range dp {
		dp[i] = float32(i%7) - 3
	}
	if err := pass.Backward(dp); err != nil {
		t.Fatal(err)
	}
	grads := tr.Gradients()
	c := optim.DefaultConfig().AdamW()
	norm := tr.Step(c, 1, 1e-3, 0.5)
	opt := optim.NewAdamW(c)
	tr.Download(opt, 1)

	want := optim.NewAdamW(c)
	var params []optim.Param
	for _, n := range host.Named {
		params = append(params, optim.Param{Name: n.Name, W: n.V.Val, G: grads[n.Name], Decay: decay(n.Name)})
	}
	if got := optim.GlobalNorm(params); math.Abs(got-norm) > 1e-4*got {
		t.Fatalf("gradient norm %g, host %g", norm, got)
	}
	optim.ClipGlobalNorm(params, 0.5)
	if err := want.Step(params, 1e-3); err != nil {
		t.Fatal(err)
	}
	for i, n := range w.Named {
		for j, v := range n.V.Val {
			if d := math.Abs(float64(v - host.Named[i].V.Val[j])); d > 1e-6 {
				t.Fatalf("%s[%d] = %g after the device step, %g after the host's", n.Name, j, v, host.Named[i].V.Val[j])
			}
		}
		if m := opt.M[n.Name]; len(m) != len(n.V.Val) || math.Abs(float64(m[0]-want.M[n.Name][0])) > 1e-7 {
			t.Fatalf("%s: the downloaded first moment differs from the host optimiser's", n.Name)
		}
	}
	if opt.StepN != 1 {
		t.Fatalf("downloaded step %d", opt.StepN)
	}
}

// TestSegmentAttentionDropout holds the backend's attention with dropout
// on its probabilities to an independent float64 one (the mask drawn from
// kernels.DropoutBits by the documented counter), and its backward to
// finite differences of that reference.
func TestSegmentAttentionDropout(t *testing.T) {
	be := cpu.New()
	const heads, hd, p = 2, 4, 0.3
	const seed = 99
	bounds := []int{0, 3, 8}
	n, w := bounds[2], heads*hd
	r := rand.New(rand.NewPCG(3, 4))
	rnd := func() []float64 {
		v := make([]float64, n*w)
		for i := range v {
			v[i] = r.NormFloat64()
		}
		return v
	}
	q, k, v, g := rnd(), rnd(), rnd(), rnd()
	// ref is Σ out∘g of the float64 attention.
	ref := func(q, k, v []float64) (out []float64, loss float64) {
		out = make([]float64, n*w)
		thr := kernels.DropoutThreshold(p)
		for s := range 2 {
			for i := bounds[s]; i < bounds[s+1]; i++ {
				for h := range heads {
					var sc []float64
					m := math.Inf(-1)
					for j := bounds[s]; j < bounds[s+1]; j++ {
						d := 0.0
						for e := range hd {
							d += q[i*w+h*hd+e] * k[j*w+h*hd+e]
						}
						sc = append(sc, d/math.Sqrt(hd))
						m = math.Max(m, d/math.Sqrt(hd))
					}
					z := 0.0
					for jj := range sc {
						sc[jj] = math.Exp(sc[jj] - m)
						z += sc[jj]
					}
					for jj := range sc {
						j := bounds[s] + jj
						if kernels.DropoutBits(seed, kernels.AttentionDropoutCounter(i, h, j, heads, n)) < thr {
							continue
						}
						for e := range hd {
							out[i*w+h*hd+e] += sc[jj] / z / (1 - p) * v[j*w+h*hd+e]
						}
					}
				}
			}
		}
		for i := range out {
			loss += out[i] * g[i]
		}
		return out, loss
	}
	f32 := func(x []float64) kernels.Tensor {
		y := make([]float32, len(x))
		for i, e := range x {
			y[i] = float32(e)
		}
		return be.FromHost(y, n, w)
	}
	want, _ := ref(q, k, v)
	out := be.Zeros(n, w)
	be.SegmentAttentionDropout(out, f32(q), f32(k), f32(v), bounds, heads, hd, p, seed)
	dropped := 0
	for i, o := range be.ToHost(out) {
		if math.Abs(float64(o)-want[i]) > 1e-5 {
			t.Fatalf("out[%d] = %g, reference %g", i, o, want[i])
		}
	}
	for i := range n {
		for h := range heads {
			for j := range n {
				if kernels.DropoutBits(seed, kernels.AttentionDropoutCounter(i, h, j, heads, n)) < kernels.DropoutThreshold(p) {
					dropped++
				}
			}
		}
	}
	if dropped == 0 {
		t.Fatal("no probability was dropped: the test checks nothing")
	}
	dq, dk, dv := be.Zeros(n, w), be.Zeros(n, w), be.Zeros(n, w)
	be.SegmentAttentionBackward(dq, dk, dv, f32(g), f32(q), f32(k), f32(v), bounds, heads, hd, p, seed)
	for _, c := range []struct {
		name string
		x    []float64
		grad []float32
	}{{"dq", q, be.ToHost(dq)}, {"dk", k, be.ToHost(dk)}, {"dv", v, be.ToHost(dv)}} {
		for i := range c.x {
			orig := c.x[i]
			c.x[i] = orig + 1e-6
			_, up := ref(q, k, v)
			c.x[i] = orig - 1e-6
			_, down := ref(q, k, v)
			c.x[i] = orig
			num := (up - down) / 2e-6
			if math.Abs(num-float64(c.grad[i])) > 1e-4*math.Max(1, math.Abs(num)) {
				t.Fatalf("%s[%d] = %g, finite differences %g", c.name, i, c.grad[i], num)
			}
		}
	}
}
