package engine

import (
	"context"
	"hash/fnv"
	"sync"

	"github.com/agemem/agemem/model/chat"
)

// Texter answers one-message prompts (a user turn, rendered with the
// model's chat template) on a continuous-batching scheduler, so that
// concurrent callers share decoding steps. Each call samples with a seed
// drawn from the prompt and how often it was asked before: a prompt asked
// again (Scattershot's probes) gets a new sample, and a run gives the same
// text however its calls were batched.
type Texter struct {
	g     *Generator
	sc    *Scheduler
	mu    sync.Mutex
	asked map[uint64]uint64
}

// NewTexter starts a scheduler of at most maxBatch sequences for g.
func NewTexter(g *Generator, maxBatch int) *Texter {
	return &Texter{g: g, sc: NewScheduler(g.Model, g.Tokenizer, SchedulerOptions{MaxBatch: maxBatch}), asked: map[uint64]uint64{}}
}

// Close stops the scheduler.
func (t *Texter) Close() { t.sc.Close() }

// Scheduler is the texter's scheduler, for a ChatModel of the same
// generator to decode on (one scheduler per model: their calls batch).
func (t *Texter) Scheduler() *Scheduler { return t.sc }

// Generate answers prompt at temperature (0: greedy).
func (t *Texter) Generate(ctx context.Context, prompt string, temperature float64) (string, error) {
	p := t.g
	text, err := chat.Render([]chat.Message{{Role: "user", Content: prompt}}, chat.Options{Template: p.Template, AddGenerationPrompt: true})
	if err != nil {
		return "", err
	}
	ids := p.Tokenizer.Encode(text)
	if limit := p.promptLimit(p.MaxPromptTokens, p.Sampling.MaxTokens); limit > 0 && len(ids) > limit {
		return "", &PromptTooLongError{Tokens: len(ids), Limit: limit}
	}
	h := fnv.New64a()
	h.Write([]byte(prompt))
	key := h.Sum64()
	t.mu.Lock()
	n := t.asked[key]
	t.asked[key]++
	t.mu.Unlock()
	s := p.Sampling
	s.Temperature, s.Seed = temperature, s.Seed^key^(n*0x9e3779b97f4a7c15)
	g, err := t.sc.Generate(ctx, ids, s, nil)
	if err != nil {
		return "", err
	}
	return p.completion(ids, g, s.StopIDs).Text, nil
}
