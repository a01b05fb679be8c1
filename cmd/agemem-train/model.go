package main

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"github.com/mattn/go-isatty"
	"github.com/spf13/cobra"

	"github.com/agemem/agemem/internal/jsonerr"
	"github.com/agemem/agemem/model/lora"
	"github.com/agemem/agemem/model/qwen"
	"github.com/agemem/agemem/model/safetensors"
	"github.com/agemem/agemem/model/tokenizer"
	"github.com/agemem/agemem/model/train"
)

func initModelCmd(g *globals) *cobra.Command {
	var preset, out, dtype, tokPath string
	var seed uint64
	names := make([]string, 0, len(qwen.Presets))
	for n := range qwen.Presets {
		names = append(names, n)
	}
	sort.Strings(names)
	cmd := &cobra.Command{
		Use:   "init-model",
		Short: "Write a random-weight Qwen model in the Hugging Face layout",
		Long: `Writes config.json and model.safetensors with random weights: the starting
point of the embedded default (the shape in the config's model.init), or a
preset for tests and benchmarks. With --tokenizer, tokenizer.json (and the
tokenizer_config.json beside it, which holds the chat template) is copied
along and the vocabulary is sized to it. Presets: ` + strings.Join(names, ", ") + ".",
		Example: `  agemem-train init-model --config configs/tiny.yaml --tokenizer runs/tiny/tok/tokenizer.json --dtype f32
  agemem-train init-model --preset tiny-qwen3 --out runs/tiny
  agemem-train init-model --preset qwen2.5-0.5b-shape --dtype bf16 --tokenizer tokenizer.json --out runs/q05`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			dt := map[string]safetensors.DType{"f32": safetensors.F32, "f16": safetensors.F16, "bf16": safetensors.BF16}[dtype]
			if dt == "" {
				return fmt.Errorf("--dtype %q: want f32, f16 or bf16", dtype)
			}
			var cfg qwen.Config
			if preset == "" {
				c, err := g.load()
				if err != nil {
					return err
				}
				mi := c.Model.Init
				cfg = qwen.Config{ModelType: mi.ModelType, HiddenSize: mi.HiddenSize, Layers: mi.Layers, Heads: mi.Heads,
					KVHeads: mi.KVHeads, HeadDim: mi.HeadDim, Intermediate: mi.Intermediate, RMSNormEps: 1e-6,
					RopeTheta: mi.RopeTheta, TieEmbeddings: mi.TieEmbeddings, MaxPositions: mi.MaxPositions}
				if tokPath == "" {
					return fmt.Errorf("--tokenizer is required with the config's model.init shape (it sets the vocabulary)")
				}
				if out == "" {
					out = c.Model.Path
				}
			} else {
				var ok bool
				if cfg, ok = qwen.Presets[preset]; !ok {
					return fmt.Errorf("--preset %q: want one of %s", preset, strings.Join(names, ", "))
				}
			}
			if out == "" {
				return fmt.Errorf("--out is required")
			}
			if tokPath != "" {
				var err error
				if cfg.VocabSize, err = copyTokenizer(tokPath, out); err != nil {
					return err
				}
			}
			pr := train.NewProgress(cmd.ErrOrStderr(), 100, isatty.IsTerminal(os.Stderr.Fd()))
			err := qwen.InitRandomProgress(out, cfg, dt, seed, func(done, total int) {
				pr.Update(100*done/total, fmt.Sprintf("percent of %.1fM parameters drawn", float64(total)/1e6))
			})
			if err != nil {
				return err
			}
			fmt.Fprintf(cmd.ErrOrStderr(), "wrote %s (%s, %d layers, hidden %d, vocab %d, %s)\n", out, cfg.ModelType, cfg.Layers, cfg.HiddenSize, cfg.VocabSize, dtype)
			return nil
		},
	}
	cmd.Flags().StringVar(&preset, "preset", "", "model shape (default: the config's model.init)")
	cmd.Flags().StringVar(&out, "out", "", "output directory (default: the config's model.path with model.init)")
	cmd.Flags().StringVar(&dtype, "dtype", "bf16", "weight type: f32, f16 or bf16")
	cmd.Flags().StringVar(&tokPath, "tokenizer", "", "tokenizer.json to copy (sets the vocabulary size)")
	cmd.Flags().Uint64Var(&seed, "seed", 1, "random seed")
	return cmd
}

