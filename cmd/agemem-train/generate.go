package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/mattn/go-isatty"
	"github.com/spf13/cobra"

	"github.com/agemem/agemem/kernels/device"
	"github.com/agemem/agemem/llm/native"
	"github.com/agemem/agemem/model/chat"
	"github.com/agemem/agemem/model/engine"
	"github.com/agemem/agemem/model/qwen"
)

func generateCmd() *cobra.Command {
	var dir, system, adapter, dev, quantize, prompt string
	var raw, verbose bool
	var s engine.Sampling
	cmd := &cobra.Command{
		Use:   "generate [PROMPT]",
		Short: "Run a model on a prompt, or chat with it from the terminal, streaming its replies",
		Long: `With a prompt (an argument, --prompt, or text piped on stdin) the model answers it
once and the command exits; at a terminal without one it chats: one user message a
line, the conversation kept, until an empty line or end of input. The prompt goes
through the model's chat template as a user turn (after --system), or as it is
with --raw. --verbose prints, after each reply, the prompt's and the reply's token
counts, times and rates, as ollama run --verbose does.`,
		Example: `  agemem-train generate --model checkpoints/tiny "Where was Marla Quenby born?"
  echo "Name a colour." | agemem-train generate --model ~/models/Qwen2.5-0.5B-Instruct --verbose
  agemem-train generate --model ~/models/Qwen3-0.6B --raw --prompt "The capital of France is" --max-tokens 8
  agemem-train generate --model runs/tiny/rl/policy --temperature 0.7 --max-tokens 128`,
		Args: cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := s.Check(); err != nil { // before the model loads and a message is typed
				return fmt.Errorf("sampling flags: %w", err)
			}
			if len(args) == 1 {
				if prompt != "" {
					return fmt.Errorf("give the prompt once: as an argument or with --prompt")
				}
				prompt = args[0]
			}
			in := cmd.InOrStdin()
			if f, ok := in.(*os.File); prompt == "" && ok && !isatty.IsTerminal(f.Fd()) {
				text, err := io.ReadAll(in)
				if err != nil {
					return fmt.Errorf("stdin: %w", err)
				}
				prompt = strings.TrimRight(string(text), "\n") // empty: no prompt, nothing to chat about either
				in = strings.NewReader("")
			}
			if raw && prompt == "" {
				return fmt.Errorf("--raw needs a prompt (an argument, --prompt or stdin): a raw prompt has no conversation to keep")
			}
			t0 := time.Now()
			be, err := device.Open(dev, cmd.ErrOrStderr())
			if err != nil {
				return err
			}
			p, err := native.Open(be, dir, adapter, qwen.Options{Quantize: quantize})
			if err != nil {
				return err
			}
			defer p.Model.Close()
			for _, name := range []string{"<|im_end|>", "<|endoftext|>"} {
				if id, ok := p.Tokenizer.TokenID(name); ok {
					s.StopIDs = append(s.StopIDs, id)
				}
			}
			g := &generation{cp: p, s: s, out: cmd.OutOrStdout(), verbose: verbose, stats: cmd.ErrOrStderr(), load: time.Since(t0)}
			if raw {
				_, err := g.reply(cmd.Context(), p.Tokenizer.Encode(prompt))
				return err
			}
			var msgs []chat.Message
			if system != "" {
				msgs = append(msgs, chat.Message{Role: "system", Content: system})
			}
			if prompt != "" {
				_, err := g.turn(cmd.Context(), append(msgs, chat.Message{Role: "user", Content: prompt}))
				return err
			}
			lines := bufio.NewScanner(in)
			lines.Buffer(make([]byte, 1<<20), 1<<24)
			for {
				fmt.Fprint(cmd.ErrOrStderr(), "> ")
				if !lines.Scan() || strings.TrimSpace(lines.Text()) == "" {
					return lines.Err()
				}
				msgs = append(msgs, chat.Message{Role: "user", Content: lines.Text()})
				reply, err := g.turn(cmd.Context(), msgs)
				if err != nil {
					return err
				}
				msgs = append(msgs, chat.Message{Role: "assistant", Content: reply})
			}
		},
	}
	cmd.Flags().StringVar(&dir, "model", "", "model directory (config.json, tokenizer.json, safetensors)")
	cmd.Flags().StringVar(&prompt, "prompt", "", "answer this prompt and exit (also: an argument, or text piped on stdin)")
	cmd.Flags().BoolVar(&raw, "raw", false, "feed the prompt as it is, without the chat template")
	cmd.Flags().BoolVar(&verbose, "verbose", false, "print token counts, times and rates after each reply (stderr)")
	cmd.Flags().StringVar(&system, "system", "", "system prompt")
	cmd.Flags().StringVar(&adapter, "adapter", "", "LoRA adapter directory (PEFT layout) to apply")
	cmd.Flags().StringVar(&dev, "device", "auto", "auto (a GPU if found, else CPU), cpu, cuda or cuda:N")
	cmd.Flags().StringVar(&quantize, "quantize", "", "hold the weights as q8_0 (GGUF's 8-bit blocks: half the bytes of bf16 a CPU decode reads) or as stored (\"\")")
	cmd.Flags().Float64Var(&s.Temperature, "temperature", 0.7, "sampling temperature (0: greedy)")
	cmd.Flags().Float64Var(&s.TopP, "top-p", 0.9, "nucleus mass")
	cmd.Flags().IntVar(&s.TopK, "top-k", 0, "keep the k likeliest tokens (0: all)")
	cmd.Flags().IntVar(&s.MaxTokens, "max-tokens", 256, "reply length limit")
	cmd.Flags().Uint64Var(&s.Seed, "seed", 1, "sampling seed")
	cmd.MarkFlagRequired("model")
	return cmd
}

