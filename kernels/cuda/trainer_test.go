package cuda

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/agemem/agemem/kernels"
	"github.com/agemem/agemem/kernels/cpu"
	"github.com/agemem/agemem/rl/grpo"
)

// TestTrainerOpsMatchCPU runs every backward op and the optimiser on both
// backends with the same inputs; the CPU ones are finite-difference checked
// in kernels/cpu.
func TestTrainerOpsMatchCPU(t *testing.T) {
	g := gpu(t)
	c := cpu.New()
	r := rand.New(rand.NewPCG(3, 4))
	// run gives f each backend and compares every tensor it returns.
	run := func(name string, tol float64, f func(be kernels.TrainBackend) []kernels.Tensor) {
		t.Helper()
		gs, cs := f(g), f(c)
		for i := range gs {
			close(t, name, g.ToHost(gs[i]), c.ToHost(cs[i]), tol)
		}
	}
	// GRPO's loss: ratios on both sides of the clip range, both signs of
	// the advantage, with and without π_old; 1000 tokens span 4 blocks.
	const nt = 1000
	lp, old, ref, adv, wt, ent := rnd(r, nt), rnd(r, nt), rnd(r, nt), rnd(r, nt), rnd(r, nt), rnd(r, nt)
	for i := range nt {
		old[i] = lp[i] + 0.3*old[i]
		ref[i] = lp[i] + 0.5*ref[i]
		wt[i] = float32(math.Abs(float64(wt[i]))) / nt
	}
	// The kernel is held to rl/grpo's loss, the one training runs on the
	// host.
	c04 := grpo.Config{Clip: 0.2, Beta: 0.04}
	for _, c := range []struct{ withOld, withRef bool }{{true, true}, {false, true}, {true, false}} {
		var o, rf []float32
		var od, rd kernels.Tensor
		if c.withOld {
			o, od = old, g.FromHost(old, nt)
		}
		if c.withRef { // no reference: rl.beta 0, every kl 0
			rf, rd = ref, g.FromHost(ref, nt)
		}
		want := make([]float32, nt)
		ws := c04.Accumulate(want, lp, o, rf, adv, wt)
		var ents float64
		for _, e := range ent {
			ents += float64(e)
		}
		d, st := g.Zeros(nt), g.Zeros(4)
		g.PolicyGradient(d, st, g.FromHost(lp, nt), g.FromHost(ent, nt), od, rd, g.FromHost(adv, nt), g.FromHost(wt, nt), 0.2, 0.04)
		close(t, "policy gradient", g.ToHost(d), want, 1e-4)
		got := kernels.PolicyStatsOf(g.ToHost(st))
		close(t, "policy gradient sums", []float32{float32(got.Surrogate), float32(got.KL), float32(got.Clipped), float32(got.Entropy)},
			[]float32{float32(ws.Surrogate), float32(ws.KL), float32(ws.Clipped), float32(ents)}, 1e-4)
	}
	const m, k, n = 37, 300, 129
	x, w, dy := rnd(r, m*k), rnd(r, n*k), rnd(r, m*n)
	run("matmul bwd", 1e-4, func(be kernels.TrainBackend) []kernels.Tensor {
		dx, dw, db := be.FromHost(rnd(rand.New(rand.NewPCG(1, 1)), m*k), m, k), be.Zeros(n, k), be.Zeros(n)
		be.MatMulBackward(dx, dw, db, be.FromHost(dy, m, n), be.FromHost(x, m, k), be.FromHost(w, n, k))
		return []kernels.Tensor{dx, dw, db}
	})
	// BF16 mode: tensor-core backward GEMMs on bf16-rounded dy, w and x
	// equal the CPU's f32 backward of the rounded values.
	round := func(v []float32) []float32 {
		out := make([]float32, len(v))
		for i, x := range v {
			out[i] = bf16Round(x)
		}
		return out
	}
	g.BF16 = true
	gdx, gdw := g.Zeros(m, k), g.Zeros(n, k)
	g.MatMulBackward(gdx, gdw, nil, g.FromHost(dy, m, n), g.FromHost(x, m, k), g.FromHost(w, n, k))
	g.BF16 = false
	cdx, cdw := c.Zeros(m, k), c.Zeros(n, k)
	c.MatMulBackward(cdx, cdw, nil, c.FromHost(round(dy), m, n), c.FromHost(round(x), m, k), c.FromHost(round(w), n, k))
	close(t, "matmul bwd bf16", g.ToHost(gdx), c.ToHost(cdx), 1e-4)
	close(t, "matmul bwd bf16", g.ToHost(gdw), c.ToHost(cdw), 1e-4)
	const d = 64
	rows := m * k / d
	run("rmsnorm bwd", 1e-4, func(be kernels.TrainBackend) []kernels.Tensor {
		dx, dw := be.Zeros(rows, d), be.Zeros(d)
		be.RMSNormBackward(dx, dw, be.FromHost(x[:rows*d], rows, d), be.FromHost(w[:rows*d], rows, d), be.FromHost(dy[:d], d), 1e-6)
		return []kernels.Tensor{dx, dw}
	})
	pos := []int{3, 4, 5, 90, 91}
	run("rope bwd", 1e-5, func(be kernels.TrainBackend) []kernels.Tensor {
		y := be.FromHost(x[:5*4*32], 5, 4*32)
		be.RopeBackward(y, pos, 4, 32, 1e6)
		return []kernels.Tensor{y}
	})
	run("silu bwd", 1e-5, func(be kernels.TrainBackend) []kernels.Tensor {
		dg, du := be.Zeros(1000), be.Zeros(1000)
		be.SiLUMulBackward(dg, du, be.FromHost(dy[:1000], 1000), be.FromHost(x[:1000], 1000), be.FromHost(w[:1000], 1000))
		return []kernels.Tensor{dg, du}
	})
	run("embed bwd", 1e-5, func(be kernels.TrainBackend) []kernels.Tensor {
		dt := be.Zeros(10, k)
		be.EmbeddingBackward(dt, be.FromHost(x[:4*k], 4, k), []int{3, 7, 3, 0})
		return []kernels.Tensor{dt}
	})
	tg := []int{5, -1, 128, 0, 77}
	run("logprobs", 1e-5, func(be kernels.TrainBackend) []kernels.Tensor {
		lg := be.FromHost(x[:5*n], 5, n)
		out, ent, dl := be.Zeros(5), be.Zeros(5), be.Zeros(5, n)
		be.LogProbs(out, ent, lg, tg)
		be.LogProbsBackward(dl, be.FromHost([]float32{1, 2, -0.5, 0, 3}, 5), lg, tg)
		return []kernels.Tensor{out, ent, dl}
	})
	// Attention forward and backward over a segment with a 3-row prefix,
	// and long ones (more keys than a block has threads, partial tiles,
	// the tiled kernels from 16 queries on), head_dim 128 and odd ones.
	for _, sh := range []struct{ t, start, heads, kvh, hd int }{{6, 3, 4, 2, 32}, {300, 0, 2, 1, 128}, {40, 10, 6, 3, 24},
		{200, 70, 4, 2, 64}, {77, 0, 3, 1, 33}, {16, 45, 8, 8, 128}} {
		nk := sh.start + sh.t
		q, kk, vv := rnd(r, sh.t*sh.heads*sh.hd), rnd(r, nk*sh.kvh*sh.hd), rnd(r, nk*sh.kvh*sh.hd)
		do := rnd(r, sh.t*sh.heads*sh.hd)
		run("attention fwd+bwd", 1e-4, func(be kernels.TrainBackend) []kernels.Tensor {
			qt, kt, vt := be.FromHost(q, sh.t, sh.heads*sh.hd), be.FromHost(kk, nk, sh.kvh*sh.hd), be.FromHost(vv, nk, sh.kvh*sh.hd)
			out := be.Zeros(sh.t, sh.heads*sh.hd)
			be.Attention(out, qt, kt, vt, nil, sh.start, sh.heads, sh.kvh, sh.hd)
			dq, dk, dv := be.Zeros(sh.t, sh.heads*sh.hd), be.Zeros(nk, sh.kvh*sh.hd), be.Zeros(nk, sh.kvh*sh.hd)
			be.AttentionBackward(dq, dk, dv, be.FromHost(do, sh.t, sh.heads*sh.hd), out, qt, kt, vt, sh.start, sh.heads, sh.kvh, sh.hd)
			return []kernels.Tensor{out, dq, dk, dv}
		})
	}
	// AdamW with clipping (the norm is above MaxNorm) after two steps.
	run("adamw", 1e-5, func(be kernels.TrainBackend) []kernels.Tensor {
		wt, mt, vt := be.FromHost(w[:1000], 1000), be.Zeros(1000), be.Zeros(1000)
		gt := be.FromHost(dy[:1000], 1000)
		for step := 1; step <= 2; step++ {
			ss := be.Zeros(1)
			be.SumSquares(ss, gt)
			be.AdamW(wt, gt, mt, vt, ss, kernels.AdamWStep{LR: 1e-2, Beta1: 0.9, Beta2: 0.999, Eps: 1e-8, Decay: 1 - 1e-4,
				BC1: 1 - math.Pow(0.9, float64(step)), BC2: 1 - math.Pow(0.999, float64(step)), MaxNorm: 1})
		}
		acc := be.FromHost([]float32{0.5}, 1)
		be.AddScaled(acc, be.FromHost([]float32{2}, 1), 3)
		y := be.Zeros(1000)
		be.Dropout(y, gt, 0.3, 42)
		return []kernels.Tensor{wt, mt, vt, acc, y}
	})
}
