package main

import (
	"fmt"
	"math"
	"os"

	"github.com/mattn/go-isatty"
	"github.com/spf13/cobra"

	"github.com/agemem/agemem/env"
	"github.com/agemem/agemem/env/pretrain"
	"github.com/agemem/agemem/kernels/device"
	"github.com/agemem/agemem/model/qwen"
	"github.com/agemem/agemem/model/sft"
	"github.com/agemem/agemem/setup"
)

func sftCmd(g *globals) *cobra.Command {
	var resume string
	var genEval int
	cmd := &cobra.Command{
		Use:   "sft",
		Short: "Supervised fine-tuning on chat JSONL (loss on the assistant's tokens)",
		Long: `Fine-tunes the policy in model.path on sft.data: chat JSONL, one OpenAI-style
{"messages": [...]} record per line (system, user, assistant with content or
tool_calls, tool results). Records are rendered with the model's chat template
and the loss covers only assistant tokens (sft.loss_on). A held-out share
(sft.eval_fraction) gives the eval loss. Full fine-tuning, or a LoRA adapter
with lora.enabled. Writes to sft.out: metrics.jsonl, loss.png, checkpoint-N/
(resumable with --resume) and policy/ (a Hugging Face directory, or a PEFT
adapter to load on top of model.path). At the end it generates from held-out
prompts and reports how many responses the AgeMem parser accepts.`,
		Example: `  agemem-train sft --config configs/tiny.yaml
  agemem-train sft --config configs/tiny.yaml --set lora.enabled=true --set sft.steps=50
  agemem-train sft --config configs/tiny.yaml --resume runs/tiny/sft/checkpoint-100`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg, err := g.load()
			if err != nil {
				return err
			}
			if genEval < 0 {
				return fmt.Errorf("--gen-eval %d: want 0 (none) or more", genEval)
			}
			o := setup.SFT(cfg)
			o.Resume, o.Log, o.TTY, o.GenEval = resume, cmd.ErrOrStderr(), isatty.IsTerminal(os.Stderr.Fd()), genEval
			if genEval > 0 {
				if o.GenDevice, err = device.Open(cfg.Model.Device, o.Log); err != nil {
					return err
				}
			}
			res, err := sft.Run(cmd.Context(), o)
			if err != nil {
				return err
			}
			out := cmd.OutOrStdout()
			fmt.Fprintf(out, "steps %d, %.0f tokens/s\n", res.Steps, res.TokensPerSec)
			fmt.Fprintf(out, "train loss %.4f -> %.4f\n", res.TrainLossStart, res.TrainEnd)
			if math.IsNaN(res.EvalLossStart) { // resumed: the start was measured by the first run
				fmt.Fprintf(out, "held-out loss %.4f\n", res.EvalLoss)
			} else {
				fmt.Fprintf(out, "held-out loss %.4f -> %.4f\n", res.EvalLossStart, res.EvalLoss)
			}
			if !math.IsNaN(res.EvalCopyLoss) {
				fmt.Fprintf(out, "held-out loss on copied tokens (names and facts from the context) %.4f -> %.4f\n", res.EvalCopyLossStart, res.EvalCopyLoss)
			}
			if res.ParseN > 0 {
				fmt.Fprintf(out, "held-out responses the AgeMem parser accepts: %d/%d (%.1f%%)\n", res.ParseOK, res.ParseN, 100*float64(res.ParseOK)/float64(res.ParseN))
			}
			fmt.Fprintf(out, "policy written to %s\n", res.Policy)
			return nil
		},
	}
	cmd.Flags().StringVar(&resume, "resume", "", "checkpoint directory to continue from")
	cmd.Flags().IntVar(&genEval, "gen-eval", 64, "held-out prompts to generate from at the end (0: none)")
	return cmd
}

