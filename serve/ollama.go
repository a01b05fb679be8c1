package serve

import (
	"sync"

	"github.com/agemem/agemem/llm/ollama"
	"github.com/agemem/agemem/memtools"
	"github.com/agemem/agemem/memtools/stm"
)

// Ollama serves a policy that runs on an Ollama server: each policy call
// of a request is one Ollama request with the request's sampling (Ollama
// batches concurrent requests itself, up to its OLLAMA_NUM_PARALLEL).
type Ollama struct {
	// Base carries the model, format, context and keep-alive; each request
	// gets a copy with its own sampling.
	Base *ollama.Generator
}

// Count implements stm.Tokenizer. Ollama's tokenizer is not at hand, so
// the context budget is counted in words.
func (o *Ollama) Count(text string) int { return stm.Words{}.Count(text) }

// ContextLength implements Backend: the num_ctx Ollama is asked to allocate.
func (o *Ollama) ContextLength() int { return o.Base.NumCtx }

// Close implements Backend; the server's models belong to Ollama.
func (o *Ollama) Close() {}

// Policy implements Backend.
func (o *Ollama) Policy(g Gen) memtools.Policy {
	p := *o.Base
	p.Temperature, p.TopP, p.MaxTokens, p.Seed = g.Temperature, g.TopP, g.MaxTokens, int(g.Seed)
	if g.Progress != nil {
		var mu sync.Mutex
		var sofar string
		text := func() string {
			mu.Lock()
			defer mu.Unlock()
			return sofar
		}
		p.OnText = func(s string) {
			mu.Lock()
			sofar = s
			mu.Unlock()
			g.Progress(text)
		}
	}
	return &p
}
