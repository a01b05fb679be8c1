package engine

import (
	"context"
	"fmt"
	"path/filepath"
	"sync"

	"github.com/agemem/agemem/kernels"
	"github.com/agemem/agemem/memtools"
	"github.com/agemem/agemem/memtools/stm"
	"github.com/agemem/agemem/model/chat"
	"github.com/agemem/agemem/model/lora"
	"github.com/agemem/agemem/model/qwen"
	"github.com/agemem/agemem/model/tokenizer"
)

// Generator is a memtools.BatchPolicy backed by a Qwen model.
type Generator struct {
	Model     *qwen.Model
	Tokenizer *tokenizer.Tokenizer
	Sampling  Sampling
	// Template is the chat template family the model was trained with.
	Template chat.Template
	// MaxPromptTokens refuses prompts longer than this (0: the model's
	// positions less the response budget).
	MaxPromptTokens int
	// Prefixes, if set, keeps each conversation's cache, so that its next
	// call prefills only what was added (an episode's calls resend the
	// whole context). It must be dropped when the weights change.
	Prefixes *PrefixCache
	// KVBudget bounds the key/value positions a CompleteBatch holds at
	// once (0: no bound): the conversations' caches are paged blocks of a
	// pool that size, a conversation joins the batch when its blocks are
	// free and one the pool runs short for is recomputed later (see
	// generate). A conversation larger than the budget runs alone. Each
	// conversation samples what it would in one batch.
	KVBudget int

	kv *kvTotals // shared by copies of the generator
}

// KV is what the paged caches of this generator's batches used so far:
// the largest pool, its peak and the preemptions summed (zero for a
// Generator not made by NewGenerator or LoadGenerator).
func (p *Generator) KV() KVStats {
	if p.kv == nil {
		return KVStats{}
	}
	return p.kv.get()
}

type kvTotals struct {
	mu sync.Mutex
	s  KVStats
}

func (t *kvTotals) add(s KVStats) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.s.Blocks, t.s.Peak = max(t.s.Blocks, s.Blocks), max(t.s.Peak, s.Peak)
	t.s.Preempted += s.Preempted
}

func (t *kvTotals) get() KVStats {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.s
}

// NewGenerator returns a policy that stops at <|im_end|> and <|endoftext|>.
func NewGenerator(m *qwen.Model, tok *tokenizer.Tokenizer, s Sampling) *Generator {
	for _, name := range []string{"<|im_end|>", "<|endoftext|>"} {
		if id, ok := tok.TokenID(name); ok {
			s.StopIDs = append(s.StopIDs, id)
		}
	}
	return &Generator{Model: m, Tokenizer: tok, Sampling: s, kv: &kvTotals{}}
}

// LoadGenerator opens a model directory on a backend (config.json, tokenizer.json, safetensors,
// tokenizer_config.json for the chat template) as a policy; a non-empty
// adapter names a LoRA adapter directory (PEFT layout) applied on top.
//
// dir may itself be a PEFT adapter directory: its base_model_name_or_path
// is loaded and the adapter applied.
func LoadGenerator(be kernels.Backend, dir, adapter string, s Sampling, opts ...qwen.Options) (*Generator, error) {
	var o qwen.Options
	if len(opts) > 0 {
		o = opts[0]
	}
	if adapter == "" {
		if a, err := lora.Load(dir); err == nil {
			if a.Config.BaseModel == "" {
				return nil, fmt.Errorf("%s/adapter_config.json names no base_model_name_or_path", dir)
			}
			dir, adapter = a.Config.BaseModel, dir
		}
	}
	tok, err := tokenizer.Load(filepath.Join(dir, "tokenizer.json"))
	if err != nil {
		return nil, err
	}
	m, err := qwen.LoadWith(be, dir, o)
	if err != nil {
		return nil, err
	}
	if m.VocabSize < tok.VocabSize() {
		m.Close()
		return nil, fmt.Errorf("%s: the tokenizer has %d ids but the model only %d", dir, tok.VocabSize(), m.VocabSize)
	}
	if adapter != "" {
		a, err := lora.Load(adapter)
		if err == nil {
			err = m.ApplyAdapter(a)
		}
		if err != nil {
			m.Close()
			return nil, fmt.Errorf("adapter %s: %w", adapter, err)
		}
	}
	tmpl, err := chat.Detect(dir, m.ModelType)
	if err != nil {
		m.Close()
		return nil, err
	}
	p := NewGenerator(m, tok, s)
	p.Template = tmpl
	return p, nil
}

// SetSeed sets the sampling seed of the next batches (rollout.Seeder).
func (p *Generator) SetSeed(seed uint64) { p.Sampling.Seed = seed }