func pretrainCmd(g *globals) *cobra.Command {
	var resume string
	cmd := &cobra.Command{
		Use:   "pretrain",
		Short: "Teach a model trained from scratch to copy from its context (induction pretraining)",
		Long: `Trains pretrain.init (a random init from init-model, with its tokenizer) on
sequences of random word pieces that repeat after a filler gap of random
length, the loss on the repeat only: the one thing that predicts it is
finding where the current token appeared before and taking what followed
(an induction head). An agent copies names it has never seen from what it
is told into what it stores, and from what it retrieves into its answer; a
tiny model does not learn that from SFT data alone in a CPU budget. Writes
to pretrain.out: metrics.jsonl (the copy loss, held out every
pretrain.eval_every steps), loss.png, checkpoint-N/ and policy/, which SFT
starts from (model.path). Not needed for pretrained checkpoints.`,
		Example: `  agemem-train init-model --config configs/tiny.yaml --tokenizer runs/tiny/tok/tokenizer.json --out runs/tiny/init
  agemem-train pretrain --config configs/tiny.yaml
  agemem-train pretrain --config configs/tiny.yaml --set pretrain.steps=4000`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg, err := g.load()
			if err != nil {
				return err
			}
			o := setup.Pretrain(cfg)
			o.Resume, o.Log, o.TTY = resume, cmd.ErrOrStderr(), isatty.IsTerminal(os.Stderr.Fd())
			res, err := pretrain.Run(cmd.Context(), o)
			if err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "held-out copy loss %.3f -> %.3f nats per token after %d steps\npolicy written to %s\n",
				res.CopyLossStart, res.CopyLoss, res.Steps, res.Policy)
			return nil
		},
	}
	cmd.Flags().StringVar(&resume, "resume", "", "checkpoint directory to continue from")
	return cmd
}

func probeCmd() *cobra.Command {
	var dir, data string
	var first int
	var seed uint64
	cmd := &cobra.Command{
		Use:   "probe",
		Short: "Score a model, step by step, on the reasoning of \"which was earlier\" comparisons",
		Long: `Feeds each "which was earlier" question of a task file to the model in
the QA format pretraining teaches (pretrain.qa with pretrain.reason): the
facts among distractor sentences, the question, then the reasoning
teacher's "<think>1905: Trugith Works. 1838: Wipynd Labs. The earlier is
1838: Wipynd Labs.</think>". Every position sees the teacher's tokens
before it, so each step is scored on its own: the restated options, the
verdict's year, the first token of the name it copies (and how often the
other option's first token is predicted instead) and the name's later
tokens. A policy that writes the right year and then copies the wrong
name fails at the third: the copy is chosen by the year four digit
tokens back, not by the token before it.`,
		Example: `  agemem-train pretrain --config configs/tiny.yaml --set pretrain.text=synth --set pretrain.qa=0.5 --set pretrain.reason=true --set pretrain.out=runs/reason
  agemem-train probe --model runs/reason/policy --data data/synth-eval.json`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			tasks, err := env.LoadHotpot(data)
			if err != nil {
				return err
			}
			if first > 0 && first < len(tasks) {
				tasks = tasks[:first]
			}
			tok, err := loadTokenizer(dir)
			if err != nil {
				return err
			}
			m, err := qwen.Load(dir)
			if err != nil {
				return err
			}
			defer m.Close()
			forward := func(ids []int) ([]float32, error) { return m.Forward(ids, m.NewCache(len(ids))) }
			v, err := pretrain.ProbeVerdicts(forward, tok, tasks, seed)
			if err != nil {
				return fmt.Errorf("%s: %w", data, err)
			}
			fmt.Fprintln(cmd.OutOrStdout(), v)
			return nil
		},
	}
	cmd.Flags().StringVar(&dir, "model", "", "model directory (config.json, tokenizer.json, safetensors)")
	cmd.Flags().StringVar(&data, "data", "data/synth-eval.json", "task file (HotpotQA JSON)")
	cmd.Flags().IntVar(&first, "first", 0, "probe only the first N tasks (0: all)")
	cmd.Flags().Uint64Var(&seed, "seed", 1, "seed of the distractor sentences drawn beside the facts")
	cmd.MarkFlagRequired("model")
	return cmd
}
