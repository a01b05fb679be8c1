package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"text/tabwriter"

	"github.com/mattn/go-isatty"
	"github.com/spf13/cobra"

	"github.com/agemem/agemem/config"
	"github.com/agemem/agemem/env"
	"github.com/agemem/agemem/kernels/device"
	"github.com/agemem/agemem/memtools"
	"github.com/agemem/agemem/model/decode"
	"github.com/agemem/agemem/model/qwen"
	"github.com/agemem/agemem/rl/reward"
	"github.com/agemem/agemem/rl/rollout"
	"github.com/agemem/agemem/rl/trainer"
)

func trainCmd(g *globals) *cobra.Command {
	var resume string
	var dryRun bool
	cmd := &cobra.Command{
		Use:   "train",
		Short: "Train the policy to manage its memory with step-wise GRPO (AgeMem)",
		Long: `Starts from rl.init (an SFT policy or any Hugging Face checkpoint) and, for
rl.steps steps, plays rl.k three-stage rollouts of rl.batch_tasks tasks from
data.train (each rollout with a fresh long-term memory, generation batched
across all of them), scores each with the composite reward of the reward
section, normalises rewards within each task's group, broadcasts the
advantage to every policy call of the rollout and updates the policy with
the clipped surrogate and a k3 KL penalty to the frozen starting policy.
Writes to rl.out: metrics.jsonl (reward and every component, tool calls,
prompt tokens, KL, clip fraction, entropy, step and rollout time),
rollouts.jsonl (every rollout's reward components, answer, tool calls),
reward.png, kl.png,
checkpoint-N/ (resume with --resume) and policy/.`,
		Example: `  agemem-train train --config configs/tiny.yaml
  agemem-train train --config configs/tiny.yaml --set rl.steps=40 --set reward.w_task=0.5
  agemem-train train --config configs/tiny.yaml --resume runs/tiny/rl/checkpoint-10`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg, err := g.load()
			if err != nil {
				return err
			}
			if dryRun {
				return printPlan(cmd.OutOrStdout(), cfg)
			}
			res, err := trainer.Run(cmd.Context(), trainer.Options{Config: cfg, YAML: cfg.YAML(), Resume: resume,
				Log: cmd.ErrOrStderr(), TTY: isatty.IsTerminal(os.Stderr.Fd())})
			if err != nil {
				return err
			}
			if n := len(res.Steps); n > 0 {
				fmt.Fprintf(cmd.OutOrStdout(), "mean reward: step 1 %.3f, step %d %.3f\n", res.Steps[0].Reward, res.Steps[n-1].Step, res.Steps[n-1].Reward)
			}
			fmt.Fprintf(cmd.OutOrStdout(), "policy written to %s\n", res.Policy)
			return nil
		},
	}
	cmd.Flags().StringVar(&resume, "resume", "", "checkpoint directory to continue from")
	cmd.Flags().BoolVar(&dryRun, "dry-run", false, "validate the config and the model, print the memory a run needs, and stop")
	return cmd
}

