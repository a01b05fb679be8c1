package setup

import (
	"context"

	"github.com/agemem/agemem/env"
)

// TokenizerCorpus is what a tokenizer for AgeMem is learned on: the
// system prompt, every task's question, answer, context and distractors
// in the HotpotQA-format file data, and the text of oracle episodes on the
// first episodes tasks (so the prompt, the tool calls and their results
// are well covered). tasks counts the tasks read.
func TokenizerCorpus(ctx context.Context, cfg Config, data string, episodes int) (texts []string, tasks int, err error) {
	texts = []string{cfg.EpisodeConfig().SystemPrompt}
	newRuntime := Runtime(cfg, Helpers{}, nil)
	err = env.StreamHotpotFile(data, func(t env.Task) error {
		texts = append(texts, t.Question, t.Answer)
		texts = append(texts, t.Context...)
		texts = append(texts, t.Distractors...)
		if tasks < episodes {
			res, err := env.RunEpisode(ctx, env.NewOracle(t, 0, 0, uint64(cfg.Seed)), newRuntime(uint64(tasks)), t, cfg.EpisodeConfig())
			if err != nil {
				return err
			}
			for _, m := range res.Final {
				texts = append(texts, m.Content)
			}
			for _, st := range res.Stages {
				for _, turn := range st {
					for _, step := range turn.Trace.Steps {
						texts = append(texts, step.Response.Message.Content)
						for _, r := range step.Results {
							texts = append(texts, r.Content)
						}
					}
				}
			}
		}
		tasks++
		return nil
	})
	return texts, tasks, err
}
