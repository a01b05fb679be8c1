// Package fleet runs GRPO's rollouts on OpenAI-compatible servers that
// load LoRA adapters at run time (vLLM with --enable-lora, our serve):
// after every update the trainer publishes the new adapter, versioned and
// checksummed, every engine loads it (vLLM's POST /v1/load_lora_adapter)
// before the next step's rollouts start, and the rollouts drive the
// engines with token ids, each reply tagged with the adapter that wrote
// it. An engine that fails is taken out; its rollouts are played again
// elsewhere (rl/rollout). The environment and the reward stay with the
// trainer: generation is the cost, the memory tools are cheap.
package fleet

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync"
	"time"

	"github.com/agemem/agemem/llm"
	"github.com/agemem/agemem/llm/native"
	"github.com/agemem/agemem/llm/openai"
	"github.com/agemem/agemem/rl/rollout"
)

// Options are a fleet's engines and how to talk to them.
type Options struct {
	// URLs are the engines' API roots (http://host:8000/v1).
	URLs []string
	// Key is sent as a bearer token (serve: an admin key, which loading
	// adapters takes); "" sends none.
	Key string
	// Timeout bounds one request: an engine silent for longer is taken
	// to hang. Retries are a request's attempts after the first on a
	// connection error or a 5xx, before the engine counts as failed.
	Timeout time.Duration
	Retries int
}

// Fleet is the engines rollouts run on.
type Fleet struct {
	engines []*engine
	log     io.Writer
}

type engine struct {
	url    string
	client *openai.Client
	mu     sync.Mutex
	holds  string // the adapter it was last seen to hold
	down   error  // why it was taken out at the last load (nil: up)
}

// New is a fleet of o.URLs; nothing is sent until Load.
func New(o Options, log io.Writer) (*Fleet, error) {
	if log == nil {
		log = io.Discard
	}
	f := &Fleet{log: log}
	for i, u := range o.URLs {
		c := openai.DefaultConfig()
		c.BaseURL, c.Timeout, c.MaxRetries, c.RetryBackoff = u, o.Timeout, o.Retries, 200*time.Millisecond
		cl, err := openai.New(c, o.Key, nil)
		if err != nil {
			return nil, fmt.Errorf("rl.engines[%d]: %w", i, err)
		}
		f.engines = append(f.engines, &engine{url: u, client: cl})
	}
	if len(f.engines) == 0 {
		return nil, errors.New("rl.engines: no engine")
	}
	return f, nil
}

// URLs are the engines'.
func (f *Fleet) URLs() []string {
	out := make([]string, len(f.engines))
	for i, e := range f.engines {
		out[i] = e.url
	}
	return out
}

// Load has every engine load adapter a (from pathFor(its URL)) and drop
// prev, the version the last rollouts used (nothing when prev is ""),
// concurrently. It returns the engines that hold a, in the fleet's order;
// one that fails is reported down until a later Load reaches it, and a
// load that leaves none up is an error naming each engine's failure. A
// dead engine gets another chance at each step: one restarted comes back.
func (f *Fleet) Load(ctx context.Context, a Adapter, prev string, pathFor func(engineURL string) string) ([]string, error) {
	var wg sync.WaitGroup
	for _, e := range f.engines {
		wg.Go(func() {
			err := e.client.Post(ctx, "/load_lora_adapter", map[string]string{"lora_name": a.Name, "lora_path": pathFor(e.url)})
			var oe *openai.Error
			if errors.As(err, &oe) && oe.Status == 400 && strings.Contains(oe.Message, "already been loaded") {
				err = nil // vLLM's answer to a second load of one name, which binds its bytes
			}
			e.mu.Lock()
			defer e.mu.Unlock()
			if err != nil {
				if e.down == nil {
					fmt.Fprintf(f.log, "fleet: engine %s failed to load %s and is out of this step: %v\n", e.url, a.Name, err)
				}
				e.down = err
				return
			}
			if e.down != nil {
				fmt.Fprintf(f.log, "fleet: engine %s is back\n", e.url)
			}
			e.down, e.holds = nil, a.Name
			if prev != "" && prev != a.Name {
				// Best effort: an engine that lost it (restarted) has nothing to drop.
				e.client.Post(ctx, "/unload_lora_adapter", map[string]string{"lora_name": prev})
			}
		})
	}
	wg.Wait()
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	var up []string
	var why []error
	for _, e := range f.engines {
		if e.down == nil {
			up = append(up, e.url)
		} else {
			why = append(why, fmt.Errorf("%s: %w", e.url, e.down))
		}
	}
	if len(up) == 0 {
		return nil, fmt.Errorf("fleet: no engine loaded adapter %s: %w", a.Name, errors.Join(why...))
	}
	return up, nil
}

// Models are rollout policies on the engines at urls (each one the
// fleet has), answering with adapter name: each request renders with
// codec, sends token ids, reads the reply's ids, and fails as a
// rollout.EngineError when the engine does (no reply, a 5xx, the adapter
// not found) or answers with another model than name (a stale adapter:
// refused, never trained on).
func (f *Fleet) Models(urls []string, name string, codec *native.Codec, sampling llm.Sampling) ([]llm.Model, error) {
	var out []llm.Model
	for _, u := range urls {
		var e *engine
		for _, x := range f.engines {
			if x.url == u {
				e = x
			}
		}
		if e == nil {
			return nil, fmt.Errorf("fleet: engine %s is not in rl.engines", u)
		}
		out = append(out, engineModel{tm: &openai.TokenModel{Client: e.client, Name: name, Codec: codec, Sampling: sampling}, url: u})
	}
	return out, nil
}

// engineModel is one engine as a rollout policy.
type engineModel struct {
	tm  *openai.TokenModel
	url string
}

// Chat implements llm.Model.
func (m engineModel) Chat(ctx context.Context, r llm.Request) (llm.Response, error) {
	resp, err := m.tm.Chat(ctx, r)
	if err != nil {
		var oe *openai.Error
		if ctx.Err() == nil && errors.As(err, &oe) && (oe.Status == 0 || oe.Status >= 500 || oe.Status == 404) {
			return resp, &rollout.EngineError{Engine: m.url, Err: err}
		}
		return resp, err
	}
	if resp.Model != m.tm.Name {
		return llm.Response{}, &rollout.EngineError{Engine: m.url,
			Err: fmt.Errorf("answered with model %q, not the adapter %q the step runs (a stale adapter: the reply is refused)", resp.Model, m.tm.Name)}
	}
	return resp, nil
}
