package main

import (
	"cmp"
	"context"
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
	"github.com/agemem/agemem/model/qwen"
	"github.com/agemem/agemem/model/train"
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
				if !(deviceGiB > 0) {
					return fmt.Errorf("--device-gib %g: want a device's memory in GiB", deviceGiB)
				}
				return printPlan(cmd.OutOrStdout(), cfg, deviceGiB)
			}
			res, err := runGRPO(cmd.Context(), cfg, resume, cmd.ErrOrStderr())
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
	cmd.Flags().Float64Var(&deviceGiB, "device-gib", 24, "with --dry-run: each device's memory in GiB, to say whether the run fits (24: the paper's RTX 4090)")
	return cmd
}

// printPlan is --dry-run: the config is valid (it loaded), the model's
// config.json is read, and the memory of a step is estimated.
func printPlan(w io.Writer, cfg setup.Config, deviceGiB float64) error {
	mc, err := qwen.LoadConfig(cfg.RL.Init)
	if err != nil {
		return fmt.Errorf("rl.init: %w", err)
	}
	L, kvw := float64(mc.Layers), float64(mc.KVHeads*mc.HeadDim)
	rc := cfg.RL
	gib := func(b float64) string { return fmt.Sprintf("%.2f GiB", b/(1<<30)) }
	// The frozen base as the devices hold it (the CPU tape holds float32).
	base, shards, stage := train.BaseF32, 1, 0
	if len(cfg.Model.Devices) > 0 {
		base = map[string]train.Base{"bf16": train.BaseBF16, "q8_0": train.BaseQ8}[cfg.Model.TrainDtype]
		if cfg.Model.ZeroStage > 0 && len(cfg.Model.Devices) > 1 {
			shards, stage = len(cfg.Model.Devices), cfg.Model.ZeroStage
		}
	}
	st := train.StateBytes(mc, cfg.LoRA, base, shards, stage)
	params, trainable, weights, optimizer := st.Params, st.Trainable, st.Weights, st.Optimizer
	working := stage >= 2 && base != train.BaseF32
	wname := "weights (f32 masters)"
	switch {
	case !cfg.LoRA.Enabled && working:
		wname = fmt.Sprintf("weights (bf16 working copies, 1/%d of the f32 masters)", shards)
	case working:
		wname = fmt.Sprintf("weights (bf16 frozen base, bf16 adapters, 1/%d of their f32 masters)", shards)
	case cfg.LoRA.Enabled && base == train.BaseBF16:
		wname = "weights (bf16 frozen base, f32 adapters)"
	case cfg.LoRA.Enabled && base == train.BaseQ8:
		wname = "weights (Q8_0 projections, bf16 embeddings, f32 adapters)"
	case cfg.LoRA.Enabled:
		wname = "weights (f32 frozen base and adapters)"
	}
	// The frozen reference: the base itself under LoRA, none at rl.beta 0
	// (no KL term), else a copy held as the devices hold frozen weights.
	offload := cfg.Model.OffloadReference && len(cfg.Model.Devices) > 0
	ref, refName := train.ReferenceBytes(mc, base, offload), "reference policy"
	switch {
	case cfg.LoRA.Enabled || rc.Beta == 0:
		ref = 0
	case offload:
		refName = "reference policy (in host memory, a layer at a time)"
	}
	oname := "gradients + AdamW moments"
	switch {
	case stage >= 2:
		oname = fmt.Sprintf("gradients (1/%d and a layer's) + AdamW moments (1/%d)", shards, shards)
	case shards > 1:
		oname = fmt.Sprintf("gradients + AdamW moments (1/%d of them)", shards)
	}
	engine := 4 * params // the rollout engine's copy of the weights
	ename := "rollout engine weights"
	if slices.ContainsFunc(cfg.Model.Devices, func(d string) bool { return strings.HasPrefix(d, "cuda") }) {
		// Rollouts decode on the training GPUs over the replicas' own
		// weights (train.Replica.Engine): no second copy.
		engine, ename = 0, "rollout engine weights (the trainer's, shared)"
	}
	seqs := float64(rc.K * rc.BatchTasks)
	kvPos := seqs * float64(cfg.Agent.ContextBudget+cfg.Agent.ResponseBudget)
	kvName := "KV caches of all rollouts (upper bound)"
	if b := float64(rc.KVBudget); b > 0 {
		// The paged pool holds at least one whole rollout (it runs alone).
		b = max(b, float64(cfg.Agent.ContextBudget+cfg.Agent.ResponseBudget))
		if rc.PrefixCache {
			b += float64(rc.KVBudget) // the prefix cache keeps the budget again
		}
		if b < kvPos {
			kvPos, kvName = b, "KV caches (rl.kv_budget)"
		}
	}
	kv := kvPos * L * 2 * kvw * 4
	// A micro-batch is rl.batch_tokens, but never less than one whole
	// rollout: a sequence is not split across micro-batches.
	mb := max(rc.BatchTokens, cfg.Agent.ContextBudget+cfg.Agent.ResponseBudget)
	onDevices, bf16 := len(cfg.Model.Devices) > 0, base != train.BaseF32
	act, logits := train.ActivationBytes(mc, mb, rc.BatchTokens, train.TrainOptions{Recompute: rc.Recompute}, onDevices, bf16)
	actName := "activations of a micro-batch"
	if rc.Recompute && onDevices && bf16 {
		actName = "activations of a micro-batch (bf16 checkpoints)"
	}
	chunk := min(rc.BatchTokens, max(1, train.LogitChunkFloats/mc.VocabSize))
	// The update's items were checked on an H100 (BenchmarkCUDAPaperStep,
	// 7B shape, one 10240-token rollout a micro-batch) before the MLP
	// chunks and bf16 checkpoints: 24.54 GiB predicted, 25.65 GiB measured
	// at the allocator's peak.
	total := weights + ref + optimizer + engine + kv + act + logits
	fmt.Fprintf(w, "config valid; policy %s: %s, %d layers, hidden %d, %.2fM parameters, %.2fM trainable (%s)\n",
		rc.Init, mc.ModelType, mc.Layers, mc.HiddenSize, params/1e6, trainable/1e6, map[bool]string{true: "LoRA", false: "full"}[cfg.LoRA.Enabled])
	fmt.Fprintf(w, "a step: %d tasks x %d rollouts, contexts up to %d + %d tokens, micro-batches of %d tokens\n", rc.BatchTasks, rc.K, cfg.Agent.ContextBudget, cfg.Agent.ResponseBudget, rc.BatchTokens)
	devs := "the CPU tape (model.devices is empty)"
	if len(cfg.Model.Devices) > 0 {
		devs = strings.Join(cfg.Model.Devices, ", ")
	}
	fmt.Fprintf(w, "memory per device (%s):\n", devs)
	for _, l := range []struct {
		name string
		b    float64
	}{{wname, weights}, {refName, ref}, {oname, optimizer},
		{ename, engine}, {kvName, kv}, {actName, act},
		{fmt.Sprintf("vocabulary logits and gradient (%d tokens at a time)", chunk), logits},
		{"the update alone (no engine, no KV caches)", weights + ref + optimizer + act + logits}, {"total (approximate)", total}} {
		fmt.Fprintf(w, "  %-58s %s\n", l.name, gib(l.b))
	}
	if total <= deviceGiB*(1<<30) {
		fmt.Fprintf(w, "fits in %.0f GiB per device\n", deviceGiB)
		return nil
	}
	// Name the largest item and the setting that shrinks it.
	weightsFix := "lora.enabled: true with model.train_dtype: bf16 (a bf16 frozen base)"
	switch {
	case len(cfg.Model.Devices) == 0:
		weightsFix = "GPUs in model.devices (the CPU tape holds every weight in f32) with lora.enabled: true and model.train_dtype: bf16 or q8_0"
	case cfg.LoRA.Enabled && base == train.BaseF32:
		weightsFix = "model.train_dtype: bf16 or q8_0 (a 16- or 8-bit frozen base)"
	case cfg.LoRA.Enabled && base == train.BaseBF16:
		weightsFix = "model.train_dtype: q8_0 (the base's projections in 8 bits)"
	case cfg.LoRA.Enabled && base == train.BaseQ8:
		weightsFix = "a larger device: the base is 8-bit already (a 4-bit base is not built)"
	case !cfg.LoRA.Enabled && !working:
		weightsFix = "model.train_dtype: bf16 with model.zero_stage: 2 over several model.devices (bf16 working weights, the f32 masters split across the devices), or lora.enabled: true"
	case !cfg.LoRA.Enabled:
		weightsFix = "lora.enabled: true (a bf16 frozen base and small adapters), or more devices (each holds 1/N of the masters)"
	}
	refFix := "rl.beta: 0 (no KL term, so no reference: DAPO, Dr. GRPO), or lora.enabled: true (the reference is the base without the adapter)"
	if len(cfg.Model.Devices) > 0 && !offload {
		refFix = "model.offload_reference: true (its layers uploaded one at a time), " + refFix
	}
	if base == train.BaseF32 && len(cfg.Model.Devices) > 0 {
		refFix = "model.train_dtype: bf16 (the reference held in bf16), " + refFix
	}
	optFix := "model.zero_stage: 2 over several model.devices (gradients and moments split across them), or lora.enabled: true"
	switch {
	case stage == 1:
		optFix = "model.zero_stage: 2 (the gradients split too), or lora.enabled: true"
	case stage >= 2:
		optFix = "more devices in model.devices (each holds 1/N), or lora.enabled: true"
	}
	kvFix := "rl.kv_budget (the paged KV pool's positions; rollouts beyond it wait), or lower rl.k x rl.batch_tasks or agent.context_budget"
	if rc.KVBudget > 0 && rc.PrefixCache {
		kvFix = "rl.prefix_cache: false (the prefix cache holds rl.kv_budget again), a smaller rl.kv_budget, or lower agent.context_budget"
	}
	actFix := "rl.recompute: true, or a smaller rl.batch_tokens"
	if rc.Recompute {
		actFix = "a smaller rl.batch_tokens (recomputation is on; a rollout is never split)"
	}
	items := []struct {
		name, fix string
		b         float64
	}{
		{wname, weightsFix, weights},
		{"the reference policy", refFix, ref},
		{oname, optFix, optimizer},
		{"the rollout engine's weights", "GPUs in model.devices (rollouts then decode with the trainer's own weights)", engine},
		{"the KV caches", kvFix, kv},
		{"the activations", actFix, act},
		{"the vocabulary logits", "nothing: they are already chunked", logits},
	}
	// The largest first, then the others a setting can still shrink: the
	// largest may take the biggest change (LoRA, more devices) where a
	// smaller item's setting is enough.
	slices.SortStableFunc(items, func(a, b struct {
		name, fix string
		b         float64
	}) int {
		return cmp.Compare(b.b, a.b)
	})
	fmt.Fprintf(w, "does not fit in %.0f GiB per device (--device-gib): the largest item is %s (%s); to shrink it: %s\n", deviceGiB, items[0].name, gib(items[0].b), items[0].fix)
	for _, it := range items[1:] {
		if it.b >= 1<<28 && !strings.HasPrefix(it.fix, "nothing") { // a quarter GiB
			fmt.Fprintf(w, "  then %s (%s): %s\n", it.name, gib(it.b), it.fix)
		}
	}
	return nil
}

