package engine

import (
	"context"
	"hash/fnv"

	"github.com/agemem/agemem/agent"
	"github.com/agemem/agemem/model/chat"
)

// ChatModel is an agent.Model on the native engine: the conversation and
// the tools rendered by the model's own chat template (the Qwen tools
// section, assistant tool_calls as <tool_call> blocks, tool results as
// <tool_response>), exactly as transformers renders them, and the reply's
// <tool_call> blocks parsed back into calls (agent.ParseReply).
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
	cm, tools, err := agent.ChatMessages(msgs, specs)
	if err != nil {
		return agent.Reply{}, err
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
	return agent.Reply{Message: agent.ParseReply(c.Text), PromptTokens: c.PromptTokens, CompletionTokens: c.CompletionTokens}, nil
}
