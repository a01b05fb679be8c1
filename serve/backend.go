package serve

import (
	"context"
	"sync"

	"github.com/agemem/agemem/memtools"
	"github.com/agemem/agemem/memtools/stm"
	"github.com/agemem/agemem/model/engine"
)

// Backend is the policy a server runs. It hands each request a policy with
// the request's own sampling, and counts tokens the way the policy does.
type Backend interface {
	Policy(g Gen) memtools.Policy
	stm.Tokenizer
	// ContextLength is the most tokens a prompt and its response may
	// hold together (0: not known), checked before a request starts.
	ContextLength() int
	Close()
}

// Gen is one request's generation settings.
type Gen struct {
	Temperature, TopP float64
	MaxTokens         int
	Seed              uint64
	MaxPromptTokens   int
	// Progress, if set, is called as a response grows; text returns the
	// response so far (it may be called later, from another goroutine).
	Progress func(text func() string)
}

// Batched serves a Qwen policy through a continuous-batching scheduler:
// the policy calls of all concurrent requests decode in shared steps.
type Batched struct {
	Generator *engine.Generator
	Scheduler *engine.Scheduler
}

// NewBatched starts the scheduler for p. maxBatch 1 turns batching off;
// system, if not empty, is a system prompt whose cache is computed once and
// shared by every conversation that starts with it; prefixCache positions
// of finished requests' caches are kept for later turns (0: none);
// kvBudget positions, when positive, hold every live sequence's keys and
// values (paged, engine.SchedulerOptions.KVBudget). onStep observes each
// decoding step (metrics).
func NewBatched(p *engine.Generator, maxBatch int, system string, prefixCache, kvBudget int, onStep func(seqs, tokens int)) (*Batched, error) {
	budget := prefixCache
	if budget == 0 {
		budget = -1
	}
	sc := engine.NewScheduler(p.Model, p.Tokenizer, engine.SchedulerOptions{MaxBatch: maxBatch, OnStep: onStep, PrefixBudget: budget, KVBudget: kvBudget})
	if system != "" {
		// The rendered system turn is a prefix of every conversation's
		// prompt ids; its last eight tokens are left out so that a
		// tokenizer merge across the boundary (the turn's closing tag and
		// the next turn's opening) cannot make it a non-prefix.
		ids, err := p.Prompt([]stm.Message{{Role: stm.System, Content: system}})
		if err == nil && len(ids) > 8 {
			err = sc.SetPrefix(ids[:len(ids)-8])
		}
		if err != nil {
			sc.Close()
			return nil, err
		}
	}
	return &Batched{Generator: p, Scheduler: sc}, nil
}

// Count implements stm.Tokenizer.
func (n *Batched) Count(text string) int { return n.Generator.Tokenizer.Count(text) }

// ContextLength implements Backend: the model's positions.
func (n *Batched) ContextLength() int { return n.Generator.Model.MaxPositions }

// Close stops the scheduler.
func (n *Batched) Close() { n.Scheduler.Close() }

// Policy implements Backend.
func (n *Batched) Policy(g Gen) memtools.Policy {
	s := n.Generator.Sampling
	s.Temperature, s.TopP, s.MaxTokens, s.Seed = g.Temperature, g.TopP, g.MaxTokens, g.Seed
	sp := engine.Scheduled{Generator: n.Generator, Scheduler: n.Scheduler, Sampling: s, MaxPromptTokens: g.MaxPromptTokens}
	if g.Progress == nil {
		return sp
	}
	return &streamingPolicy{sp: sp, progress: g.Progress}
}

// streamingPolicy collects the ids of the response being generated so that
// the request's writer can decode them at its own pace: the scheduler's
// goroutine only appends an id.
type streamingPolicy struct {
	sp       engine.Scheduled
	progress func(text func() string)
	mu       sync.Mutex
	ids      []int
}

func (p *streamingPolicy) Complete(ctx context.Context, msgs []stm.Message) (memtools.Completion, error) {
	p.mu.Lock()
	p.ids = nil
	p.mu.Unlock()
	text := func() string {
		p.mu.Lock()
		ids := append([]int(nil), p.ids...)
		p.mu.Unlock()
		return p.sp.Generator.Tokenizer.Decode(ids, true)
	}
	sp := p.sp
	sp.OnToken = func(id int) {
		p.mu.Lock()
		p.ids = append(p.ids, id)
		p.mu.Unlock()
		p.progress(text)
	}
	return sp.Complete(ctx, msgs)
}
