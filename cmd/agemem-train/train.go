package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/mattn/go-isatty"
	"github.com/spf13/cobra"

	"github.com/agemem/agemem/env"
	"github.com/agemem/agemem/eval"
	"github.com/agemem/agemem/llm"
	"github.com/agemem/agemem/memtools"
	"github.com/agemem/agemem/rl"
	"github.com/agemem/agemem/setup"
)

func trainCmd(g *globals) *cobra.Command {
	var resume string
	var dryRun bool
	var deviceGiB float64
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
checkpoint-N/ (resume with --resume) and policy/.

Across processes and machines, launched by torchrun, Kubeflow or Slurm
(RANK/WORLD_SIZE/LOCAL_RANK/MASTER_ADDR/MASTER_PORT, PET_*, SLURM_*): rank
0 serves a JSON-RPC control endpoint, each rank trains on one device and
plays its share of each step's groups, and gradients are summed over
NCCL or a TCP ring; --dry-run prints the plan. With rl.engines the
rollouts run on vLLM or serve engines that load each adapter version.`,
		Example: `  agemem-train train --config configs/tiny.yaml
  agemem-train train --config configs/tiny.yaml --set rl.steps=40 --set reward.w_task=0.5
  agemem-train train --config configs/tiny.yaml --resume runs/tiny/rl/checkpoint-10
  torchrun --nnodes 2 --nproc-per-node 1 --node-rank 0 --master-addr node0 --master-port 29500 \
    --no-python agemem-train train --config run.yaml --set lora.enabled=true \
    --set 'rl.engines=[http://gpu3:8000/v1,http://gpu4:8000/v1]'`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg, err := g.load()
			if err != nil {
				return err
			}
			if dryRun {
				if !(deviceGiB > 0) {
					return fmt.Errorf("--device-gib %g: want a device's memory in GiB", deviceGiB)
				}
				return printClusterPlan(cmd.OutOrStdout(), cfg, deviceGiB)
			}
			res, err := runGRPO(cmd.Context(), cfg, resume, cmd.ErrOrStderr())
			if err != nil {
				return err
			}
			if n := len(res.Steps); n > 0 {
				fmt.Fprintf(cmd.OutOrStdout(), "mean reward: step 1 %.3f, step %d %.3f\n", res.Steps[0].Reward, res.Steps[n-1].Step, res.Steps[n-1].Reward)
			}
			if res.Policy != "" { // rank 0 writes the policy; the other ranks none
				fmt.Fprintf(cmd.OutOrStdout(), "policy written to %s\n", res.Policy)
			}
			return nil
		},
	}
	cmd.Flags().StringVar(&resume, "resume", "", "checkpoint directory to continue from")
	cmd.Flags().BoolVar(&dryRun, "dry-run", false, "validate the config and the model, print the cluster plan (ranks, devices, engines) and the memory a device needs, and stop")
	cmd.Flags().Float64Var(&deviceGiB, "device-gib", 24, "with --dry-run: each device's memory in GiB, to say whether the run fits (24: the paper's RTX 4090)")
	return cmd
}

// runGRPO trains rl.init in the AgeMem environment (setup.GRPO).
func runGRPO(ctx context.Context, cfg setup.Config, resume string, log io.Writer) (_ rl.Result, err error) {
	o, err := setup.GRPO(ctx, cfg, log)
	if err != nil {
		return rl.Result{}, err
	}
	// A rank of a run across processes joins it (cluster.go).
	finish, err := joinCluster(ctx, cfg, &o, log)
	if err != nil {
		return rl.Result{}, err
	}
	defer func() { finish(err) }()
	o.Resume, o.TTY = resume, isatty.IsTerminal(os.Stderr.Fd())
	if cfg.Data.Val != "" {
		tasks, err := env.LoadScored(cfg.Data.Val)
		if err != nil {
			return rl.Result{}, fmt.Errorf("data.val: %w", err)
		}
		tasks = tasks[:min(len(tasks), cfg.RL.ValTasks)]
		// The policy plays them as eval plays a row: greedily, in the
		// environment training plays, scored by the same judge.
		o.Validate = func(ctx context.Context, policy string) (float64, float64, error) {
			rows, err := eval.Run(ctx, eval.Options{Config: cfg, Tasks: tasks, Methods: []eval.Method{{Name: "validation", Dir: policy}}})
			if err != nil {
				return 0, 0, err
			}
			return rows[0].J.Mean, rows[0].J.SE, nil
		}
	}
	return rl.Train(ctx, o)
}

func evalCmd(g *globals) *cobra.Command {
	var trained, norl string
	var extra []string
	cmd := &cobra.Command{
		Use:   "eval",
		Short: "Compare No-Memory, AgeMem-noRL and AgeMem on held-out tasks",
		Long: `Plays eval.tasks tasks of data.eval with three policies: No-Memory (never
calls a tool), AgeMem-noRL (rl.init: the tools without RL) and AgeMem (the
GRPO-trained policy in rl.out/policy), greedy decoding, in the environment
training plays (the same runtime, embedder and summariser). Reports, as the
paper's Tables 2-4: the judge score J (reward.judge, the judge training
used), exact match, memory quality MQ (how well the stored entries match
the supporting facts: the F1 of facts covered and entries relevant, an
entry matching a fact at token F1 >= reward.storage_f1), each with its
standard error, J by question type, J on yes/no questions and the share of
them answered "yes" (a policy that cannot compare says one answer always),
average prompt tokens at answer time and tool calls per task. Writes the table as JSON to eval.out and a bar
chart beside it. --method NAME=DIR adds a row for another policy, e.g. the
paper's reward ablation (Table 4): a policy trained with only R_task
(--set reward.w_context=0 --set reward.w_memory=0 and no penalties) beside
the All-Returns one, on the same tasks. NAME=DIR,tools=ltm plays that row
with a tool subset (tools.subset: ltm or stm), the component ablation of
Figure 4: a policy trained with only the long-term memory tools.
NAME=ollama:MODEL and NAME=openai:MODEL play a model behind an API as the
AgeMem policy (ollama.host and ollama.format; openai.base_url and
openai.format), greedily, one task at a time: a model you bring in the
same table as the trained ones.`,
		Example: `  agemem-train eval --config configs/tiny.yaml
  agemem-train eval --config configs/tiny.yaml --trained runs/other/policy --set eval.tasks=0
  agemem-train eval --config configs/tiny.yaml --method Answer-Only=runs/answer-only/rl/policy
  agemem-train eval --config configs/tiny.yaml --method LTM-only=runs/ltm/rl/policy,tools=ltm
  agemem-train eval --config configs/tiny.yaml --method Qwen3-4B=ollama:qwen3:4b --set ollama.format=tools
  agemem-train eval --config configs/tiny.yaml --set data.eval=data/other.json --set eval.tasks=200`,
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
			tasks, err := env.LoadScored(cfg.Data.Eval)
			if err != nil {
				return fmt.Errorf("data.eval: %w", err)
			}
			if cfg.Eval.Tasks > 0 && len(tasks) > cfg.Eval.Tasks {
				tasks = tasks[:cfg.Eval.Tasks]
			}
			// Every policy is checked before any is played: a wrong path
			// found after the first rows' minutes of play wastes them.
			if !isModel(norl) {
				return fmt.Errorf("AgeMem-noRL: %s is not a model directory (no config.json); --norl or rl.init names it", norl)
			}
			if !isModel(trained) {
				return fmt.Errorf("AgeMem: %s is not a model directory (no config.json); train it first (agemem-train train) or name it with --trained", trained)
			}
			methods := []eval.Method{{Name: "No-Memory", Scripted: "no-memory"}, {Name: "AgeMem-noRL", Dir: norl}, {Name: "AgeMem", Dir: trained}}
			for _, m := range extra {
				method, err := parseMethod(cmd, cfg, m)
				if err != nil {
					return fmt.Errorf("--method %q: %w", m, err)
				}
				if slices.ContainsFunc(methods, func(x eval.Method) bool { return x.Name == method.Name }) {
					return fmt.Errorf("--method %q: the table already has a row %q", m, method.Name)
				}
				methods = append(methods, method)
			}
			rows, err := eval.Run(cmd.Context(), eval.Options{Config: cfg, Tasks: tasks, Log: cmd.ErrOrStderr(), Methods: methods})
			if err != nil {
				return err
			}
			eval.Print(cmd.OutOrStdout(), rows)
			if cfg.Eval.Out == "" {
				return nil
			}
			if err := eval.WriteJSON(cfg.Eval.Out, rows); err != nil {
				return err
			}
			png := strings.TrimSuffix(cfg.Eval.Out, filepath.Ext(cfg.Eval.Out)) + ".png"
			if err := eval.Chart(png, rows); err != nil {
				return err
			}
			fmt.Fprintf(cmd.ErrOrStderr(), "wrote %s and %s\n", cfg.Eval.Out, png)
			return nil
		},
	}
	cmd.Flags().StringVar(&trained, "trained", "", "the trained policy (default: rl.out/policy)")
	cmd.Flags().StringVar(&norl, "norl", "", "the policy without RL (default: rl.init)")
	cmd.Flags().StringArrayVar(&extra, "method", nil, "another row: NAME=DIR, NAME=ollama:MODEL or NAME=openai:MODEL, each optionally ,tools=ltm|stm: a policy to play on the same tasks (repeatable)")
	return cmd
}

func isModel(dir string) bool {
	_, err := os.Stat(filepath.Join(dir, "config.json"))
	return err == nil
}

// parseMethod reads eval's --method NAME=SPEC: SPEC is a model directory,
// ollama:MODEL or openai:MODEL, then ,key=value options; a directory
// whose name has a comma is taken whole when it exists.
func parseMethod(cmd *cobra.Command, cfg setup.Config, m string) (eval.Method, error) {
	name, spec, ok := strings.Cut(m, "=")
	if !ok || name == "" || spec == "" {
		return eval.Method{}, errors.New("want NAME=DIR, e.g. Answer-Only=runs/answer-only/rl/policy")
	}
	dir, opts, _ := strings.Cut(spec, ",")
	if isModel(spec) {
		dir, opts = spec, ""
	}
	method := eval.Method{Name: name, Dir: dir}
	for opt := range strings.SplitSeq(opts, ",") {
		if opt == "" {
			continue
		}
		k, v, _ := strings.Cut(opt, "=")
		if k != "tools" {
			return method, fmt.Errorf("unknown option %q (the one option is tools=all|ltm|stm)", opt)
		}
		if !slices.Contains([]string{memtools.SubsetAll, memtools.SubsetLTM, memtools.SubsetSTM}, v) {
			return method, fmt.Errorf("tools=%q is not all, ltm or stm", v)
		}
		method.Tools = v
	}
	greedy := llm.Sampling{Seed: uint64(cfg.Seed)}
	var err error
	if model, ok := strings.CutPrefix(dir, "ollama:"); ok {
		method.Policy, err = ollamaPolicy(cmd, cfg, model, greedy)
		method.Dir = ""
	} else if model, ok := strings.CutPrefix(dir, "openai:"); ok {
		method.Policy, err = openaiPolicy(cfg, model, greedy)
		method.Dir = ""
	} else if !isModel(dir) {
		err = fmt.Errorf("%s is not a model directory (no config.json), ollama:MODEL or openai:MODEL", dir)
	}
	return method, err
}
