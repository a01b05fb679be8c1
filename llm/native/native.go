// Package native is the toolkit's own Qwen engine as an llm.Model:
// conversations rendered with the model's chat template (its tools
// section when a request offers functions, parsed back out of the reply's
// <tool_call> blocks), tokenized, and decoded on one continuous-batching
// engine shared by every call, with the token ids and log-probabilities
// training needs.
package native

import (
	"context"
	"fmt"
	"hash/fnv"
	"path/filepath"
	"slices"
	"sync"

	"github.com/agemem/agemem/kernels"
	"github.com/agemem/agemem/llm"
	"github.com/agemem/agemem/model/chat"
	"github.com/agemem/agemem/model/engine"
	"github.com/agemem/agemem/model/lora"
	"github.com/agemem/agemem/model/qwen"
	"github.com/agemem/agemem/model/tokenizer"
)

// Options configure an Engine.
type Options struct {
	// Sampling is what a request without its own gets; MaxTokens is also
	// the budget of a request whose sampling leaves it 0.
	Sampling llm.Sampling
	// MaxPromptTokens refuses longer prompts (0: the model's positions
	// less the response budget).
	MaxPromptTokens int
	// Batching: the engine's options (engine.Options; MaxBatch 0 batches
	// every live sequence, PrefillChunk 0 feeds a prompt whole).
	Engine engine.Options
}

// Engine is a Qwen model, its tokenizer and chat template behind
// llm.Model, decoding on one engine.Engine: concurrent calls share
// decoding steps.
type Engine struct {
	*Codec
	model    *qwen.Model
	opt      Options
	eng      *engine.Engine
	ownModel bool
}

// New starts an engine for m; generation stops at <|im_end|> and
// <|endoftext|>. Close stops it (the model stays the caller's).
func New(m *qwen.Model, tok *tokenizer.Tokenizer, tmpl chat.Template, o Options) *Engine {
	e := &Engine{Codec: NewCodec(tok, tmpl, m.MaxPositions, o.MaxPromptTokens), model: m, opt: o}
	e.eng = engine.New(m, tok, o.Engine)
	return e
}

// Checkpoint is a model directory loaded for inference: the weights (a
// LoRA adapter applied), the tokenizer and the chat template.
type Checkpoint struct {
	Model     *qwen.Model
	Tokenizer *tokenizer.Tokenizer
	Template  chat.Template
}

// Open loads a model directory on a backend (config.json, tokenizer.json,
// safetensors, tokenizer_config.json for the chat template); a non-empty
// adapter names a LoRA adapter directory (PEFT layout) applied on top. dir
// may itself be a PEFT adapter directory: its base_model_name_or_path is
// loaded and the adapter applied.
func Open(be kernels.Backend, dir, adapter string, qo qwen.Options) (*Checkpoint, error) {
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
	m, err := qwen.LoadWith(be, dir, qo)
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
	return &Checkpoint{Model: m, Tokenizer: tok, Template: tmpl}, nil
}

// Start starts an engine on the checkpoint.
func (c *Checkpoint) Start(o Options) *Engine { return New(c.Model, c.Tokenizer, c.Template, o) }

// Load is Open then Start; Close also closes the model.
func Load(be kernels.Backend, dir, adapter string, o Options, qo qwen.Options) (*Engine, error) {
	c, err := Open(be, dir, adapter, qo)
	if err != nil {
		return nil, err
	}
	e := c.Start(o)
	e.ownModel = true
	return e, nil
}

// SharePrefix computes once the cache of a conversation's start that
// every request shares (the system turn), for every namespace. The
// rendered turn's last eight tokens are left out, so that a tokenizer
// merge across the boundary (the turn's closing tag and the next turn's
// opening) cannot make it a non-prefix.
func (e *Engine) SharePrefix(msgs []chat.Message) error {
	ids, err := e.Prompt(msgs, nil)
	if err != nil {
		return err
	}
	if len(ids) <= 8 {
		return nil
	}
	return e.eng.SetPrefix(ids[:len(ids)-8])
}

// Close stops the engine, failing calls still in it (and closes the model
// Load opened).
func (e *Engine) Close() {
	e.eng.Close()
	if e.ownModel {
		e.model.Close()
	}
}

// Options are the engine's.
func (e *Engine) Options() Options { return e.opt }

// Model is what the engine runs.
func (e *Engine) Model() *qwen.Model { return e.model }

// Batching is the engine the calls decode on (its prefix cache, its KV
// pool's figures, SetPrefix).
func (e *Engine) Batching() *engine.Engine { return e.eng }

// Chat implements llm.Model.
func (e *Engine) Chat(ctx context.Context, r llm.Request) (llm.Response, error) {
	out, err := e.ChatBatch(ctx, []llm.Request{r})
	if err != nil {
		return llm.Response{}, err
	}
	return out[0], nil
}

// ChatBatch implements llm.Batcher: the requests join the same decoding
// step, their common prompt prefix prefilled once.
func (e *Engine) ChatBatch(ctx context.Context, rs []llm.Request) ([]llm.Response, error) {
	reqs := make([]engine.Request, len(rs))
	for i, r := range rs {
		ids, err := e.Prompt(r.Messages, r.Tools)
		if err != nil {
			return nil, err
		}
		s := e.sampling(r.Sampling, ids)
		if err := e.CheckPrompt(ids, r.MaxPromptTokens, s.MaxTokens); err != nil {
			if len(rs) > 1 {
				err = fmt.Errorf("conversation %d: %w", i, err)
			}
			return nil, err
		}
		reqs[i] = engine.Request{Prompt: ids, Sampling: s, Namespace: r.Namespace}
		if r.OnText != nil {
			reqs[i].OnToken = e.streamer(r.OnText)
		}
	}
	gens, err := e.eng.GenerateBatch(ctx, reqs)
	if err != nil {
		return nil, err
	}
	out := make([]llm.Response, len(gens))
	for i, g := range gens {
		out[i] = e.Reply(reqs[i].Prompt, g.Tokens, g.LogProbs, g.FinishReason, len(rs[i].Tools) > 0)
	}
	return out, nil
}

// sampling is a request's: its own, or the engine's with a stream drawn
// from the prompt, so that a call's sample does not depend on what it was
// batched with.
func (e *Engine) sampling(asked *llm.Sampling, ids []int) engine.Sampling {
	s := e.opt.Sampling
	if asked != nil {
		s = *asked
	} else {
		h := fnv.New64a()
		for _, id := range ids {
			h.Write([]byte{byte(id), byte(id >> 8), byte(id >> 16), byte(id >> 24)})
		}
		s.Stream ^= h.Sum64()
	}
	if s.MaxTokens == 0 {
		s.MaxTokens = e.opt.Sampling.MaxTokens
	}
	return engine.Sampling{Temperature: s.Temperature, TopP: s.TopP, TopK: s.TopK, MaxTokens: s.MaxTokens,
		Seed: s.Seed, Stream: s.Stream, StopIDs: e.StopIDs}
}

// streamer collects the ids of a reply as they are sampled, for onText to
// decode at the reader's pace: the engine's goroutine only appends an id.
func (e *Engine) streamer(onText func(func() string)) func(int) {
	var mu sync.Mutex
	var ids []int
	text := func() string {
		mu.Lock()
		cp := slices.Clone(ids)
		mu.Unlock()
		return e.Tok.Decode(cp, true)
	}
	return func(id int) {
		mu.Lock()
		ids = append(ids, id)
		mu.Unlock()
		onText(text)
	}
}

var _ llm.Batcher = (*Engine)(nil)
