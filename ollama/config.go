package ollama

import (
	"fmt"

	"github.com/agemem/agemem/config"
	"github.com/agemem/agemem/model/chat"
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

// TemplateFor is the chat template a raw-format policy renders with:
// Qwen2.5's for qwen2-family models, Qwen3's otherwise.
func TemplateFor(modelType string) chat.Template {
	if modelType == "qwen2" {
		return chat.Qwen25
	}
	return chat.Qwen3
}
