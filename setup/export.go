package setup

import (
	"context"

	"github.com/agemem/agemem/llm/ollama"
	"github.com/agemem/agemem/memtools"
	"github.com/agemem/agemem/model/chat"
	"github.com/agemem/agemem/model/qwen"
)

// PublishOllama uploads the GGUF file exported from the checkpoint to the
// Ollama server (ollama.host) and creates model name from it, with the
// checkpoint's chat template, AgeMem's system prompt (agent.system_prompt,
// the tools offered) and a context of the agent's budgets (ollama.num_ctx
// when set) within the model's positions. It returns the server's host.
func PublishOllama(ctx context.Context, cfg Config, checkpoint, file, name string, progress func(string)) (string, error) {
	c, err := cfg.Ollama.Connect()
	if err != nil {
		return "", err
	}
	system, err := memtools.SystemPromptWith(cfg.Agent.SystemPrompt, cfg.Tools.Offered())
	if err != nil {
		return "", err
	}
	mt, err := qwen.LoadConfig(checkpoint)
	if err != nil {
		return "", err
	}
	family, err := chat.Detect(checkpoint, mt.ModelType)
	if err != nil {
		return "", err
	}
	numCtx := cfg.Agent.ContextBudget + cfg.Agent.ResponseBudget
	if cfg.Ollama.NumCtx > 0 {
		numCtx = cfg.Ollama.NumCtx
	}
	if mt.MaxPositions > 0 {
		numCtx = min(numCtx, mt.MaxPositions)
	}
	err = c.Publish(ctx, file, name, ollama.PublishOptions{System: system, Chat: family, Parameters: map[string]any{"num_ctx": numCtx}, Progress: progress})
	return c.Host(), err
}