// copyTokenizer copies tokenizer.json, and the tokenizer_config.json
// beside it that holds the chat template, into dir, and returns the
// vocabulary's size.
func copyTokenizer(tokPath, dir string) (int, error) {
	tok, err := tokenizer.Load(tokPath)
	if err != nil {
		return 0, err
	}
	raw, err := os.ReadFile(tokPath)
	if err != nil {
		return 0, err
	}
	if err := writeFile(filepath.Join(dir, "tokenizer.json"), raw); err != nil {
		return 0, err
	}
	// The chat template travels with the tokenizer when it sits beside it.
	if tc, err := os.ReadFile(filepath.Join(filepath.Dir(tokPath), "tokenizer_config.json")); err == nil {
		if err := os.WriteFile(filepath.Join(dir, "tokenizer_config.json"), tc, 0o644); err != nil {
			return 0, err
		}
	}
	return tok.VocabSize(), nil
}

func loadTokenizer(dir string) (*tokenizer.Tokenizer, error) {
	return tokenizer.Load(filepath.Join(dir, "tokenizer.json"))
}

func tokenizeCmd() *cobra.Command {
	var dir string
	var decode bool
	cmd := &cobra.Command{
		Use:   "tokenize",
		Short: "Print the token ids of stdin as a JSON array (--decode: the reverse)",
		Example: `  echo -n "Hello, world" | agemem-train tokenize --model runs/tiny
  echo "[9707, 11, 1879]" | agemem-train tokenize --model runs/tiny --decode`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			tok, err := loadTokenizer(dir)
			if err != nil {
				return err
			}
			in, err := io.ReadAll(cmd.InOrStdin())
			if err != nil {
				return err
			}
			if decode {
				var ids []int
				if err := json.Unmarshal(in, &ids); err != nil {
					return fmt.Errorf("stdin must be a JSON array of token ids: %w", jsonerr.Explain(err))
				}
				for _, id := range ids {
					if id < 0 || id >= tok.VocabSize() {
						return fmt.Errorf("token id %d is outside the vocabulary of %d", id, tok.VocabSize())
					}
				}
				fmt.Fprint(cmd.OutOrStdout(), tok.Decode(ids, false))
				return nil
			}
			ids := tok.Encode(string(in))
			if ids == nil {
				ids = []int{}
			}
			b, _ := json.Marshal(ids)
			fmt.Fprintln(cmd.OutOrStdout(), string(b))
			return nil
		},
	}
	cmd.Flags().StringVar(&dir, "model", "", "model directory holding tokenizer.json")
	cmd.Flags().BoolVar(&decode, "decode", false, "read ids, print text")
	cmd.MarkFlagRequired("model")
	return cmd
}

func mergeCmd() *cobra.Command {
	var base, adapter, out string
	cmd := &cobra.Command{
		Use:   "merge",
		Short: "Fold a LoRA adapter (PEFT layout) into its base model and write a full Hugging Face directory",
		Long: `Every weight the adapter targets becomes W + (lora_alpha/r)·B·A in the base's
dtype; the other tensors, config.json and the tokenizer files are copied. The
result loads in agemem, transformers, vLLM, and exports to GGUF.`,
		Example: "  agemem-train merge --base runs/tiny --adapter checkpoints/step-500/adapter --out runs/merged",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if base == "" || adapter == "" || out == "" {
				return fmt.Errorf("--base, --adapter and --out are required")
			}
			if err := lora.Merge(base, adapter, out); err != nil {
				return err
			}
			fmt.Fprintf(cmd.ErrOrStderr(), "wrote %s\n", out)
			return nil
		},
	}
	cmd.Flags().StringVar(&base, "base", "", "base model directory")
	cmd.Flags().StringVar(&adapter, "adapter", "", "adapter directory (adapter_config.json, adapter_model.safetensors)")
	cmd.Flags().StringVar(&out, "out", "", "output directory for the merged model (required)")
	return cmd
}
