package setup

import (
	"context"
	"fmt"
	"io"
	"strings"

	"github.com/agemem/agemem/kernels/device"
	"github.com/agemem/agemem/llm"
	"github.com/agemem/agemem/llm/native"
	"github.com/agemem/agemem/model/engine"
)

// Models name the model a run acts with as a command line does: Native, a
// local checkpoint directory on the built-in engine, else Model on the
// OpenAI-compatible server (openai.base_url; "": openai.model), or
// ollama:NAME on the Ollama server (its native tools).
type Models struct {
	Model, Native string
}

// ChatModel is the model m names, answering greedily. On the native engine
// (on device dev) up to parallel calls decode in shared steps.
func ChatModel(ctx context.Context, cfg Config, m Models, dev string, parallel int, log io.Writer) (llm.Model, error) {
	if m.Native != "" {
		return NativeEngine(cfg, m.Native, dev, parallel, log)
	}
	model := m.Model
	if model == "" {
		model = cfg.OpenAI.Model
	}
	if model == "" {
		return nil, fmt.Errorf("name the model with --model (or openai.model), or a local checkpoint with --native DIR")
	}
	if name, ok := strings.CutPrefix(model, "ollama:"); ok {
		// Ollama's own API with native tools (its /v1 works through the
		// openai backend too, without them).
		cl, err := cfg.Ollama.Connect()
		if err != nil {
			return nil, err
		}
		if err := cl.HasModel(ctx, name); err != nil {
			return nil, err
		}
		return cfg.Ollama.ChatModel(cl, name, false, cfg.Agent.ContextBudget, cfg.Agent.ResponseBudget), nil
	}
	cl, err := cfg.OpenAI.Connect()
	if err != nil {
		return nil, err
	}
	om := cfg.OpenAI.ChatModel(cl, model, cfg.Agent.ResponseBudget)
	om.Sampling.Temperature, om.Sampling.TopP = 0, 0 // an agent answers greedily
	return om, nil
}

// NativeEngine loads a local checkpoint on device dev's backend (model.quantize
// applies), answering greedily up to agent.response_budget tokens a reply,
// up to parallel calls decoding in shared steps, each conversation's
// prefix kept for its next call. It stays loaded for the process's life.
func NativeEngine(cfg Config, dir, dev string, parallel int, log io.Writer) (*native.Engine, error) {
	be, err := device.Open(dev, log)
	if err != nil {
		return nil, err
	}
	cp, err := native.Open(be, dir, "", cfg.Model.Generation())
	if err != nil {
		return nil, err
	}
	return cp.Start(native.Options{Sampling: llm.Sampling{MaxTokens: cfg.Agent.ResponseBudget},
		Engine: engine.Options{MaxBatch: parallel, PrefixBudget: max(parallel, 1) * cp.Model.MaxPositions}}), nil
}