// printPlan is --dry-run: the config is valid (it loaded), the model's
// config.json is read, and the memory of a step is estimated.
func printPlan(w io.Writer, cfg config.Config) error {
	mc, err := qwen.LoadConfig(cfg.RL.Init)
	if err != nil {
		return fmt.Errorf("rl.init: %w", err)
	}
	h, hd, L := float64(mc.HiddenSize), float64(mc.HeadDim), float64(mc.Layers)
	qw, kvw, inter := float64(mc.Heads)*hd, float64(mc.KVHeads)*hd, float64(mc.Intermediate)
	var params, trainable float64
	for _, p := range qwen.Params(mc) {
		n := 1.0
		for _, d := range p.Shape {
			n *= float64(d)
		}
		params += n
		if p.Role == qwen.Weight && slices.Contains(cfg.LoRA.TargetModules, p.Target) {
			trainable += float64(cfg.LoRA.R) * float64(p.Shape[0]+p.Shape[1])
		}
	}
	if !cfg.LoRA.Enabled {
		trainable = params
	}
	rc := cfg.RL
	gib := func(b float64) string { return fmt.Sprintf("%.2f GiB", b/(1<<30)) }
	weights := 4 * params // f32 master weights
	ref := 4 * params     // the frozen reference (shared with the base under LoRA)
	if cfg.LoRA.Enabled {
		ref = 0
	}
	optimizer := 12 * trainable // gradient + two AdamW moments, f32
	engine := 4 * params        // the rollout engine's copy of the weights
	seqs := float64(rc.K * rc.BatchTasks)
	kv := seqs * float64(cfg.Agent.ContextBudget+cfg.Agent.ResponseBudget) * L * 2 * kvw * 4
	// Activations the tape holds per token and layer (inputs of each op and
	// their gradients), measured at 63 KiB/token on the tiny default; with
	// recomputation one layer's worth plus each layer's input.
	act := float64(rc.BatchTokens) * 4 * L * (12*h + 4*qw + 4*kvw + 5*inter)
	if rc.Recompute {
		act = float64(rc.BatchTokens) * 4 * (L*h + 12*h + 4*qw + 4*kvw + 5*inter)
	}
	logits := float64(rc.BatchTokens) * float64(mc.VocabSize) * 4 * 2
	total := weights + ref + optimizer + engine + kv + act + logits
	fmt.Fprintf(w, "config valid; policy %s: %s, %d layers, hidden %d, %.2fM parameters, %.2fM trainable (%s)\n",
		rc.Init, mc.ModelType, mc.Layers, mc.HiddenSize, params/1e6, trainable/1e6, map[bool]string{true: "LoRA", false: "full"}[cfg.LoRA.Enabled])
	fmt.Fprintf(w, "a step: %d tasks x %d rollouts, contexts up to %d + %d tokens, micro-batches of %d tokens\n", rc.BatchTasks, rc.K, cfg.Agent.ContextBudget, cfg.Agent.ResponseBudget, rc.BatchTokens)
	fmt.Fprintf(w, "memory per device (device cpu; one device until multi-GPU lands):\n")
	for _, l := range []struct {
		name string
		b    float64
	}{{"weights (f32 masters)", weights}, {"reference policy", ref}, {"gradients + AdamW moments", optimizer},
		{"rollout engine weights", engine}, {"KV caches of all rollouts (upper bound)", kv}, {"activations of a micro-batch", act},
		{"vocabulary logits and gradient", logits}, {"total (approximate)", total}} {
		fmt.Fprintf(w, "  %-42s %s\n", l.name, gib(l.b))
	}
	return nil
}

// evalRow is one policy's line of the comparison.
type evalRow struct {
	Policy       string             `json:"policy"`
	Tasks        int                `json:"tasks"`
	J            float64            `json:"j"`
	EM           float64            `json:"em"`
	MQ           float64            `json:"mq"`
	Answered     float64            `json:"answered"`
	PromptTokens float64            `json:"avg_prompt_tokens"`
	ToolCalls    map[string]float64 `json:"avg_tool_calls"`
	FormatErrors float64            `json:"avg_format_errors"`
}

func evalCmd(g *globals) *cobra.Command {
	var trained, norl string
	cmd := &cobra.Command{
		Use:   "eval",
		Short: "Compare No-Memory, AgeMem-noRL and AgeMem on held-out tasks",
		Long: `Plays eval.tasks tasks of data.eval with three policies: No-Memory (never
calls a tool), AgeMem-noRL (rl.init: the tools without RL) and AgeMem (the
GRPO-trained policy in rl.out/policy), greedy decoding. Reports, as the
paper's Tables 2-4: the judge score J (reward.judge), exact match, memory
quality MQ (how well the stored entries match the supporting facts: the F1
of facts covered and entries relevant, an entry matching a fact at token F1
>= reward.storage_f1), average prompt tokens at answer time and tool calls
per task. Writes the table as JSON to eval.out.`,
		Example: `  agemem-train eval --config configs/tiny.yaml
  agemem-train eval --config configs/tiny.yaml --trained runs/other/policy --set eval.tasks=0`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg, err := g.load()
			if err != nil {
				return err
			}
			if trained == "" {
				trained = filepath.Join(cfg.RL.Out, "policy")
			}
			if norl == "" {
				norl = cfg.RL.Init
			}
			var tasks []env.Task
			err = env.StreamHotpotFile(cfg.Data.Eval, func(t env.Task) error {
				if cfg.Eval.Tasks == 0 || len(tasks) < cfg.Eval.Tasks {
					tasks = append(tasks, t)
				}
				return nil
			})
			if err != nil {
				return err
			}
			var rows []evalRow
			for _, pc := range []struct{ name, dir string }{{"No-Memory", ""}, {"AgeMem-noRL", norl}, {"AgeMem", trained}} {
				row, err := evaluate(cmd.Context(), cfg, pc.name, pc.dir, tasks)
				if err != nil {
					return fmt.Errorf("%s: %w", pc.name, err)
				}
				rows = append(rows, row)
			}
			printEval(cmd.OutOrStdout(), rows)
			if cfg.Eval.Out != "" {
				if err := os.MkdirAll(filepath.Dir(cfg.Eval.Out), 0o755); err != nil {
					return err
				}
				f, err := os.Create(cfg.Eval.Out)
				if err != nil {
					return err
				}
				defer f.Close()
				return writeJSON(f, rows)
			}
			return nil
		},
	}
	cmd.Flags().StringVar(&trained, "trained", "", "the trained policy (default: rl.out/policy)")
	cmd.Flags().StringVar(&norl, "norl", "", "the policy without RL (default: rl.init)")
	return cmd
}

