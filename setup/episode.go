package setup

import (
	"context"
	"fmt"

	"github.com/agemem/agemem/env"
	"github.com/agemem/agemem/llm"
	"github.com/agemem/agemem/llm/native"
	"github.com/agemem/agemem/memtools"
	"github.com/agemem/agemem/memtools/stm"
)

// Policies are the models an episode may be played with beside the
// scripted policies; a nil one was not given.
type Policies struct {
	Native         *native.Engine
	Ollama, OpenAI llm.Model
}

// Policy is the policy name plays task t with: oracle (knows the
// supporting facts and uses the tools), no-memory (never calls a tool),
// or native, ollama and openai (the models given, shared across tasks).
func (p Policies) Policy(cfg Config, name string, t env.Task) (llm.Model, error) {
	switch name {
	case "ollama":
		if p.Ollama == nil {
			return nil, fmt.Errorf("--policy ollama needs --ollama-model NAME (a model on the ollama server)")
		}
		return p.Ollama, nil
	case "openai":
		if p.OpenAI == nil {
			return nil, fmt.Errorf("--policy openai needs openai.base_url and a model (--openai-model NAME or openai.model)")
		}
		return p.OpenAI, nil
	case "oracle":
		return env.NewOracle(t, 0, 0, uint64(cfg.Seed)).Offering(cfg.Tools.Offered()), nil
	case "no-memory":
		return env.NewNoMemory(t), nil
	case "native":
		if p.Native == nil {
			return nil, fmt.Errorf("--policy native needs --model DIR (a Qwen2/2.5/3 checkpoint directory)")
		}
		return p.Native, nil
	}
	return nil, fmt.Errorf("--policy %q: want oracle, no-memory, native, ollama or openai", name)
}

// PlayEpisodes plays AgeMem's three stages (the episode and agent
// sections) on each task with the policy name, each in a fresh runtime
// seeded by its place after cfg.Seed; with a native model its context
// counts tokens as the model does, and it summarises when
// tools.summarizer is policy. progress, when set, hears each task done.
func PlayEpisodes(ctx context.Context, cfg Config, h Helpers, p Policies, name string, tasks []env.Task, progress func(done int)) ([]env.Result, error) {
	if cfg.Tools.Summarizer == "policy" && p.Native == nil {
		return nil, fmt.Errorf("tools.summarizer=policy needs a model to summarise with: give --model DIR, or use extractive")
	}
	newRuntime := Runtime(cfg, h, nil)
	var results []env.Result
	for i, t := range tasks {
		pol, err := p.Policy(cfg, name, t)
		if err != nil {
			return nil, err
		}
		rt := newRuntime(uint64(cfg.Seed) + uint64(i))
		if p.Native != nil {
			rt.Context = stm.New(p.Native.Tokenizer())
			if cfg.Tools.Summarizer == "policy" {
				rt.Summarizer = memtools.ModelSummarizer{Model: p.Native}
			}
		}
		res, err := env.RunEpisode(ctx, pol, rt, t, cfg.EpisodeConfig())
		if err != nil {
			return nil, err
		}
		results = append(results, res)
		if progress != nil {
			progress(i + 1)
		}
	}
	return results, nil
}
