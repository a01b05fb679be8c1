package rl_test

import (
	"testing"
	"time"

	"github.com/agemem/agemem/model/qwen"
	"github.com/agemem/agemem/model/safetensors"
)

// BenchmarkGRPOStep runs whole GRPO steps (rollouts of the full three
// stages, rewards, update) for the tiny default's shape and the
// Qwen2.5-0.5B shape, random weights, and reports rollout tokens/s (every
// call's prompt tokens plus the tokens generated) with the prefix cache
// and with every call re-prefilling its context (rl.prefix_cache false),
// beside the anchor of the same engine's plain batched forward in the same
// run, and the training step time.
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
			// The tiny default's episode: every stage, a few calls a turn.
			c.Agent.MaxSteps, c.Agent.ResponseBudget = 2, s.respTok
			c.Episode.Stage1MaxTurns, c.Episode.Stage2MaxTurns = 16, 4
			c.RL.K, c.RL.BatchTasks, c.RL.Steps, c.RL.SaveEvery = s.k, s.b, b.N, 0
			rate := map[bool]float64{}
			var update, computed float64
			for _, cached := range []bool{true, false} {
				c.RL.PrefixCache = cached
				c.RL.Out = b.TempDir()
				res, err := run(c, "")
				if err != nil {
					b.Fatal(err)
				}
				var roll, total, comp, tokens float64
				for _, st := range res.Steps {
					roll += st.RolloutSeconds
					total += st.Seconds
					tokens += float64(st.RolloutTokens)
					comp += float64(st.ComputedTokens)
				}
				rate[cached] = tokens / roll
				if cached {
					update, computed = (total-roll)/float64(len(res.Steps)), comp/tokens
				}
			}
			m, err := qwen.Load(c.RL.Init)
			if err != nil {
				b.Fatal(err)
			}
			defer m.Close()
			anchor := forwardRate(b, m)
			b.ReportMetric(rate[true], "rollout-tokens/s")
			b.ReportMetric(rate[false], "reprefill-tokens/s")
			b.ReportMetric(update, "train-s/step")
			b.Logf("%s: rollouts %.0f tokens/s with the prefix cache (%.0f%% of the tokens computed), %.0f re-prefilling every call (%.2fx); the engine's batched forward %.0f tokens/s (ratios %.2f, %.2f); update %.2f s/step",
				s.name, rate[true], 100*computed, rate[false], rate[true]/rate[false], anchor, rate[true]/anchor, rate[false]/anchor, update)
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
