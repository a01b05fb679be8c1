package decode

import (
	"context"
	"encoding/json"
	"fmt"
	"hash/fnv"

	"github.com/agemem/agemem/agent"
	"github.com/agemem/agemem/model/chat"
)

// ChatModel is an agent.Model on the native engine: the conversation and
// the tools rendered by the model's own chat template (the Qwen tools
// section, assistant tool_calls as <tool_call> blocks, tool results as
// <tool_response>), exactly as transformers renders them, and the reply's
// <tool_call> blocks parsed back into calls. A block the model breaks
// becomes a call the loop refuses with the parser's reason, so the model
// reads what was wrong.
//
// With a Scheduler, concurrent calls (many agents at once) decode in shared
// steps (continuous batching); each call samples with a seed drawn from its
// prompt, so an agent's replies do not depend on what it was batched with.
type ChatModel struct {
	Generator *Generator
	Scheduler *Scheduler
}

// Chat implements agent.Model.
func (m ChatModel) Chat(ctx context.Context, msgs []agent.Message, specs []agent.Spec) (agent.Reply, error) {
	p := m.Generator
	cm := make([]chat.Message, len(msgs))
	for i, am := range msgs {
		cm[i] = chat.Message{Role: am.Role, Content: am.Content}
		for _, c := range am.ToolCalls {
			var tc chat.ToolCall
			tc.Function.Name = c.Name
			tc.Function.Arguments = json.RawMessage(c.Arguments)
			if !json.Valid(tc.Function.Arguments) {
				// Render it as the text the model wrote, not broken JSON.
				quoted, _ := json.Marshal(c.Arguments)
				tc.Function.Arguments = quoted
			}
			cm[i].ToolCalls = append(cm[i].ToolCalls, tc)
		}
	}
	tools := make([]json.RawMessage, len(specs))
	for i, s := range specs {
		raw, err := json.Marshal(map[string]any{"type": "function", "function": map[string]any{
			"name": s.Name, "description": s.Description, "parameters": s.Parameters}})
		if err != nil {
			return agent.Reply{}, fmt.Errorf("tool %q: %w", s.Name, err)
		}
		tools[i] = raw
	}
	text, err := chat.Render(cm, chat.Options{Template: p.Template, Tools: tools, AddGenerationPrompt: true})
	if err != nil {
		return agent.Reply{}, err
	}
	ids := p.Tokenizer.Encode(text)
	if limit := p.promptLimit(p.MaxPromptTokens, p.Sampling.MaxTokens); limit > 0 && len(ids) > limit {
		return agent.Reply{}, &PromptTooLongError{Tokens: len(ids), Limit: limit}
	}
	var gen Generation
	if m.Scheduler != nil {
		s := p.Sampling
		h := fnv.New64a()
		h.Write([]byte(text))
		s.Seed ^= h.Sum64()
		if gen, err = m.Scheduler.Generate(ctx, ids, s, nil); err != nil {
			return agent.Reply{}, err
		}
	} else {
		gens, err := p.Prefixes.Generate(ctx, p.Model, [][]int{ids}, p.Sampling, p.Tokenizer)
		if err != nil {
			return agent.Reply{}, err
		}
		gen = gens[0]
	}
	c := p.completion(ids, gen, p.Sampling.StopIDs)
	content, calls := chat.ParseToolCalls(c.Text)
	out := agent.Message{Role: "assistant", Content: content}
	for _, pc := range calls {
		call := agent.ToolCall{Name: pc.Name, Arguments: string(pc.Arguments)}
		if pc.Err != "" {
			call = agent.ToolCall{Name: pc.Name, Arguments: pc.Raw, Invalid: pc.Err}
		}
		out.ToolCalls = append(out.ToolCalls, call)
	}
	return agent.Reply{Message: out, PromptTokens: c.PromptTokens, CompletionTokens: c.CompletionTokens}, nil
}
