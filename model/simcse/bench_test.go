package simcse

import (
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/agemem/agemem/kernels"
	"github.com/agemem/agemem/kernels/cpu"
	"github.com/agemem/agemem/kernels/cuda"
	"github.com/agemem/agemem/kernels/device"
	"github.com/agemem/agemem/model/bert"
	"github.com/agemem/agemem/model/optim"
)

// BenchmarkSimCSEStep times one unsupervised SimCSE step (64 sentences,
// each encoded twice under dropout 0.1 and attention dropout 0.1, 32
// tokens, mean pooling, InfoNCE, backward, AdamW) on the device path
// (bert.Trainer): the BERT-base shape on a GPU (f32, and bf16 matmuls as
// simcse.dtype bf16 runs them), beside
// testdata/simcse_anchor.py (PyTorch + transformers, the same step) that
// scripts/gpu.sh simcse runs next; the tiny demo shape on the CPU
// backend too, beside the tape (what a run without a GPU trains on).
func BenchmarkSimCSEStep(b *testing.B) {
	b.Run("tape/tiny-demo-shape", func(b *testing.B) {
		benchStep(b, nil, bert.Config{ModelType: "bert", HiddenSize: 128, Layers: 2, Heads: 4, Intermediate: 512, MaxPositions: 128})
	})
	for _, dev := range []string{"cpu", "cuda", "cuda-bf16"} {
		b.Run(dev, func(b *testing.B) {
			var be kernels.EncoderTrainer = cpu.New()
			if dev != "cpu" {
				et, err := device.OpenEncoderTrainer("cuda", dev == "cuda-bf16", nil)
				if err != nil {
					b.Skipf("no GPU: %v", err)
				}
				be = et
			}
			for _, c := range []struct {
				name string
				cfg  bert.Config
			}{
				{"bert-base-shape", bert.Config{ModelType: "bert", HiddenSize: 768, Layers: 12, Heads: 12, Intermediate: 3072, MaxPositions: 512}},
				{"tiny-demo-shape", bert.Config{ModelType: "bert", HiddenSize: 128, Layers: 2, Heads: 4, Intermediate: 512, MaxPositions: 128}},
			} {
				if dev == "cpu" && c.cfg.HiddenSize > 128 {
					continue // seconds a step on two cores
				}
				b.Run(c.name, func(b *testing.B) { benchStep(b, be, c.cfg) })
			}
		})
	}
}

func benchStep(b *testing.B, be kernels.EncoderTrainer, cfg bert.Config) {
	vocab := []string{"[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"}
	for i := range 30000 {
		vocab = append(vocab, fmt.Sprintf("w%d", i))
	}
	dir := filepath.Join(b.TempDir(), "enc")
	if err := bert.InitRandom(dir, cfg, vocab, true, 1); err != nil {
		b.Fatal(err)
	}
	w, err := bert.Load[float32](dir, true)
	if err != nil {
		b.Fatal(err)
	}
	const sentences, tokens = 64, 32
	r := rand.New(rand.NewPCG(1, 2))
	seqs := make([][]int, 2*sentences)
	for i := range sentences {
		s := make([]int, tokens)
		for j := range s {
			s[j] = 5 + r.IntN(30000)
		}
		seqs[i], seqs[sentences+i] = s, s
	}
	opt := optim.DefaultConfig()
	hostOpt := optim.NewAdamW(opt.AdamW())
	step := func(n int) {
		batch := make([]Example, sentences)
		for i := range batch {
			batch[i] = Example{Anchor: fmt.Sprint(i), Positive: fmt.Sprint(i)}
		}
		encode := func(s string) []int {
			var i int
			fmt.Sscan(s, &i)
			return seqs[i]
		}
		o := Options{Dropout: 0.1, AttnDropout: 0.1, Pooling: bert.PoolMean, Temperature: 0.05}
		if _, err := trainStep(w, batch, encode, o, uint64(n)); err != nil {
			b.Fatal(err)
		}
		// The host optimiser, as Train runs it.
		var params []optim.Param
		for _, nv := range w.Named {
			params = append(params, optim.Param{Name: nv.Name, W: nv.V.Val, G: nv.V.Grad, Decay: decays(nv.Name)})
		}
		optim.ClipGlobalNorm(params, opt.ClipNorm)
		if err := hostOpt.Step(params, 1e-5); err != nil {
			b.Fatal(err)
		}
		optim.ZeroGrad(params)
	}
	if be != nil {
		tr := bert.NewTrainer(be, w, decays)
		step = func(n int) {
			pooled, pass, err := tr.Forward(seqs, bert.PoolMean, 0.1, 0.1, uint64(n))
			if err != nil {
				b.Fatal(err)
			}
			_, dp := InfoNCE(pooled, len(seqs), sentences, 0.05)
			if err := pass.Backward(dp); err != nil {
				b.Fatal(err)
			}
			tr.Step(opt.AdamW(), n+1, 1e-5, opt.ClipNorm) // the norm's read back: the step has finished
		}
	}
	step(0) // upload, compile, warm the allocator
	// With $AGEMEM_CUDA_PROFILE set, a second untimed step's device time
	// by kernel is logged (per-launch events would slow the timed ones).
	if g, ok := be.(*cuda.Backend); ok && os.Getenv("AGEMEM_CUDA_PROFILE") != "" {
		if err := g.StartProfile(); err != nil {
			b.Fatal(err)
		}
		step(1)
		p, err := g.StopProfile()
		if err != nil {
			b.Fatal(err)
		}
		var sb strings.Builder
		p.Write(&sb, 25)
		b.Logf("one step's device time by kernel:\n%s", sb.String())
	}
	b.ResetTimer()
	start, n := time.Now(), 1
	for b.Loop() {
		step(n)
		n++
	}
	sec := time.Since(start).Seconds() / float64(b.N)
	b.ReportMetric(sec*1e3, "ms/step")
	b.ReportMetric(sentences/sec, "sentences/s")
}