// Prompt renders a conversation with the generation prompt and encodes it.
func (p *Generator) Prompt(msgs []stm.Message) ([]int, error) {
	qm := make([]chat.Message, len(msgs))
	for i, m := range msgs {
		qm[i] = chat.Message{Role: m.Role, Content: m.Content}
	}
	text, err := chat.Render(qm, chat.Options{Template: p.Template, AddGenerationPrompt: true})
	if err != nil {
		return nil, err
	}
	return p.Tokenizer.Encode(text), nil
}

// Complete implements memtools.Policy.
func (p *Generator) Complete(ctx context.Context, msgs []stm.Message) (memtools.Completion, error) {
	out, err := p.CompleteBatch(ctx, [][]stm.Message{msgs})
	if err != nil {
		return memtools.Completion{}, err
	}
	return out[0], nil
}

// CompleteBatch implements memtools.BatchPolicy: every conversation is
// decoded in the same steps.
func (p *Generator) CompleteBatch(ctx context.Context, convs [][]stm.Message) ([]memtools.Completion, error) {
	prompts := make([][]int, len(convs))
	limit := p.promptLimit(p.MaxPromptTokens, p.Sampling.MaxTokens)
	for i, c := range convs {
		ids, err := p.Prompt(c)
		if err != nil {
			return nil, err
		}
		if limit > 0 && len(ids) > limit {
			return nil, fmt.Errorf("conversation %d: %w", i, &PromptTooLongError{Tokens: len(ids), Limit: limit})
		}
		prompts[i] = ids
	}
	gens, st, err := generate(ctx, p.Model, prompts, p.Sampling, p.Tokenizer, p.Prefixes, p.KVBudget)
	if err != nil {
		return nil, err
	}
	if p.kv != nil {
		p.kv.add(st)
	}
	out := make([]memtools.Completion, len(gens))
	for i, g := range gens {
		out[i] = p.completion(prompts[i], g, p.Sampling.StopIDs)
	}
	return out, nil
}

func (p *Generator) completion(prompt []int, g Generation, stops []int) memtools.Completion {
	text := g.Tokens
	if g.FinishReason == "stop" && len(text) > 0 && isStop(text[len(text)-1], stops) {
		text = text[:len(text)-1] // the end-of-turn token is not part of the message
	}
	return memtools.Completion{
		Text:             p.Tokenizer.Decode(text, true),
		PromptTokens:     len(prompt),
		CompletionTokens: len(g.Tokens),
		PromptIDs:        prompt,
		ResponseIDs:      g.Tokens,
		LogProbs:         g.LogProbs,
		FinishReason:     g.FinishReason,
	}
}

// Scheduled is the policy as one served request sees it: its own sampling
// (the request's temperature, token limit and seed), generation through a
// continuous-batching scheduler shared with every other request, and an
// optional callback per sampled token for streaming.
type Scheduled struct {
	Generator *Generator
	Scheduler *Scheduler
	Sampling  Sampling // StopIDs are the policy's when empty
	OnToken   func(id int)
	// MaxPromptTokens refuses longer prompts (0: Generator's limit).
	MaxPromptTokens int
}

// Complete implements memtools.Policy.
func (s Scheduled) Complete(ctx context.Context, msgs []stm.Message) (memtools.Completion, error) {
	ids, err := s.Generator.Prompt(msgs)
	if err != nil {
		return memtools.Completion{}, err
	}
	samp := s.Sampling
	if len(samp.StopIDs) == 0 {
		samp.StopIDs = s.Generator.Sampling.StopIDs
	}
	limit := s.MaxPromptTokens
	if limit == 0 {
		limit = s.Generator.MaxPromptTokens
	}
	limit = s.Generator.promptLimit(limit, samp.MaxTokens)
	if limit > 0 && len(ids) > limit {
		return memtools.Completion{}, &PromptTooLongError{Tokens: len(ids), Limit: limit}
	}
	g, err := s.Scheduler.Generate(ctx, ids, samp, s.OnToken)
	if err != nil {
		return memtools.Completion{}, err
	}
	return s.Generator.completion(ids, g, samp.StopIDs), nil
}

// promptLimit is the longest prompt allowed: the budget asked for (0: none)
// but never more than leaves room for maxTokens in the model's positions.
func (p *Generator) promptLimit(asked, maxTokens int) int {
	if n := p.Model.MaxPositions; n > 0 && (asked == 0 || asked > n-maxTokens) {
		return max(n-maxTokens, 1)
	}
	return asked
}

// PromptTooLongError is a conversation that does not fit the model.
type PromptTooLongError struct{ Tokens, Limit int }

func (e *PromptTooLongError) Error() string {
	return fmt.Sprintf("prompt of %d tokens exceeds the limit of %d", e.Tokens, e.Limit)
}

// Is makes errors.Is(err, memtools.ErrContextFull) hold.
func (e *PromptTooLongError) Is(target error) bool { return target == memtools.ErrContextFull }

func isStop(id int, stops []int) bool {
	for _, s := range stops {
		if s == id {
			return true
		}
	}
	return false
}

var _ memtools.BatchPolicy = (*Generator)(nil)
