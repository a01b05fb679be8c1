package ollama

import (
	"context"
	"fmt"
	"time"

	"github.com/agemem/agemem/internal/valid"
	"github.com/agemem/agemem/llm"
	"github.com/agemem/agemem/model/chat"
)

// Config is the Ollama server behind every role set to "ollama" and how a
// policy talks to it (config section "ollama").
type Config struct {
	// Host is the server ("" reads OLLAMA_HOST, then 127.0.0.1:11434).
	Host string `yaml:"host"`
	// Format is how an AgeMem policy is driven: raw (prompts rendered here
	// with the Qwen template, raw generation: for policies trained here) or
	// tools (Ollama's chat API with the memory tools as native tools, the
	// calls mapped back to the AgeMem format: for models such as qwen3:4b).
	Format string `yaml:"format"`
	// NumCtx is the context Ollama allocates (0: agent.context_budget +
	// agent.response_budget, so every prompt the budget allows fits).
	NumCtx int `yaml:"num_ctx"`
	// KeepAlive keeps a model loaded between requests.
	KeepAlive time.Duration `yaml:"keep_alive"`
	// Think asks a thinking model to think in tools format: default, on, off.
	Think string `yaml:"think"`
}

// DefaultConfig drives models raw, kept loaded for five minutes.
func DefaultConfig() Config {
	return Config{Format: "raw", KeepAlive: 5 * time.Minute, Think: "default"}
}

// Validate checks every key.
func (c Config) Validate() error {
	var e valid.Errors
	e.OneOf("format", c.Format, "raw", "tools")
	e.OneOf("think", c.Think, "default", "on", "off")
	e.AtLeast("num_ctx", c.NumCtx, 0)
	if c.KeepAlive < 0 {
		e.Add("keep_alive", "%v must not be negative", c.KeepAlive)
	}
	return e.Err()
}

// Connect is a client of the configured server.
func (c Config) Connect() (*Client, error) {
	cl, err := New(c.Host, nil)
	if err != nil {
		return nil, fmt.Errorf("ollama.host: %w", err)
	}
	return cl, nil
}

// ChatModel is name on the server, raw or through the chat API, with the
// config's context (num_ctx 0: the prompt and response budgets together,
// so every prompt the agent's budget allows fits) and keep-alive, and
// sampling at temperature 1 up to the response budget, as policies are
// trained (callers set their own).
func (c Config) ChatModel(cl *Client, name string, raw bool, promptBudget, responseBudget int) *Model {
	numCtx := c.NumCtx
	if numCtx == 0 {
		numCtx = promptBudget + responseBudget
	}
	m := &Model{Client: cl, Name: name, Raw: raw, NumCtx: numCtx, KeepAlive: c.KeepAlive,
		Sampling: llm.Sampling{Temperature: 1, TopP: 1, MaxTokens: responseBudget}}
	if c.Think != "default" && c.Think != "" {
		on := c.Think == "on"
		m.Think = &on
	}
	return m
}

// Described is ChatModel for name as the server describes it: its chat family
// (Describe) and, when ollama.num_ctx is not set, a context of the budgets
// capped at the model's own length.
func (c Config) Described(ctx context.Context, cl *Client, name string, raw bool, promptBudget, responseBudget int) (*Model, error) {
	d, err := cl.Describe(ctx, name)
	if err != nil {
		return nil, err
	}
	m := c.ChatModel(cl, name, raw, promptBudget, responseBudget)
	m.Template = d.Template
	if c.NumCtx == 0 && d.ContextLength > 0 {
		m.NumCtx = min(m.NumCtx, d.ContextLength)
	}
	return m, nil
}

// TemplateFor is the chat template a raw-format policy renders with:
// Qwen2.5's for qwen2-family models, Qwen3's otherwise.
func TemplateFor(modelType string) chat.Template {
	if modelType == "qwen2" {
		return chat.Qwen25
	}
	return chat.Qwen3
}
