package ollama

import (
	"context"
	"fmt"

	"github.com/agemem/agemem/config"
	"github.com/agemem/agemem/memtools"
	"github.com/agemem/agemem/model/qwen"
	"github.com/agemem/agemem/rl/reward"
)

// FromConfig connects to the server of the ollama section.
func FromConfig(cfg config.Config) (*Client, error) {
	c, err := New(cfg.Ollama.Host, nil)
	if err != nil {
		return nil, fmt.Errorf("ollama.host: %w", err)
	}
	return c, nil
}

// PolicyFromConfig is model driven in format f with the config's context,
// response budget and keep-alive (sampling at temperature 1, as the policy
// was trained; callers set their own).
func PolicyFromConfig(c *Client, cfg config.Config, model string, f Format) *Policy {
	numCtx := cfg.Ollama.NumCtx
	if numCtx == 0 {
		numCtx = cfg.Agent.ContextBudget + cfg.Agent.ResponseBudget
	}
	p := &Policy{Client: c, Model: model, Format: f, NumCtx: numCtx, MaxTokens: cfg.Agent.ResponseBudget,
		Temperature: 1, TopP: 1, KeepAlive: cfg.Ollama.KeepAlive}
	if cfg.Ollama.Think != "default" && cfg.Ollama.Think != "" {
		on := cfg.Ollama.Think == "on"
		p.Think = &on
	}
	return p
}

// Helpers are the runtime's embedder and summariser when the config puts
// them on Ollama; a nil field means the built-in one.
type Helpers struct {
	Embedder   *Embedder
	Summarizer memtools.Summarizer
}

// HelpersFromConfig builds the helpers the config assigns to Ollama and
// checks that their models are there, so a run fails at start-up, not at
// its first tool call.
func HelpersFromConfig(ctx context.Context, cfg config.Config) (Helpers, error) {
	var h Helpers
	if cfg.Embed.Backend != "ollama" && cfg.Tools.Summarizer != "ollama" {
		return h, nil
	}
	c, err := FromConfig(cfg)
	if err != nil {
		return h, err
	}
	if h.Embedder, err = EmbedderFromConfig(ctx, cfg); err != nil {
		return h, err
	}
	if cfg.Tools.Summarizer == "ollama" {
		if err := c.HasModel(ctx, cfg.Tools.SummarizerModel); err != nil {
			return h, fmt.Errorf("tools.summarizer_model: %w", err)
		}
		p := PolicyFromConfig(c, cfg, cfg.Tools.SummarizerModel, Chat)
		p.Temperature = 0
		h.Summarizer = memtools.PolicySummarizer{Policy: p}
	}
	return h, nil
}

// EmbedderFromConfig is embed.model on the ollama server when
// embed.backend is ollama, else nil.
func EmbedderFromConfig(ctx context.Context, cfg config.Config) (*Embedder, error) {
	if cfg.Embed.Backend != "ollama" {
		return nil, nil
	}
	c, err := FromConfig(cfg)
	if err != nil {
		return nil, err
	}
	e, err := NewEmbedder(ctx, c, cfg.Embed.Model)
	if err != nil {
		return nil, fmt.Errorf("embed.model: %w", err)
	}
	e.KeepAlive = cfg.Ollama.KeepAlive
	return e, nil
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

// JudgesFromConfig builds the judges the reward section puts on Ollama
// (reward.judge_model, temperature 0) into j, leaving the others as they are.
func JudgesFromConfig(ctx context.Context, cfg config.Config, j *reward.Judges) error {
	r := cfg.Reward
	if r.Judge != "ollama" && r.StorageJudge != "ollama" && r.RelevanceJudge != "ollama" {
		return nil
	}
	c, err := FromConfig(cfg)
	if err != nil {
		return err
	}
	if err := c.HasModel(ctx, r.JudgeModel); err != nil {
		return fmt.Errorf("reward.judge_model: %w", err)
	}
	p := PolicyFromConfig(c, cfg, r.JudgeModel, Chat)
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

// TemplateFor is the chat template a raw-format policy renders with:
// Qwen2.5's for qwen2-family models, Qwen3's otherwise.
func TemplateFor(modelType string) qwen.Template {
	if modelType == "qwen2" {
		return qwen.TemplateQwen25
	}
	return qwen.TemplateQwen3
}
