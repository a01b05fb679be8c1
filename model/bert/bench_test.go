package bert

import (
	"context"
	"fmt"
	"math/rand/v2"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/agemem/agemem/kernels"
	"github.com/agemem/agemem/kernels/device"
)

// BenchmarkEncoder embeds 64 sentences of 16 tokens with a BERT-base-shaped
// encoder (768 hidden, 12 layers, random weights) and with the tiny demo
// shape, on the CPU and (when one is present) the GPU, and reports
// sentences/s and the encoder's GFLOP/s beside the GFLOP/s of the
// device's matmul on the encoder's own feed-forward shape, measured in
// the same run: the encoder cannot beat its matmuls.
func BenchmarkEncoder(b *testing.B) {
	for _, dev := range []string{"cpu", "cuda"} {
		b.Run(dev, func(b *testing.B) { benchEncoder(b, dev) })
	}
}

func benchEncoder(b *testing.B, dev string) {
	be, err := device.Open(dev, nil)
	if err != nil {
		b.Skipf("no %s device: %v", dev, err)
	}
	for _, c := range []struct {
		name string
		cfg  Config
	}{
		{"bert-base-shape", Config{ModelType: "bert", HiddenSize: 768, Layers: 12, Heads: 12, Intermediate: 3072, MaxPositions: 512}},
		{"tiny-demo-shape", Config{ModelType: "bert", HiddenSize: 128, Layers: 2, Heads: 4, Intermediate: 512, MaxPositions: 128}},
	} {
		b.Run(c.name, func(b *testing.B) {
			vocab := []string{"[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"}
			for i := range 30000 {
				vocab = append(vocab, fmt.Sprintf("w%d", i))
			}
			dir := filepath.Join(b.TempDir(), "enc")
			if err := InitRandom(dir, c.cfg, vocab, true, 1); err != nil {
				b.Fatal(err)
			}
			e, err := LoadEncoder(dir, PoolCLS, 8192, be)
			if err != nil {
				b.Fatal(err)
			}
			r := rand.New(rand.NewPCG(1, 2))
			texts := make([]string, 64)
			for i := range texts {
				words := make([]string, 14) // + [CLS], [SEP] = 16 tokens
				for j := range words {
					words[j] = fmt.Sprintf("w%d", r.IntN(30000))
				}
				texts[i] = strings.Join(words, " ")
			}
			tokens := 64 * 16
			h, in := c.cfg.HiddenSize, c.cfg.Intermediate
			// Multiply-adds per token: 4 h² (q, k, v, out) + 2 h·in (FFN)
			// per layer, plus attention over 16 keys: 2·16·h.
			flops := float64(tokens) * float64(c.cfg.Layers) * 2 * (4*float64(h*h) + 2*float64(h*in) + 2*16*float64(h))
			// The anchor: the feed-forward matmul at the same token count.
			x, w, y := be.Zeros(tokens, h), be.Upload(kernels.Weight{Rows: in, Cols: h, F32: make([]float32, in*h)}), be.Zeros(tokens, in)
			be.MatMul(y, x, w, nil)
			be.ToHost(be.Rows(y, 0, 1)) // waits for the device
			t0 := time.Now()
			for range 10 {
				be.MatMul(y, x, w, nil)
			}
			be.ToHost(be.Rows(y, 0, 1))
			mmGF := 10 * 2 * float64(tokens*h*in) / time.Since(t0).Seconds() / 1e9
			if _, err := e.Embed(context.Background(), texts); err != nil { // upload, warm up
				b.Fatal(err)
			}
			b.ResetTimer()
			start := time.Now()
			for b.Loop() {
				if _, err := e.Embed(context.Background(), texts); err != nil {
					b.Fatal(err)
				}
			}
			sec := time.Since(start).Seconds() / float64(b.N)
			b.ReportMetric(64/sec, "sentences/s")
			b.ReportMetric(flops/sec/1e9, "GFLOP/s")
			b.ReportMetric(mmGF, "matmul_GFLOP/s")
			b.ReportMetric(flops/sec/1e9/mmGF, "ratio")
		})
	}
}
