package ollama

import (
	"context"
	"fmt"
	"time"

	"github.com/ollama/ollama/api"

	"github.com/agemem/agemem/embed"
)

// NewEmbedder is an embedder over Ollama's /api/embed (embed.Remote),
// keeping the model loaded for keepAlive (0: Ollama's default). A text
// longer than the model's context is an error: Ollama is asked not to
// truncate it silently.
func NewEmbedder(ctx context.Context, c *Client, model string, keepAlive time.Duration) (*embed.Remote, error) {
	no := false
	request := func(ctx context.Context, part []string) ([][]float32, error) {
		req := &api.EmbedRequest{Model: model, Input: part, Truncate: &no}
		if keepAlive > 0 {
			req.KeepAlive = &api.Duration{Duration: keepAlive}
		}
		r, err := c.API.Embed(ctx, req)
		if err != nil {
			return nil, c.wrap(model, 0, err)
		}
		return r.Embeddings, nil
	}
	return embed.NewRemote(ctx, request, func(msg string) error {
		return fmt.Errorf("%w: model %q returned %s", ErrResponseInvalid, model, msg)
	})
}
