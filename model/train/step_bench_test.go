package train

import (
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/agemem/agemem/kernels/cpu"
	"github.com/agemem/agemem/model/optim"
	"github.com/agemem/agemem/model/qwen"
	"github.com/agemem/agemem/model/safetensors"
	"github.com/agemem/agemem/model/tape"
)

// randomSource makes random weights of a shape in memory (no file: the
// 0.5B shape would be 2 GB on disk).
func randomSource(cfg qwen.Config, seed uint64) qwen.TensorMap {
	return qwen.MapOf(qwen.RandomTensors(cfg, safetensors.F32, seed))
}

// matmulPeak measures the CPU matmul's GFLOP/s on a 1024³ product: the
// anchor model-FLOPs utilisation divides by.
func matmulPeak() float64 {
	const n = 1024
	x, w, y := make([]float32, n*n), make([]float32, n*n), make([]float32, n*n)
	for i := range x {
		x[i], w[i] = float32(i%7), float32(i%5)
	}
	cpu.MatMulT(y, x, w, nil, n, n, n) // warm
	best := 0.0
	for range 3 {
		t0 := time.Now()
		cpu.MatMulT(y, x, w, nil, n, n, n)
		best = max(best, 2*n*n*n/time.Since(t0).Seconds()/1e9)
	}
	return best
}

// BenchmarkTrainStep is one full training step (forward, backward, AdamW)
// on packed sequences, for the tiny default shape and the Qwen2.5-0.5B
// shape, with and without per-layer recomputation. It reports training
// tokens/s, model-FLOPs utilisation (6·params·tokens/s over the matmul peak
// measured in the same run) and the tape's peak activation memory per token.
func BenchmarkTrainStep(b *testing.B) {
	peak := matmulPeak()
	b.Logf("anchor: CPU matmul peak %.1f GFLOP/s (1024³)", peak)
	shapes := []struct {
		name       string
		cfg        qwen.Config
		seqs, each int
	}{
		{"tiny", qwen.Config{ModelType: "qwen3", HiddenSize: 96, Layers: 3, Heads: 4, KVHeads: 2, HeadDim: 24, Intermediate: 256,
			RMSNormEps: 1e-6, RopeTheta: 1e4, TieEmbeddings: true, VocabSize: 2048, MaxPositions: 4096}, 8, 512},
		{"qwen2.5-0.5b-shape", qwen.Presets["qwen2.5-0.5b-shape"], 2, 128},
	}
	for _, s := range shapes {
		w, err := NewWeights[float32](s.cfg, randomSource(s.cfg, 1))
		if err != nil {
			b.Fatal(err)
		}
		params := 0
		var ps []optim.Param
		for _, nv := range w.Trainable() {
			params += len(nv.V.Val)
			ps = append(ps, optim.Param{Name: nv.Name, W: nv.V.Val, G: nv.V.Grad, Decay: optim.DecayFor(nv.Name)})
		}
		opt := optim.NewAdamW(optim.AdamWConfig{Beta1: 0.9, Beta2: 0.999, Eps: 1e-8, WeightDecay: 0.01})
		r := rand.New(rand.NewPCG(2, 2))
		var seqs []Sequence
		for range s.seqs {
			ids := make([]int, s.each)
			loss := make([]bool, s.each)
			for i := range ids {
				ids[i], loss[i] = r.IntN(s.cfg.VocabSize), i > 0
			}
			seqs = append(seqs, Sequence{IDs: ids, Loss: loss})
		}
		batch := Pack(seqs)
		for _, recompute := range []bool{false, true} {
			b.Run(fmt.Sprintf("%s/recompute=%v", s.name, recompute), func(b *testing.B) {
				var mem int64
				for range b.N {
					tp := tape.New[float32]()
					lp := w.LogProbs(tp, batch, TrainOptions{Recompute: recompute})
					d := make([]float32, len(lp.Val))
					for i := range d {
						d[i] = -1 / float32(len(d))
					}
					tp.Backward(lp, d)
					mem = tp.Mem().Peak
					optim.ClipGlobalNorm(ps, 1)
					if err := opt.Step(ps, 1e-5); err != nil {
						b.Fatal(err)
					}
					optim.ZeroGrad(ps)
				}
				tokens := float64(len(batch.Tokens))
				tps := tokens * float64(b.N) / b.Elapsed().Seconds()
				mfu := 6 * float64(params) * tps / (peak * 1e9)
				b.ReportMetric(tps, "tokens/s")
				b.ReportMetric(mfu*100, "MFU%")
				b.ReportMetric(float64(mem)/tokens/1024, "KiB/token")
				b.Logf("%s recompute=%v: %d params, %.0f tokens/s, MFU %.1f%% of the %.1f GFLOP/s matmul peak (ratio %.3f), peak activations %.1f KiB/token",
					s.name, recompute, params, tps, mfu*100, peak, mfu, float64(mem)/tokens/1024)
			})
		}
	}
}
