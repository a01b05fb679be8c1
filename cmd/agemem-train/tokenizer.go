package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"

	"github.com/spf13/cobra"

	"github.com/agemem/agemem/env"
	"github.com/agemem/agemem/memtools"
	"github.com/agemem/agemem/model/qwen"
	"github.com/agemem/agemem/model/tokenizer"
)

func tokenizerCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{Use: "tokenizer", Short: "Train tokenizers"}
	var data, out string
	var vocab, episodes int
	train := &cobra.Command{
		Use:   "train",
		Short: "Learn a byte-level BPE tokenizer on task data and AgeMem episodes",
		Long: `Learns a byte-level BPE (Qwen's pre-tokenizer, NFC) on the tasks of a
HotpotQA-format file and on oracle episodes played on them (so the AgeMem
prompt, tool calls and tool results are well covered), with the ChatML special
tokens and the AgeMem tags as added tokens. Writes tokenizer.json and
tokenizer_config.json (Qwen3's chat template) in the Hugging Face format.`,
		Example: "  agemem-train tokenizer train --data data/synth.json --vocab-size 4096 --out runs/tok",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg, err := g.loadData(&data)
			if err != nil {
				return err
			}
			if out == "" {
				return fmt.Errorf("--out is required")
			}
			texts := []string{memtools.SystemPrompt()}
			n := 0
			err = env.StreamHotpotFile(data, func(t env.Task) error {
				texts = append(texts, t.Question, t.Answer)
				texts = append(texts, t.Context...)
				texts = append(texts, t.Distractors...)
				if n < episodes {
					res, err := env.RunEpisode(context.Background(), env.NewOracle(t, 0, 0, uint64(cfg.Seed)), newRuntime(cfg, uint64(n)), t, episodeConfig(cfg))
					if err != nil {
						return err
					}
					for _, m := range res.Final {
						texts = append(texts, m.Content)
					}
					for _, st := range res.Stages {
						for _, turn := range st {
							for _, step := range turn.Trace.Steps {
								texts = append(texts, step.Completion.Text)
								for _, r := range step.Results {
									texts = append(texts, r.Content)
								}
							}
						}
					}
				}
				n++
				return nil
			})
			if err != nil {
				return err
			}
			raw, err := tokenizer.Train(texts, tokenizer.TrainOptions{VocabSize: vocab, Special: tokenizer.ChatML, Added: tokenizer.AgeMemTags})
			if err != nil {
				return err
			}
			if err := os.MkdirAll(out, 0o755); err != nil {
				return err
			}
			path := filepath.Join(out, "tokenizer.json")
			if err := os.WriteFile(path, raw, 0o644); err != nil {
				return err
			}
			tok, err := tokenizer.Load(path)
			if err != nil {
				return err
			}
			if err := tokenizer.WriteConfig(out, tok, qwen.Qwen3TemplateText, cfg.Agent.ContextBudget); err != nil {
				return err
			}
			fmt.Fprintf(cmd.ErrOrStderr(), "wrote %s: %d tokens, learned on %d tasks (%d oracle episodes)\n", out, tok.VocabSize(), n, min(n, episodes))
			return nil
		},
	}
	train.Flags().StringVar(&data, "data", "", "HotpotQA-format task file (default: data.train)")
	train.Flags().StringVar(&out, "out", "", "output directory")
	train.Flags().IntVar(&vocab, "vocab-size", 4096, "vocabulary size, byte and added tokens included")
	train.Flags().IntVar(&episodes, "episodes", 200, "oracle episodes to include in the corpus")
	cmd.AddCommand(train)
	return cmd
}
