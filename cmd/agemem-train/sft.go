package main

import (
	"fmt"
	"math"
	"os"

	"github.com/mattn/go-isatty"
	"github.com/spf13/cobra"

	"github.com/agemem/agemem/model/sft"
	"github.com/agemem/agemem/roles"
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
			o := roles.SFT(cfg)
			o.Resume, o.Log, o.TTY, o.GenEval = resume, cmd.ErrOrStderr(), isatty.IsTerminal(os.Stderr.Fd()), genEval
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
