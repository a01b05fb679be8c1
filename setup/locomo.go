package setup

import (
	"context"
	"fmt"
	"io"
	"strings"

	"github.com/agemem/agemem/bench/locomo"
	"github.com/agemem/agemem/env"
	"github.com/agemem/agemem/llm"
	"github.com/agemem/agemem/memtools/stm"
	"github.com/agemem/agemem/papers/tamem"
)

// LoCoMoRun is a method run over LoCoMo's questions (agemem-train locomo
// run).
type LoCoMoRun struct {
	// Method is rag (the K turns most similar to the question by the
	// configured embedder, then the model answers from them),
	// full-context (the model reads the whole conversation), ta-mem (the
	// tamem section) or agemem (the policy on AgeMem's memory runtime,
	// Chunk dialogue turns a user message).
	Method   string
	K, Chunk int
	// RetrievalOnly (rag, ta-mem) asks no model: the predictions carry the
	// K retrieved turns, TA-Mem's from pages of tamem.window messages.
	RetrievalOnly bool
	Models        Models
	// Progress, when set, is told how many questions are answered.
	Progress func(done int)
}

// LoCoMo answers every question of samples as r says, the models on
// model.device.
func LoCoMo(ctx context.Context, cfg Config, samples []locomo.Sample, r LoCoMoRun, log io.Writer) ([]locomo.Prediction, error) {
	progress := r.Progress
	if progress == nil {
		progress = func(int) {}
	}
	if r.Method == "agemem" {
		return ageMemLoCoMo(ctx, cfg, samples, r, progress, log)
	}
	var ret locomo.Retriever // full-context: none
	if r.Method == "rag" || r.RetrievalOnly {
		emb, err := Embedder(ctx, cfg)
		if err != nil {
			return nil, err
		}
		if r.Method == "ta-mem" {
			db, err := tamem.Open(cfg.TAMem.DB, emb)
			if err != nil {
				return nil, err
			}
			defer db.Close()
			ret = tamem.Retriever{DB: db, Window: cfg.TAMem.Window}
		} else {
			ret = &locomo.RAG{Embedder: emb}
		}
	}
	if r.RetrievalOnly {
		return locomo.RetrievalPredictions(ctx, samples, ret, r.K)
	}
	m, err := ChatModel(ctx, cfg, r.Models, cfg.Model.Device, cfg.TAMem.Parallel, log)
	if err != nil {
		return nil, err
	}
	if r.Method == "ta-mem" {
		emb, err := Embedder(ctx, cfg)
		if err != nil {
			return nil, err
		}
		return tamem.LoCoMo(ctx, cfg.TAMem, m, emb, samples, log, progress)
	}
	return locomo.Answer(ctx, m, samples, ret, r.K, func(done, _ int) { progress(done) })
}

// ageMemLoCoMo plays each conversation through AgeMem's memory runtime
// (env.LoCoMo) with the policy r names: a local checkpoint, an Ollama
// model (ollama:NAME) or one on the OpenAI-compatible server, sampled as
// in training (temperature 1) in ollama.format or openai.format.
func ageMemLoCoMo(ctx context.Context, cfg Config, samples []locomo.Sample, r LoCoMoRun, progress func(int), log io.Writer) ([]locomo.Prediction, error) {
	var p llm.Model
	var tok stm.Tokenizer
	switch name, isOllama := strings.CutPrefix(r.Models.Model, "ollama:"); {
	case r.Models.Native != "":
		e, err := NativeEngine(cfg, r.Models.Native, cfg.Model.Device, 1, log)
		if err != nil {
			return nil, err
		}
		p, tok = e, e.Tokenizer()
	case isOllama:
		pol, _, err := OllamaPolicy(ctx, cfg, name)
		if err != nil {
			return nil, err
		}
		p = pol
	default:
		model := r.Models.Model
		if model == "" {
			model = cfg.OpenAI.Model
		}
		if model == "" {
			return nil, fmt.Errorf("--method agemem: name the policy with --native DIR, --model NAME (openai.base_url) or --model ollama:NAME")
		}
		pol, err := OpenAIPolicy(cfg, model, llm.Sampling{Temperature: 1, TopP: 1, MaxTokens: cfg.Agent.ResponseBudget})
		if err != nil {
			return nil, err
		}
		p = pol
	}
	h, err := NewHelpers(ctx, cfg)
	if err != nil {
		return nil, err
	}
	a := env.LoCoMo{NewRuntime: Runtime(cfg, h, tok), System: cfg.Agent.Prompt(cfg.Tools.Offered()), Limits: cfg.Agent.Limits(), Chunk: r.Chunk}
	var preds []locomo.Prediction
	done := 0
	for i, s := range samples {
		ps, err := a.Answer(ctx, p, s, uint64(cfg.Seed)+uint64(i), func() { done++; progress(done) })
		if err != nil {
			return nil, err
		}
		preds = append(preds, ps...)
	}
	return preds, nil
}
