package ollama

import (
	"context"
	"fmt"
	"time"

	"github.com/agemem/agemem/embed"
	"github.com/ollama/ollama/api"
)

// Embedder is an embed.Embedder over Ollama's /api/embed: texts go in
// batches, vectors come back L2-normalised.
type Embedder struct {
	Client    *Client
	Model     string
	Batch     int // texts per request (default 64)
	KeepAlive time.Duration
	dim       int
}

// NewEmbedder asks the model for one vector to learn its dimension, so a
// store can be opened with it and a missing model fails at start-up.
func NewEmbedder(ctx context.Context, c *Client, model string) (*Embedder, error) {
	e := &Embedder{Client: c, Model: model}
	v, err := e.Embed(ctx, []string{"dimension probe"})
	if err != nil {
		return nil, err
	}
	e.dim = len(v[0])
	return e, nil
}

// Dim implements embed.Embedder.
func (e *Embedder) Dim() int { return e.dim }

// Embed implements embed.Embedder. A text longer than the model's context
// is an error (Ollama is asked not to truncate it silently).
func (e *Embedder) Embed(ctx context.Context, texts []string) ([][]float32, error) {
	batch := e.Batch
	if batch <= 0 {
		batch = 64
	}
	no := false
	out := make([][]float32, 0, len(texts))
	for start := 0; start < len(texts); start += batch {
		part := texts[start:min(start+batch, len(texts))]
		req := &api.EmbedRequest{Model: e.Model, Input: part, Truncate: &no}
		if e.KeepAlive > 0 {
			req.KeepAlive = &api.Duration{Duration: e.KeepAlive}
		}
		r, err := e.Client.API.Embed(ctx, req)
		if err != nil {
			return nil, e.Client.wrap(e.Model, 0, err)
		}
		if len(r.Embeddings) != len(part) {
			return nil, fmt.Errorf("%w: model %q returned %d embeddings for %d texts", ErrResponseInvalid, e.Model, len(r.Embeddings), len(part))
		}
		for i, v := range r.Embeddings {
			want := e.dim
			if want == 0 {
				want = len(r.Embeddings[0])
			}
			if len(v) == 0 || len(v) != want {
				return nil, fmt.Errorf("%w: model %q returned a %d-dimensional vector for text %d, want %d", ErrResponseInvalid, e.Model, len(v), start+i, want)
			}
			embed.Normalize(v) // for the store's dot product: the cosine
			out = append(out, v)
		}
	}
	return out, nil
}
