// Package roles builds, from the config, the models that play the
// runtime's supporting roles: the embedder enc(.) (feature hashing, a
// BERT-family encoder, or an Ollama model), the summariser and the LLM
// judges (Ollama models), so that every command wires them the same way.
package roles

import (
	"context"
	"fmt"
	"os"
	"sync"

	"github.com/agemem/agemem/config"
	"github.com/agemem/agemem/embed"
	"github.com/agemem/agemem/kernels"
	"github.com/agemem/agemem/kernels/device"
	"github.com/agemem/agemem/memtools"
	"github.com/agemem/agemem/memtools/ltm"
	"github.com/agemem/agemem/model/bert"
	"github.com/agemem/agemem/ollama"
	"github.com/agemem/agemem/rl/reward"
)

// Embedder is embed.backend: hashing, encoder (embed.path) or ollama
// (embed.model). An encoder or Ollama model is loaded (and probed) here,
// so a missing model fails at start-up.
func Embedder(ctx context.Context, cfg config.Config) (embed.Embedder, error) {
	e := cfg.Embed
	switch e.Backend {
	case "encoder":
		be, err := device.Open(e.Device, os.Stderr)
		if err != nil {
			return nil, fmt.Errorf("embed.device: %w", err)
		}
		enc, err := bert.LoadEncoder(e.Path, e.Pooling, e.BatchTokens, be)
		if err != nil {
			return nil, fmt.Errorf("embed.path: %w", err)
		}
		return enc, nil
	case "ollama":
		c, err := ollama.FromConfig(cfg)
		if err != nil {
			return nil, err
		}
		oe, err := ollama.NewEmbedder(ctx, c, e.Model)
		if err != nil {
			return nil, fmt.Errorf("embed.model: %w", err)
		}
		oe.KeepAlive = cfg.Ollama.KeepAlive
		return oe, nil
	}
	return embed.NewHashing(e.Dim, e.CharNgrams), nil
}

// StoreOptions are the SQLite memory store's options: memory.sync, and
// embed.device for the top-k of large namespaces, opened when the first
// one needs it (a GPU only: the CPU's own scan beats a CPU top-k kernel).
func StoreOptions(cfg config.Config) ltm.SQLiteOptions {
	var (
		once sync.Once
		be   kernels.TopKer
	)
	return ltm.SQLiteOptions{
		SyncFull: cfg.Memory.Sync == "full",
		Device: func() kernels.TopKer {
			once.Do(func() {
				d, err := device.Open(cfg.Embed.Device, os.Stderr)
				if err != nil {
					fmt.Fprintf(os.Stderr, "embed.device: %v; memory top-k stays on the CPU\n", err)
					return
				}
				if t, ok := d.(kernels.TopKer); ok && d.Name() != "cpu" {
					be = t
				}
			})
			return be
		},
	}
}

// Helpers are the runtime's embedder and summariser when the config asks
// for more than the built-in ones (hashing, extractive); a nil field keeps
// the built-in one.
type Helpers struct {
	Embedder   embed.Embedder
	Summarizer memtools.Summarizer
}

// NewHelpers loads the configured helpers once, for every runtime of a run.
func NewHelpers(ctx context.Context, cfg config.Config) (Helpers, error) {
	var h Helpers
	if cfg.Embed.Backend != "hashing" {
		var err error
		if h.Embedder, err = Embedder(ctx, cfg); err != nil {
			return h, err
		}
	}
	if cfg.Tools.Summarizer == "ollama" {
		c, err := ollama.FromConfig(cfg)
		if err != nil {
			return h, err
		}
		if err := c.HasModel(ctx, cfg.Tools.SummarizerModel); err != nil {
			return h, fmt.Errorf("tools.summarizer_model: %w", err)
		}
		p := ollama.PolicyFromConfig(c, cfg, cfg.Tools.SummarizerModel, ollama.Chat)
		p.Temperature = 0
		h.Summarizer = memtools.PolicySummarizer{Policy: p}
	}
	return h, nil
}

// Apply puts the helpers into a runtime built with the built-in ones.
func (h Helpers) Apply(rt *memtools.Runtime) *memtools.Runtime {
	if h.Embedder != nil {
		rt.Embedder = h.Embedder
	}
	if h.Summarizer != nil {
		rt.Summarizer = h.Summarizer
	}
	return rt
}

// Judges sets in j the judges the reward section puts on Ollama
// (reward.judge_model, temperature 0), and gives the cosine relevance judge
// the configured embedder; the others stay as they are.
func Judges(ctx context.Context, cfg config.Config, h Helpers, j *reward.Judges) error {
	if cr, ok := j.Relevance.(reward.CosineRelevance); ok && h.Embedder != nil {
		cr.Embedder = h.Embedder
		j.Relevance = cr
	}
	r := cfg.Reward
	if r.Judge != "ollama" && r.StorageJudge != "ollama" && r.RelevanceJudge != "ollama" {
		return nil
	}
	c, err := ollama.FromConfig(cfg)
	if err != nil {
		return err
	}
	if err := c.HasModel(ctx, r.JudgeModel); err != nil {
		return fmt.Errorf("reward.judge_model: %w", err)
	}
	p := ollama.PolicyFromConfig(c, cfg, r.JudgeModel, ollama.Chat)
	p.Temperature, p.MaxTokens = 0, 64
	if r.Judge == "ollama" {
		j.Task = reward.LLMJudge{Policy: p}
	}
	if r.StorageJudge == "ollama" {
		j.Storage = reward.LLMStorage{Policy: p}
	}
	if r.RelevanceJudge == "ollama" {
		j.Relevance = reward.LLMRelevance{Policy: p}
	}
	return nil
}
