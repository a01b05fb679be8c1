package main

import (
	"fmt"
	"os"
	"path/filepath"

	"github.com/spf13/cobra"

	"github.com/agemem/agemem/model/chat"
	"github.com/agemem/agemem/model/tokenizer"
	"github.com/agemem/agemem/setup"
)

const tokenizerTrainLong = `Learns a byte-level BPE (NFC; --pretokenizer words by default) on the tasks of a
HotpotQA-format file and on oracle episodes played on them (so the AgeMem
prompt, tool calls and tool results are well covered), with the ChatML special
tokens and the AgeMem tags as added tokens. Writes tokenizer.json and
tokenizer_config.json with a chat template in the Hugging Face format.

--template qwen2.5 (the default) renders earlier assistant turns verbatim;
qwen3 drops their <think> blocks, as Qwen3's own template does. A small
model trained from scratch imitates its history, so with qwen3 it learns to
answer without thinking after a few turns; qwen2.5 keeps every turn in the
format the parser demands.`

func tokenizerCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{Use: "tokenizer", Short: "Train tokenizers"}
	var data, out, tmpl, pretok string
	var vocab, episodes int
	train := &cobra.Command{
		Use:     "train",
		Short:   "Learn a byte-level BPE tokenizer on task data and AgeMem episodes",
		Long:    tokenizerTrainLong,
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
			if episodes < 0 {
				return fmt.Errorf("--episodes %d: want 0 or more", episodes)
			}
			text, pattern, err := tokenizerSpec(tmpl, pretok)
			if err != nil {
				return err
			}
			texts, n, err := setup.TokenizerCorpus(cmd.Context(), cfg, data, episodes)
			if err != nil {
				return err
			}
			tok, err := writeTokenizer(texts, vocab, text, pattern, out, cfg.Agent.ContextBudget)
			if err != nil {
				return err
			}
			fmt.Fprintf(cmd.ErrOrStderr(), "wrote %s: %d tokens, learned on %d tasks (%d oracle episodes)\n", out, tok.VocabSize(), n, min(n, episodes))
			return nil
		},
	}
	train.Flags().StringVar(&data, "data", "", "HotpotQA-format task file (default: data.train)")
	train.Flags().StringVar(&out, "out", "", "output directory")
	train.Flags().IntVar(&vocab, "vocab-size", 4096, "vocabulary size, byte and added tokens included")
	train.Flags().StringVar(&tmpl, "template", "qwen2.5", "chat template written to tokenizer_config.json: qwen2.5 or qwen3")
	train.Flags().IntVar(&episodes, "episodes", 200, "oracle episodes to include in the corpus")
	train.Flags().StringVar(&pretok, "pretokenizer", "words", "how text is cut before BPE: words (a word keeps its trailing space, so it is the same tokens after a space, a quote or a tag: what a small model copying names needs; digits one at a time, as Qwen cuts them), names (as words, but a capitalised word keeps no trailing space, so a name is the same tokens before a space, a full stop or a tag too) or qwen (Qwen's regex)")
	cmd.AddCommand(train)
	return cmd
}

// tokenizerSpec reads --template and --pretokenizer: the chat template's
// text and the pre-tokenizer's pattern.
func tokenizerSpec(tmpl, pretok string) (text, pattern string, err error) {
	text = map[string]string{"qwen2.5": chat.Qwen25Text, "qwen3": chat.Qwen3Text}[tmpl]
	if text == "" {
		return "", "", fmt.Errorf("--template %q: want qwen2.5 or qwen3", tmpl)
	}
	pattern, ok := map[string]string{"words": tokenizer.WordsPattern, "names": tokenizer.NamesPattern, "qwen": tokenizer.QwenPattern}[pretok]
	if !ok {
		return "", "", fmt.Errorf("--pretokenizer %q: want words, names or qwen", pretok)
	}
	return text, pattern, nil
}

// writeTokenizer learns a BPE of vocab tokens on texts and writes it to
// out as Hugging Face does (tokenizer.json, and tokenizer_config.json
// with the chat template's text).
func writeTokenizer(texts []string, vocab int, text, pattern, out string, contextBudget int) (*tokenizer.Tokenizer, error) {
	raw, err := tokenizer.Train(texts, tokenizer.TrainOptions{VocabSize: vocab, Special: tokenizer.ChatML, Added: tokenizer.AgeMemTags, Pattern: pattern})
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(out, 0o755); err != nil {
		return nil, err
	}
	path := filepath.Join(out, "tokenizer.json")
	if err := os.WriteFile(path, raw, 0o644); err != nil {
		return nil, err
	}
	tok, err := tokenizer.Load(path)
	if err != nil {
		return nil, err
	}
	return tok, tokenizer.WriteConfig(out, tok, text, contextBudget)
}
