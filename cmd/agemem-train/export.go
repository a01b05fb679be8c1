package main

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/mattn/go-isatty"
	"github.com/spf13/cobra"

	"github.com/agemem/agemem/model/gguf"
	"github.com/agemem/agemem/model/train"
	"github.com/agemem/agemem/setup"
)

const exportLong = `Writes the Qwen2/Qwen3 checkpoint (a Hugging Face directory, the output of
sft or train, or a LoRA adapter directory, merged into its base first) as a
GGUF v3 file with llama.cpp's metadata keys and tensor names, the tokenizer
as tokenizer.ggml.* and the chat template. --outtype stores the matrices as
f32, f16, bf16 or q8_0; norms and biases stay f32.

With --to ollama the file is uploaded to the Ollama server (ollama.host or
OLLAMA_HOST) as a blob and model NAME is created from it, with the Qwen chat
template, the <|im_end|> stop and the AgeMem system prompt
(agent.system_prompt), so that ` + "`ollama run NAME`" + ` talks to the policy and
the policy can be served with serve.backend ollama.`

func exportCmd(g *globals) *cobra.Command {
	var format, outType, out, to, name string
	cmd := &cobra.Command{
		Use:   "export CHECKPOINT",
		Short: "Export a policy as GGUF (llama.cpp, Ollama), or straight into Ollama",
		Long:  exportLong,
		Example: `  agemem-train export --format gguf --outtype q8_0 --out runs/tiny/policy.gguf runs/tiny/rl/policy
  agemem-train export --to ollama --name agemem-tiny runs/tiny/rl/policy`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			cfg, err := g.load()
			if err != nil {
				return err
			}
			if format != "gguf" {
				return fmt.Errorf("--format %q: only gguf is written", format)
			}
			typ, err := gguf.ParseType(outType)
			if err != nil {
				return fmt.Errorf("--outtype: %w", err)
			}
			switch to {
			case "":
				if out == "" {
					return fmt.Errorf("give --out FILE (or --to ollama --name NAME)")
				}
			case "ollama":
				if name == "" {
					return fmt.Errorf("--to ollama needs --name NAME, the model Ollama will know it by")
				}
			default:
				return fmt.Errorf("--to %q: only ollama is known", to)
			}
			path := out
			if path == "" {
				tmp, err := os.MkdirTemp("", "agemem-export-")
				if err != nil {
					return err
				}
				defer os.RemoveAll(tmp)
				path = filepath.Join(tmp, "model.gguf")
			}
			label := name
			if label == "" {
				label = filepath.Base(filepath.Clean(args[0]))
			}
			w := cmd.ErrOrStderr()
			var pr *train.Progress
			progress := func(done, total int) {
				if pr == nil {
					pr = train.NewProgress(w, total, isatty.IsTerminal(os.Stderr.Fd()))
				}
				pr.Update(done, "tensors written")
			}
			sum, err := gguf.ExportQwenFile(args[0], path, gguf.ExportOptions{Type: typ, Name: label, Progress: progress})
			if err != nil {
				return err
			}
			if err := printGGUF(w, path, sum); err != nil {
				return err
			}
			if to == "" {
				fmt.Fprintf(w, "wrote %s\n", path)
				return nil
			}
			host, err := setup.PublishOllama(cmd.Context(), cfg, args[0], path, name, func(s string) { fmt.Fprintf(w, "ollama: %s\n", s) })
			if err != nil {
				return err
			}
			fmt.Fprintf(w, "created %s on %s: ollama run %s\n", name, host, name)
			return nil
		},
	}
	cmd.Flags().StringVar(&format, "format", "gguf", "file format (gguf)")
	cmd.Flags().StringVar(&outType, "outtype", "f16", "type of the weight matrices: f32, f16, bf16 or q8_0")
	cmd.Flags().StringVar(&out, "out", "", "the GGUF file to write")
	cmd.Flags().StringVar(&to, "to", "", "ollama: upload to the Ollama server and create --name")
	cmd.Flags().StringVar(&name, "name", "", "model name for --to ollama (and general.name)")
	return cmd
}

// printGGUF says what an export wrote: the architecture, the tensors by
// type, the parameters and the file's size.
func printGGUF(w io.Writer, path string, sum gguf.Summary) error {
	st, err := os.Stat(path)
	if err != nil {
		return err
	}
	var types []string
	for t, n := range sum.Types {
		types = append(types, fmt.Sprintf("%d %v", n, t))
	}
	slices.Sort(types)
	fmt.Fprintf(w, "gguf: %s, %d tensors (%s), %.1fM parameters, %.1f MiB\n", sum.Arch, sum.Tensors, strings.Join(types, ", "), float64(sum.Params)/1e6, float64(st.Size())/(1<<20))
	return nil
}
