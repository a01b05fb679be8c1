package train

import (
	"os"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/agemem/agemem/kernels"
	"github.com/agemem/agemem/model/lora"

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
			d := NewReplica(g, wts, BaseF32)
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

// BenchmarkCUDAPaperStep is the paper's GRPO update on one GPU: a
// Qwen2.5-7B- or Qwen3-4B-shaped model with random bf16 weights (real
// shapes), the base frozen in bf16, LoRA r 16 on all seven projections,
// tensor-core matmuls, activation recomputation and chunked vocabulary
// log-probabilities; K rollouts of CTX-token contexts and RESP-token
// responses, one rollout a micro-batch, then one AdamW step. It reports
// the update's tokens/s, the allocator's peak (live tensors and cache, as
// torch.cuda.max_memory_reserved) and the device memory in use at the end
// (the CUDA context and cuBLAS's workspace too). The anchor is
// testdata/peft_anchor.py: PyTorch + PEFT with gradient checkpointing on
// the same shapes on the same machine.
//
// $AGEMEM_PAPER_SHAPES (default qwen2.5-7b-shape,qwen3-4b-shape),
// $AGEMEM_PAPER_K (8), $AGEMEM_PAPER_CTX (8192), $AGEMEM_PAPER_RESP (2048),
// $AGEMEM_PAPER_BASE (bf16, or q8_0: model.train_dtype's 8-bit base),
// $AGEMEM_PAPER_LIMIT_GIB (24: the allocator's limit, the paper's card).
func BenchmarkCUDAPaperStep(b *testing.B) {
	g := testkit.GPU(b)
	k, ctx, resp := envInt("AGEMEM_PAPER_K", 8), envInt("AGEMEM_PAPER_CTX", 8192), envInt("AGEMEM_PAPER_RESP", 2048)
	for _, shape := range strings.Split(envStr("AGEMEM_PAPER_SHAPES", "qwen2.5-7b-shape,qwen3-4b-shape"), ",") {
		b.Run(shape, func(b *testing.B) {
			cfg, ok := qwen.Presets[shape]
			if !ok {
				b.Fatalf("no preset %q", shape)
			}
			t0 := time.Now()
			w, err := newWeights[float32](cfg, qwen.RandomBF16(cfg, 1), false)
			if err != nil {
				b.Fatal(err)
			}
			modules, shapeOf := cfg.Linears()
			a, err := lora.New(lora.Options{R: 16, Alpha: 32, Dropout: 0.05, TargetModules: qwen.LoRATargets}.Config(""), modules, shapeOf, 1, false)
			if err != nil {
				b.Fatal(err)
			}
			if err := w.AttachLoRA(a); err != nil {
				b.Fatal(err)
			}
			params := 0
			for _, nv := range w.Trainable() {
				params += len(nv.V.Val)
			}
			g.BF16 = true
			// The paper's card: the allocator keeps to its 24 GiB
			// (collecting and freeing cache where it must), so the step's
			// speed is what such a card would allow and its peak says
			// whether it fits ($AGEMEM_PAPER_LIMIT_GIB to change).
			g.SetMemoryLimit(uint64(envInt("AGEMEM_PAPER_LIMIT_GIB", 24)) << 30)
			defer func() { g.BF16 = false; g.SetMemoryLimit(0) }()
			g.EmptyCache() // the last shape's blocks are not this one's peak
			g.ResetPeak()
			base := BaseBF16
			if envStr("AGEMEM_PAPER_BASE", "bf16") == "q8_0" {
				base = BaseQ8
			}
			d := NewReplica(g, w, base)
			w = nil
			runtime.GC()
			g.Sync()
			b.Logf("%s: weights drawn and uploaded in %s, %d LoRA parameters (r %d), %.2f GiB held", shape, time.Since(t0).Round(time.Second), params, a.Config.R, gib(g.PeakBytes()))

			o := TrainOptions{Recompute: true, Dropout: true, Seed: 1}
			rollout := func(i int) (Batch, kernels.Tensor) {
				ids, loss := make([]int, ctx+resp), make([]bool, ctx+resp)
				for j := range ids {
					ids[j] = (j*7919 + i*104729) % cfg.VocabSize
					loss[j] = j >= ctx
				}
				bt := Pack([]Sequence{{IDs: ids, Loss: loss}})
				dl := make([]float32, len(bt.LossRows))
				for j := range dl { // a GRPO coefficient: ±advantage / tokens
					dl[j] = float32(1-2*(i%2)) / float32(k*resp)
				}
				return bt, g.FromHost(dl, len(dl))
			}
			oc := optim.AdamWConfig{Beta1: 0.9, Beta2: 0.999, Eps: 1e-8, WeightDecay: 0.01}
			// Warm-up: one rollout's forward and backward (kernels compiled,
			// the allocator's cache filled), not timed. With
			// $AGEMEM_CUDA_PROFILE set, its device time by kernel is
			// printed (per-launch events would slow the timed step).
			profile := os.Getenv("AGEMEM_CUDA_PROFILE") != ""
			if profile {
				if err := g.StartProfile(); err != nil {
					b.Fatal(err)
				}
			}
			bt, dl := rollout(0)
			d.Backward(d.Forward(bt, o), dl)
			d.ZeroGrad()
			g.Sync()
			if profile {
				p, err := g.StopProfile()
				if err != nil {
					b.Fatal(err)
				}
				var sb strings.Builder
				p.Write(&sb, 30)
				b.Logf("%s: one rollout's forward and backward, device time by kernel:\n%s", shape, sb.String())
			}
			var elapsed time.Duration
			s0 := g.AllocStats()
			for b.Loop() {
				t0 := time.Now()
				for i := range k {
					bt, dl := rollout(i)
					acts := d.Forward(bt, o)
					if i == 0 {
						g.Sync()
						b.Logf("%s: one rollout's forward %s", shape, time.Since(t0).Round(time.Millisecond))
					}
					d.Backward(acts, dl)
					if i == 0 {
						g.Sync()
						b.Logf("%s: and its backward (recomputing) %s, %.2f GiB peak (%.2f in tensors)", shape, time.Since(t0).Round(time.Millisecond), gib(g.PeakBytes()), gib(g.PeakLiveBytes()))
					}
				}
				d.Step(oc, 1, 1e-5, 1, nil)
				d.ZeroGrad()
				g.Sync()
				elapsed += time.Since(t0)
			}
			s1 := g.AllocStats()
			b.Logf("%s: the allocator over %d step(s): %d collections started, %d reclaims at the limit, %d cuMemAlloc and %d cuMemFree calls, %s in the driver",
				shape, b.N, s1.Collections-s0.Collections, s1.Reclaims-s0.Reclaims, s1.DriverAllocs-s0.DriverAllocs, s1.DriverFrees-s0.DriverFrees, (s1.DriverTime - s0.DriverTime).Round(time.Millisecond))
			free, total := g.MemInfo()
			tps := float64(k*(ctx+resp)*b.N) / elapsed.Seconds()
			b.ReportMetric(tps, "update_tok/s")
			b.ReportMetric(gib(g.PeakBytes()), "peak_GiB")
			b.ReportMetric(gib(g.PeakLiveBytes()), "live_peak_GiB")
			b.ReportMetric(gib(total-free), "device_used_GiB")
			b.ReportMetric(elapsed.Seconds()/float64(b.N), "s/step")
		})
	}
}

func gib(n uint64) float64 { return float64(n) / (1 << 30) }

func envStr(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

func envInt(name string, def int) int {
	if v, err := strconv.Atoi(os.Getenv(name)); err == nil && v > 0 {
		return v
	}
	return def
}
