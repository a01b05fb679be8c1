package serve

import (
	"context"

	"github.com/agemem/agemem/llm"
	"github.com/agemem/agemem/memtools/stm"
)

// Backend is the model a server runs: any llm.Model (the native engine,
// whose calls of every request decode in shared steps; a model on an
// Ollama or OpenAI-compatible server), how it counts tokens, and the most
// tokens a prompt and its response may hold together (0: not known),
// checked before a request starts.
type Backend interface {
	llm.Model
	stm.Tokenizer
	ContextLength() int
	Close()
}

// Remote is a model on another server as a Backend: its tokenizer is not
// at hand, so the context budget is counted in words; Context is the
// context it was asked to allocate (Ollama's num_ctx; 0: not known).
type Remote struct {
	llm.Model
	Context int
}

// Count implements stm.Tokenizer.
func (Remote) Count(text string) int { return stm.Words{}.Count(text) }

// ContextLength implements Backend.
func (r Remote) ContextLength() int { return r.Context }

// Close implements Backend; the server's models are its own.
func (Remote) Close() {}

// Gen is one request's generation settings.
type Gen struct {
	Temperature, TopP float64
	MaxTokens         int
	Seed              uint64
	MaxPromptTokens   int
	// Namespace is the tenant's: prefix reuse never crosses it.
	Namespace string
	// Progress, if set, is called as a response grows; text returns the
	// response so far (it may be called later, from another goroutine).
	Progress func(text func() string)
}

// requestModel gives every model call of one served request the request's
// settings.
type requestModel struct {
	be Backend
	g  Gen
}

func (m requestModel) Chat(ctx context.Context, r llm.Request) (llm.Response, error) {
	g := m.g
	r.Sampling = &llm.Sampling{Temperature: g.Temperature, TopP: g.TopP, MaxTokens: g.MaxTokens, Seed: g.Seed}
	r.MaxPromptTokens, r.Namespace, r.OnText = g.MaxPromptTokens, g.Namespace, g.Progress
	return m.be.Chat(ctx, r)
}
