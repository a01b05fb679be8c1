package rollout

import (
	"github.com/agemem/agemem/config"
	"github.com/agemem/agemem/embed"
	"github.com/agemem/agemem/env"
	"github.com/agemem/agemem/memtools"
	"github.com/agemem/agemem/memtools/ltm"
	"github.com/agemem/agemem/memtools/stm"
)

// NewRuntime builds a fresh runtime from the config: an in-memory LTM (a
// rollout's M, seeded ids), an empty context counted with tok (the model's
// tokenizer; nil counts words), the configured embedder and extractive
// summariser.
func NewRuntime(cfg config.Config, seed uint64, tok stm.Tokenizer) *memtools.Runtime {
	if tok == nil {
		tok = stm.Words{}
	}
	return &memtools.Runtime{
		Store:      ltm.NewMemory(seed),
		Context:    stm.New(tok),
		Embedder:   embed.NewHashing(cfg.Embed.Dim, cfg.Embed.CharNgrams),
		Summarizer: memtools.Extractive{MaxTokens: cfg.Tools.SummaryMaxTokens, Tokenizer: tok},
		Options: memtools.Options{
			TopK: cfg.Tools.RetrieveTopK, MaxTopK: cfg.Tools.MaxTopK, FilterThreshold: cfg.Tools.FilterThreshold,
		},
	}
}

// EpisodeConfig is the episode shape of the config's episode and agent
// sections.
func EpisodeConfig(cfg config.Config) env.EpisodeConfig {
	sys, _ := memtools.SystemPromptFor(cfg.Agent.SystemPrompt) // validated with the config
	return env.EpisodeConfig{
		SystemPrompt:   sys,
		Stage1MaxTurns: cfg.Episode.Stage1MaxTurns,
		Stage2MaxTurns: cfg.Episode.Stage2MaxTurns,
		AutoRetrieveK:  cfg.Episode.AutoRetrieveK,
		Limits:         memtools.Limits{MaxSteps: cfg.Agent.MaxSteps, ContextBudget: cfg.Agent.ContextBudget},
	}
}