// evaluate plays every task with one policy (dir "" is No-Memory).
func evaluate(ctx context.Context, cfg config.Config, name, dir string, tasks []env.Task) (evalRow, error) {
	row := evalRow{Policy: name, Tasks: len(tasks), ToolCalls: map[string]float64{}}
	judge := reward.Judge(reward.F1Judge{})
	if cfg.Reward.Judge == "em" {
		judge = reward.EMJudge{}
	}
	var results []env.Result
	if dir == "" {
		for i, t := range tasks {
			r, err := env.RunEpisode(ctx, env.NewNoMemory(t), rollout.NewRuntime(cfg, uint64(i), nil), t, rollout.EpisodeConfig(cfg))
			if err != nil {
				return row, err
			}
			results = append(results, r)
		}
	} else {
		be, err := device.Open(cfg.Model.Device, os.Stderr)
		if err != nil {
			return row, err
		}
		pol, err := decode.LoadGenerator(be, dir, "", decode.Sampling{MaxTokens: cfg.Agent.ResponseBudget})
		if err != nil {
			return row, err
		}
		defer pol.Model.Close()
		// One rollout per task, all decoded together.
		rs, _, err := rollout.Run(ctx, pol, tasks, rollout.Options{K: 1, Seed: uint64(cfg.Seed), Episode: rollout.EpisodeConfig(cfg),
			NewRuntime: func(i int) *memtools.Runtime { return rollout.NewRuntime(cfg, uint64(i), pol.Tokenizer) }})
		if err != nil {
			return row, err
		}
		for _, r := range rs {
			results = append(results, r.Result)
		}
	}
	n := float64(len(results))
	for i, r := range results {
		score := 0.0
		if r.HasAnswer {
			s, err := judge.Score(ctx, tasks[i].Question, tasks[i].Answer, r.Answer)
			if err != nil {
				return row, err
			}
			score = s
			row.Answered += 1 / n
		}
		row.J += score / n
		row.EM += r.EM / n
		row.MQ += memoryQuality(r, tasks[i], cfg.Reward.StorageF1Threshold) / n
		row.PromptTokens += float64(r.ContextTokens) / n
		for k, v := range r.ToolCalls() {
			row.ToolCalls[k] += float64(v) / n
		}
		row.FormatErrors += float64(r.FormatErrors()) / n
	}
	return row, nil
}

// memoryQuality is the F1 of the long-term memory after the episode against
// the supporting facts: recall is the share of facts some entry matches,
// precision the share of entries that match some fact (token F1 >= thr),
// a deterministic stand-in for the LLM evaluator of Appendix C.2.
func memoryQuality(r env.Result, t env.Task, thr float64) float64 {
	entries := r.LTM[2]
	if len(entries) == 0 || len(t.SupportingFacts) == 0 {
		return 0
	}
	covered, relevant := 0, 0
	for _, f := range t.SupportingFacts {
		for _, e := range entries {
			if env.F1(e.Content, f) >= thr {
				covered++
				break
			}
		}
	}
	for _, e := range entries {
		for _, f := range t.SupportingFacts {
			if env.F1(e.Content, f) >= thr {
				relevant++
				break
			}
		}
	}
	p, rc := float64(relevant)/float64(len(entries)), float64(covered)/float64(len(t.SupportingFacts))
	if p+rc == 0 {
		return 0
	}
	return 2 * p * rc / (p + rc)
}

func printEval(w io.Writer, rows []evalRow) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "method\ttasks\tJ\tEM\tMQ\tanswered\tavg prompt tokens\tadd\tupdate\tdelete\tretrieve\tsummary\tfilter\tformat errors")
	for _, r := range rows {
		fmt.Fprintf(tw, "%s\t%d\t%.3f\t%.3f\t%.3f\t%.2f\t%.0f", r.Policy, r.Tasks, r.J, r.EM, r.MQ, r.Answered, r.PromptTokens)
		for _, t := range []string{memtools.ToolAdd, memtools.ToolUpdate, memtools.ToolDelete, memtools.ToolRetrieve, memtools.ToolSummary, memtools.ToolFilter} {
			fmt.Fprintf(tw, "\t%.2f", r.ToolCalls[t])
		}
		fmt.Fprintf(tw, "\t%.2f\n", r.FormatErrors)
	}
	tw.Flush()
}
