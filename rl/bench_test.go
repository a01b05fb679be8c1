package rl_test

import (
	"testing"
	"time"

	"github.com/agemem/agemem/model/qwen"
	"github.com/agemem/agemem/model/safetensors"
)

// BenchmarkGRPOStep runs whole GRPO steps (rollouts, rewards, update) for
// the tiny default's shape and the Qwen2.5-0.5B shape, random weights, and
// reports rollout tokens/s (prompt tokens prefilled plus tokens generated)
// beside the anchor of the same engine's plain batched forward in the
// same run, and the training step time.
func BenchmarkGRPOStep(b *testing.B) {
	for _, s := range []struct {
		name    string
		cfg     qwen.Config
		k, b    int
		respTok int
	}{
		{"tiny", qwen.Config{ModelType: "qwen3", HiddenSize: 96, Layers: 3, Heads: 4, KVHeads: 2, HeadDim: 24, Intermediate: 256,
			RMSNormEps: 1e-6, RopeTheta: 1e4, TieEmbeddings: true, MaxPositions: 4096}, 8, 2, 32},
		{"qwen2.5-0.5b-shape", qwen.Presets["qwen2.5-0.5b-shape"], 2, 1, 8},
	} {
		b.Run(s.name, func(b *testing.B) {
			c := microSetup(b)
			cfg := s.cfg
			cfg.VocabSize = max(cfg.VocabSize, 512)
			if err := qwen.InitRandom(c.RL.Init, cfg, safetensors.BF16, 1); err != nil {
				b.Fatal(err)
			}
			c.Agent.MaxSteps, c.Agent.ResponseBudget = 1, s.respTok
			c.Episode.Stage1MaxTurns, c.Episode.Stage2MaxTurns = 1, 1
			c.RL.K, c.RL.BatchTasks, c.RL.Steps, c.RL.SaveEvery = s.k, s.b, b.N, 0
			res, err := run(c, "")
			if err != nil {
				b.Fatal(err)
			}
			var roll, total float64
			tokens := 0
			for _, st := range res.Steps {
				roll += st.RolloutSeconds
				total += st.Seconds
				tokens += st.RolloutTokens
			}
			m, err := qwen.Load(c.RL.Init)
			if err != nil {
				b.Fatal(err)
			}
			defer m.Close()
			anchor := forwardRate(b, m)
			rate := float64(tokens) / roll
			b.ReportMetric(rate, "rollout-tokens/s")
			b.ReportMetric((total-roll)/float64(len(res.Steps)), "train-s/step")
			b.Logf("%s: rollouts %.0f tokens/s vs the engine's batched forward %.0f tokens/s (ratio %.2f); update %.2f s/step, whole step %.2f s",
				s.name, rate, anchor, rate/anchor, (total-roll)/float64(len(res.Steps)), total/float64(len(res.Steps)))
		})
	}
}

// forwardRate is the engine's plain throughput: 8 sequences of 64 tokens in
// one batched forward.
func forwardRate(b *testing.B, m *qwen.Model) float64 {
	var toks [][]int
	var caches []*qwen.Cache
	for i := range 8 {
		ids := make([]int, 64)
		for j := range ids {
			ids[j] = (i*64 + j) % 400
		}
		toks = append(toks, ids)
		caches = append(caches, m.NewCache(64))
	}
	t0 := time.Now()
	if _, err := m.ForwardBatch(toks, caches); err != nil {
		b.Fatal(err)
	}
	return 512 / time.Since(t0).Seconds()
}
