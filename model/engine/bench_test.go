package engine

import (
	"testing"
	"time"

	"github.com/agemem/agemem/kernels"
	"github.com/agemem/agemem/kernels/cpu"
	"github.com/agemem/agemem/model/qwen"
	"github.com/agemem/agemem/model/safetensors"
)

// BenchmarkGenerateKV decodes a GRPO group's rollouts (16 prompts of 300
// tokens sharing a 240-token system prompt and context, 96 tokens each) on
// the tiny default's shape, four ways: contiguous caches (the anchor, no
// budget), paged with room for all (attention reads the blocks where they
// lie: the CPU backend's kernels.PagedAttender), the same with the rows
// gathered into contiguous tensors first (what a backend without a
// block-table kernel does), and paged under a budget of half what the
// group fills (sequences wait and are recomputed). It reports tokens/s of each beside the anchor and the
// KV positions held at the peak beside the positions a cache reserved at
// its upper bound (prompt plus max tokens for every rollout) would hold.
func BenchmarkGenerateKV(b *testing.B) {
	cfg := qwen.Config{ModelType: "qwen2", HiddenSize: 96, Layers: 3, Heads: 4, KVHeads: 2, HeadDim: 24, Intermediate: 256,
		RMSNormEps: 1e-6, RopeTheta: 1e4, TieEmbeddings: true, VocabSize: 2048, MaxPositions: 4096}
	weights := qwen.MapOf(qwen.RandomTensors(cfg, safetensors.F32, 1))
	m, err := qwen.FromTensors(cpu.New(), cfg, weights)
	if err != nil {
		b.Fatal(err)
	}
	// The same model on a backend without PagedAttention.
	gathered, err := qwen.FromTensors(struct{ kernels.Backend }{cpu.New()}, cfg, weights)
	if err != nil {
		b.Fatal(err)
	}
	const n, promptLen, shared, maxTok = 16, 300, 240, 96
	prompts := make([][]int, n)
	for i := range prompts {
		p := make([]int, promptLen)
		for j := range p {
			p[j] = (j*131 + 7) % cfg.VocabSize
			if j >= shared {
				p[j] = (i*977 + j*31) % cfg.VocabSize
			}
		}
		prompts[i] = p
	}
	s := Sampling{Temperature: 1, Seed: 1, MaxTokens: maxTok}
	fills := (shared + n*(promptLen-shared+maxTok)) // positions the group's tokens take, the prefix once
	upper := n * (promptLen + maxTok)
	run := func(m *qwen.Model, budget int) (float64, KVStats) {
		t0 := time.Now()
		var st KVStats
		for range b.N {
			var err error
			e := New(m, nil, Options{KVBudget: budget, PrefixBudget: -1})
			_, err = batch(e, prompts, s)
			st = e.KV()
			e.Close()
			if err != nil {
				b.Fatal(err)
			}
		}
		return float64(b.N*n*(promptLen+maxTok)) / time.Since(t0).Seconds(), st
	}
	anchor, _ := run(m, 0)
	roomy, rs := run(m, upper)
	gather, _ := run(gathered, upper)
	tight, ts := run(m, fills/2)
	b.ReportMetric(anchor, "contiguous-tokens/s")
	b.ReportMetric(roomy, "paged-tokens/s")
	b.ReportMetric(gather, "paged-gathered-tokens/s")
	b.ReportMetric(tight, "paged-half-tokens/s")
	b.Logf("contiguous %.0f tokens/s (anchor); paged, room for all: %.0f (%.2fx), peak %d positions; the same gathering rows first: %.0f (%.2fx); paged under half the group (%d positions): %.0f (%.2fx), peak %d, %d recomputed; the group fills %d positions, reserved at the upper bound %d",
		anchor, roomy, roomy/anchor, rs.Peak*KVBlock, gather, gather/anchor, fills/2, tight, tight/anchor, ts.Peak*KVBlock, ts.Preempted, fills, upper)
}