// generation streams replies of one loaded model and times them.
type generation struct {
	cp      *native.Checkpoint
	s       engine.Sampling
	out     io.Writer
	verbose bool
	stats   io.Writer
	load    time.Duration // reported once, with the first reply
}

// turn renders the conversation with the template and streams the reply.
func (g *generation) turn(ctx context.Context, msgs []chat.Message) (string, error) {
	text, err := chat.Render(msgs, chat.Options{Template: g.cp.Template, AddGenerationPrompt: true})
	if err != nil {
		return "", err
	}
	return g.reply(ctx, g.cp.Tokenizer.Encode(text))
}

// reply streams the continuation of ids to out, then (verbose) its figures:
// the prompt's evaluation is the time to the first sampled token, the
// reply's the rest.
func (g *generation) reply(ctx context.Context, ids []int) (string, error) {
	dec := g.cp.Tokenizer.NewDecoder(true)
	var reply strings.Builder
	t0 := time.Now()
	var first time.Time
	stream := func(id int) {
		if first.IsZero() {
			first = time.Now()
		}
		piece := dec.Add(id)
		reply.WriteString(piece)
		fmt.Fprint(g.out, piece)
	}
	gen, err := engine.GenerateStream(ctx, g.cp.Model, ids, g.s, g.cp.Tokenizer, stream)
	if err != nil {
		return "", err
	}
	end := time.Now()
	rest := dec.Flush()
	reply.WriteString(rest)
	fmt.Fprintln(g.out, rest)
	if g.verbose {
		prompt, eval := first.Sub(t0), end.Sub(first)
		rate := func(n int, d time.Duration) float64 { return float64(n) / max(d.Seconds(), 1e-9) }
		if g.load > 0 {
			fmt.Fprintf(g.stats, "load duration:        %v\n", g.load.Round(time.Millisecond))
			g.load = 0
		}
		fmt.Fprintf(g.stats, "total duration:       %v\n", end.Sub(t0).Round(time.Millisecond))
		fmt.Fprintf(g.stats, "prompt eval count:    %d token(s)\n", len(ids))
		fmt.Fprintf(g.stats, "prompt eval duration: %v\n", prompt.Round(time.Microsecond))
		fmt.Fprintf(g.stats, "prompt eval rate:     %.2f tokens/s\n", rate(len(ids), prompt))
		fmt.Fprintf(g.stats, "eval count:           %d token(s)\n", len(gen.Tokens))
		fmt.Fprintf(g.stats, "eval duration:        %v\n", eval.Round(time.Microsecond))
		fmt.Fprintf(g.stats, "eval rate:            %.2f tokens/s\n", rate(len(gen.Tokens)-1, eval))
	}
	return reply.String(), nil
}
