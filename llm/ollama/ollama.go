// Package ollama drives Ollama models as the AgeMem policy, the LLM judge,
// the summariser and the embedder, and publishes policies trained here to
// Ollama. It talks to Ollama through its own Go client
// (github.com/ollama/ollama/api) and turns Ollama's failures into errors
// that say what to do: which host could not be reached, which model to
// pull, which setting bounds the context.
package ollama

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"strings"

	"github.com/ollama/ollama/api"
	"github.com/ollama/ollama/envconfig"
)

// The kinds of failure a caller may want to tell apart (errors.Is).
var (
	ErrUnreachable     = errors.New("ollama is not reachable")
	ErrModelNotFound   = errors.New("model not found")
	ErrContextTooLong  = errors.New("prompt exceeds the context length")
	ErrResponseInvalid = errors.New("invalid response")
)

// Client is a connection to one Ollama server.
type Client struct {
	API  *api.Client
	host *url.URL
}

// New connects to host ("" reads OLLAMA_HOST, then 127.0.0.1:11434; a bare
// host:port means http). hc may be nil.
func New(host string, hc *http.Client) (*Client, error) {
	u := envconfig.Host()
	if host != "" {
		if !strings.Contains(host, "://") {
			host = "http://" + host
		}
		var err error
		if u, err = url.Parse(host); err != nil || u.Host == "" {
			return nil, fmt.Errorf("ollama host %q is not a URL (want http://host:port)", host)
		}
	}
	if hc == nil {
		hc = http.DefaultClient
	}
	return &Client{API: api.NewClient(u, hc), host: u}, nil
}

// Host is the server's URL.
func (c *Client) Host() string { return c.host.String() }

// wrap turns an error from Ollama's client into one that names the host,
// the model and the remedy.
func (c *Client) wrap(model string, numCtx int, err error) error {
	if err == nil {
		return nil
	}
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return err
	}
	var se api.StatusError
	if errors.As(err, &se) {
		msg := se.ErrorMessage
		switch {
		case se.StatusCode == http.StatusNotFound || strings.Contains(msg, "not found"):
			return fmt.Errorf("%w: Ollama at %s has no model %q; pull it with `ollama pull %s` (%s)", ErrModelNotFound, c.Host(), model, model, msg)
		case strings.Contains(msg, "context length"):
			ctx := "the model's default context"
			if numCtx > 0 {
				ctx = fmt.Sprintf("num_ctx %d", numCtx)
			}
			return fmt.Errorf("%w: model %q at %s: the prompt does not fit %s; raise ollama.num_ctx or lower agent.context_budget (%s)", ErrContextTooLong, model, c.Host(), ctx, msg)
		}
		return fmt.Errorf("ollama at %s, model %q: HTTP %d: %s", c.Host(), model, se.StatusCode, msg)
	}
	var ae api.AuthorizationError
	if errors.As(err, &ae) {
		return fmt.Errorf("ollama at %s refused the request (HTTP %d, unauthorised): %v", c.Host(), ae.StatusCode, err)
	}
	var ue *url.Error
	var ne net.Error
	if errors.As(err, &ue) || errors.As(err, &ne) {
		return fmt.Errorf("%w: cannot reach Ollama at %s (is `ollama serve` running there? set ollama.host or OLLAMA_HOST): %v", ErrUnreachable, c.Host(), err)
	}
	return fmt.Errorf("ollama at %s, model %q: %w", c.Host(), model, err)
}

// Ping checks that the server answers and returns its version.
func (c *Client) Ping(ctx context.Context) (string, error) {
	v, err := c.API.Version(ctx)
	return v, c.wrap("", 0, err)
}

// HasModel reports whether model is present on the server, so that a
// command can fail before its first request with the pull hint.
func (c *Client) HasModel(ctx context.Context, model string) error {
	_, err := c.API.Show(ctx, &api.ShowRequest{Model: model})
	return c.wrap(model, 0, err)
}
