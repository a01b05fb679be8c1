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

// NewEmbedder learns the model's dimension (embed.Probe).
func NewEmbedder(ctx context.Context, c *Client, model string) (*Embedder, error) {
	e := &Embedder{Client: c, Model: model}
	var err error
	if e.dim, err = embed.Probe(ctx, e.Embed); err != nil {
		return nil, err
	}
	return e, nil
}

// Dim implements embed.Embedder.
func (e *Embedder) Dim() int { return e.dim }

// Embed implements embed.Embedder. A text longer than the model's context
// is an error (Ollama is asked not to truncate it silently).
func (e *Embedder) Embed(ctx context.Context, texts []string) ([][]float32, error) {
	no := false
	request := func(ctx context.Context, part []string) ([][]float32, error) {
		req := &api.EmbedRequest{Model: e.Model, Input: part, Truncate: &no}
		if e.KeepAlive > 0 {
			req.KeepAlive = &api.Duration{Duration: e.KeepAlive}
		}
		r, err := e.Client.API.Embed(ctx, req)
		if err != nil {
			return nil, e.Client.wrap(e.Model, 0, err)
		}
		return r.Embeddings, nil
	}
	return embed.Batches(ctx, texts, e.Batch, e.dim, request, func(msg string) error {
		return fmt.Errorf("%w: model %q returned %s", ErrResponseInvalid, e.Model, msg)
	})
}
