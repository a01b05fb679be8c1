package train

import (
	"testing"
	"time"

	"github.com/agemem/agemem/internal/testkit"
	"github.com/agemem/agemem/model/optim"
	"github.com/agemem/agemem/model/qwen"
	"github.com/agemem/agemem/model/safetensors"
)

// BenchmarkCUDATrain reports a full fine-tuning step (forward, backward,
// clipped AdamW, all on the GPU) of the Qwen2.5-0.5B-shaped model on
// 2 × 512 learned tokens, with f32 matmuls and with bf16 tensor-core
// matmuls (mixed precision): tokens/s, MFU (6·params·tokens/s over the
// GEMM rate of that precision measured in the same run) and device memory.
// The anchors are testdata/torch_anchors.py's PyTorch steps on the same
// model (f32, and bf16 autocast).
func BenchmarkCUDATrain(b *testing.B) {
	g := testkit.GPU(b)
	cfg := qwen.Presets["qwen2.5-0.5b-shape"]
	src := qwen.MapOf(qwen.RandomTensors(cfg, safetensors.BF16, 1))
	var seqs []Sequence
	for s := range 2 {
		ids, loss := make([]int, 512), make([]bool, 512)
		for i := range ids {
			ids[i] = (i*7919 + s*13) % cfg.VocabSize
			loss[i] = i > 0
		}
		seqs = append(seqs, Sequence{IDs: ids, Loss: loss})
	}
	batch := Pack(seqs)
	dl := make([]float32, len(batch.LossRows))
	for i := range dl {
		dl[i] = -1 / float32(len(dl))
	}
	oc := optim.AdamWConfig{Beta1: 0.9, Beta2: 0.999, Eps: 1e-8, WeightDecay: 0.01}
	for _, bf16 := range []bool{false, true} {
		name := map[bool]string{false: "f32", true: "bf16"}[bf16]
		b.Run(name, func(b *testing.B) {
			g.BF16 = bf16
			defer func() { g.BF16 = false }()
			peak := testkit.GEMMRate(g, bf16)
			wts, err := NewWeights[float32](cfg, src)
			if err != nil {
				b.Fatal(err)
			}
			params := 0
			for _, nv := range wts.Trainable() {
				params += len(nv.V.Val)
			}
			d := NewReplica(g, wts, false)
			stepN := 0
			step := func() {
				stepN++
				acts := d.Forward(batch, TrainOptions{})
				d.Backward(acts, g.FromHost(dl, len(dl)))
				d.Step(oc, stepN, 1e-5, 1, nil)
			}
			step()
			g.Sync()
			var elapsed time.Duration
			for b.Loop() {
				t0 := time.Now()
				step()
				g.Sync()
				elapsed += time.Since(t0)
			}
			tps := float64(len(batch.Tokens)*b.N) / elapsed.Seconds()
			live, cached := g.MemStats()
			b.ReportMetric(tps, "train_tok/s")
			b.ReportMetric(6*float64(params)*tps/peak, "MFU_vs_gemm")
			b.ReportMetric(peak/1e12, "gemm_TFLOP/s")
			b.ReportMetric(float64(live+cached)/(1<<30), "device_GiB")
		})
	}
}

// gemmRate measures cuBLAS GEMM FLOP/s through the backend: f32 at 4096³,