// runGRPO trains rl.init in the AgeMem environment (setup.GRPO).
func runGRPO(ctx context.Context, cfg setup.Config, resume string, log io.Writer) (rl.Result, error) {
	o, err := setup.GRPO(ctx, cfg, log)
	if err != nil {
		return rl.Result{}, err
	}
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
			isModel := func(dir string) bool {
				_, err := os.Stat(filepath.Join(dir, "config.json"))
				return err == nil
			}
			if !isModel(norl) {
				return fmt.Errorf("AgeMem-noRL: %s is not a model directory (no config.json); --norl or rl.init names it", norl)
			}
			if !isModel(trained) {
				return fmt.Errorf("AgeMem: %s is not a model directory (no config.json); train it first (agemem-train train) or name it with --trained", trained)
			}
			methods := []eval.Method{{Name: "No-Memory", Scripted: "no-memory"}, {Name: "AgeMem-noRL", Dir: norl}, {Name: "AgeMem", Dir: trained}}
			for _, m := range extra {
				name, spec, ok := strings.Cut(m, "=")
				if !ok || name == "" || spec == "" {
					return fmt.Errorf("--method %q: want NAME=DIR, e.g. Answer-Only=runs/answer-only/rl/policy", m)
				}
				// DIR (or ollama:MODEL, openai:MODEL), then ,key=value
				// options; a directory whose name has a comma is taken
				// whole when it exists.
				dir, opts, _ := strings.Cut(spec, ",")
				if isModel(spec) {
					dir, opts = spec, ""
				}
				var tools string
				for opt := range strings.SplitSeq(opts, ",") {
					if opt == "" {
						continue
					}
					k, v, _ := strings.Cut(opt, "=")
					if k != "tools" {
						return fmt.Errorf("--method %q: unknown option %q (the one option is tools=all|ltm|stm)", m, opt)
					}
					if !slices.Contains([]string{memtools.SubsetAll, memtools.SubsetLTM, memtools.SubsetSTM}, v) {
						return fmt.Errorf("--method %q: tools=%q is not all, ltm or stm", m, v)
					}
					tools = v
				}
				if slices.ContainsFunc(methods, func(x eval.Method) bool { return x.Name == name }) {
					return fmt.Errorf("--method %q: the table already has a row %q", m, name)
				}
				method := eval.Method{Name: name, Dir: dir, Tools: tools}
				greedy := llm.Sampling{Seed: uint64(cfg.Seed)}
				if model, ok := strings.CutPrefix(dir, "ollama:"); ok {
					if method.Policy, err = ollamaPolicy(cmd, cfg, model, greedy); err != nil {
						return fmt.Errorf("--method %q: %w", m, err)
					}
					method.Dir = ""
				} else if model, ok := strings.CutPrefix(dir, "openai:"); ok {
					if method.Policy, err = openaiPolicy(cfg, model, greedy); err != nil {
						return fmt.Errorf("--method %q: %w", m, err)
					}
					method.Dir = ""
				} else if !isModel(dir) {
					return fmt.Errorf("--method %q: %s is not a model directory (no config.json), ollama:MODEL or openai:MODEL", m, dir)
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
