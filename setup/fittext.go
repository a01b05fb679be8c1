package setup

import (
	"context"
	"fmt"
	"io"
	"slices"

	"github.com/agemem/agemem/agent"
	"github.com/agemem/agemem/bench/toolret"
	"github.com/agemem/agemem/papers/fittext"
)

// FitTextRetriever is FitText's retriever (the fittext section) over the
// tools of ds, embedded by embed.backend and ranked on embed.device. For
// strategies other than query the model m names (on model.device, up to
// parallel calls decoding together) writes the pseudo-tools, and refine,
// a model on openai.base_url, when given, makes every call but the first
// (the paper pairs GPT-4.1 with GPT-4.1-mini).
func FitTextRetriever(ctx context.Context, cfg Config, ds toolret.Dataset, strategies []string, m Models, refine string, parallel int, log io.Writer) (*fittext.Retriever, error) {
	emb, err := Embedder(ctx, cfg)
	if err != nil {
		return nil, err
	}
	kb, err := agent.NewCatalog(ctx, emb, ds.Tools)
	if err != nil {
		return nil, err
	}
	kb.UseDevice(IndexDevice(cfg))
	r := &fittext.Retriever{Config: cfg.FitText, KB: kb, Seed: uint64(cfg.Seed)}
	if !slices.ContainsFunc(strategies, func(s string) bool { return s != "query" }) {
		return r, nil
	}
	if m.Native == "" && m.Model == "" && cfg.OpenAI.Model == "" {
		return nil, fmt.Errorf("strategies other than query need a model: --native DIR or --model (openai.base_url)")
	}
	model, err := ChatModel(ctx, cfg, m, cfg.Model.Device, parallel, log)
	if err != nil {
		return nil, err
	}
	r.LLM = &fittext.ModelLLM{Model: model}
	if refine != "" {
		rm, err := ChatModel(ctx, cfg, Models{Model: refine}, cfg.Model.Device, 1, log)
		if err != nil {
			return nil, err
		}
		r.Refiner = &fittext.ModelLLM{Model: rm}
	}
	return r, nil
}
