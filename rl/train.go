// Package rl trains a policy with step-wise GRPO (AgeMem's Algorithms
// 1-2) in any environment: for each step, K rollouts of B tasks with the
// current policy, a reward for every rollout, group advantages broadcast
// to every policy call of the rollout, and clipped-surrogate updates
// against the frozen starting policy. The environment (rollout.Env) and
// the reward are the caller's: AgeMem's three stages and composite reward
// are one pair, a toy environment in the tests another.
package rl

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/agemem/agemem/kernels"
	"github.com/agemem/agemem/llm"
	"github.com/agemem/agemem/llm/native"
	"github.com/agemem/agemem/model/chat"
	"github.com/agemem/agemem/model/engine"
	"github.com/agemem/agemem/model/lora"
	"github.com/agemem/agemem/model/optim"
	"github.com/agemem/agemem/model/qwen"
	"github.com/agemem/agemem/model/safetensors"
	"github.com/agemem/agemem/model/tokenizer"
	"github.com/agemem/agemem/model/train"
	"github.com/agemem/agemem/rl/cluster"
	"github.com/agemem/agemem/rl/grpo"
	"github.com/agemem/agemem/rl/rollout"
)

// Reward scores a played rollout.
type Reward[R any] interface {
	Score(ctx context.Context, r R) (rollout.Score, error)
}

// Options are a run's inputs: the rl section, what it shares with the rest
// of the config, and the environment with its reward.
type Options[R any] struct {
	Config Config
	LoRA   lora.Options
	Optim  optim.Config
	// Learner says where the steps run (model.devices, train_dtype,
	// zero_stage); rollouts decode on Device (model.device) unless
	// training runs on GPUs, whose every device then decodes a share.
	Learner train.LearnerOptions
	Device  kernels.Backend
	// Dtype stores the exported full weights (model.dtype).
	Dtype safetensors.DType
	Seed  uint64
	// ResponseBudget bounds each policy call (agent.response_budget).
	ResponseBudget int
	Env            rollout.Env[R]
	Reward         Reward[R]
	// Validate scores a policy directory on held-out validation tasks (J
	// and its standard error); nil: no validation (rl.val_every and
	// rl.keep_best need it).
	Validate func(ctx context.Context, policy string) (j, se float64, err error)
	YAML     string // the effective config, saved with checkpoints
	Resume   string
	Log      io.Writer
	TTY      bool
	// Cluster, when set, makes this process one rank of a run across
	// processes (rl/cluster): it plays its share of each step's groups
	// and trains its share of the micro-batches (Learner.Ranks), and only
	// rank 0 writes metrics, checkpoints and the policy to rl.out.
	Cluster *cluster.Node
}

// StepStats are one step's figures (metrics.jsonl holds the same).
type StepStats struct {
	Step     int
	Reward   float64
	Parts    map[string]float64 // the mean of each part of the reward
	Loss, KL float64
	ClipFrac float64
	Entropy  float64
	GradNorm float64
	Seconds  float64
	// RolloutSeconds and RolloutTokens (the prompt tokens of every call
	// plus the tokens generated) measure the rollout phase alone;
	// ComputedTokens are those the model ran (the prompt tokens the prefix
	// cache served are not).
	RolloutSeconds float64
	RolloutTokens  int
	ComputedTokens int
	// KVPeak is the most KV positions the paged pool held under
	// rl.kv_budget (0 without one), and Recomputed the rollouts it preempted.
	KVPeak, Recomputed int
	// Reruns are the rollouts played again because a remote engine
	// failed under them; Engines the engines the step's rollouts used.
	Reruns, Engines int
}

// Result summarises a run.
type Result struct {
	Steps  []StepStats
	Policy string
	// Best is the validated step that scored best (Step 0: no validation).
	Best Validated
}

// Train trains o.Config.Init with step-wise GRPO in o.Env.
func Train[R any](ctx context.Context, o Options[R]) (res Result, err error) {
	rc := o.Config
	sp := newSpread(o.Cluster, o.Log)
	if o.Cluster != nil {
		// The run stops when any rank fails or falls silent, with why.
		var cancel context.CancelCauseFunc
		ctx, cancel = context.WithCancelCause(ctx)
		stop := context.AfterFunc(o.Cluster.Context(), func() { cancel(context.Cause(o.Cluster.Context())) })
		defer func() {
			stop()
			if err != nil && context.Cause(ctx) != nil && ctx.Err() != nil {
				err = fmt.Errorf("rank %d stopped: %w", sp.rank, context.Cause(ctx))
			}
			cancel(nil)
		}()
		if !sp.lead() {
			// The other ranks keep their own metrics apart, for their timings.
			rc.Out = filepath.Join(rc.Out, "ranks", fmt.Sprintf("rank-%d", sp.rank))
		}
	}
	if len(rc.Engines) > 0 && !o.LoRA.Enabled {
		return res, fmt.Errorf("rl.engines needs lora.enabled: engines hot-load LoRA adapters (vLLM's /v1/load_lora_adapter); full weights each step would need a weight-sync channel into every engine (TRL's NCCL broadcast into vllm-serve), which this trainer does not have. Train LoRA, or leave rl.engines empty to decode in process")
	}
	if o.Env.Len() < rc.BatchTasks {
		return res, fmt.Errorf("%d tasks, rl.batch_tasks needs %d", o.Env.Len(), rc.BatchTasks)
	}
	tok, err := tokenizer.Load(filepath.Join(rc.Init, "tokenizer.json"))
	if err != nil {
		return res, err
	}
	p, err := train.Open(rc.Init, o.LoRA, o.Seed)
	if err != nil {
		return res, err
	}
	tmpl, err := chat.Detect(rc.Init, p.W.ModelType)
	if err != nil {
		return res, err
	}
	// π_ref: the starting policy, frozen. With LoRA it is the policy's own
	// base run without the adapter; otherwise a second, frozen copy. With
	// rl.beta 0 the objective has no KL term, so there is none: no second
	// copy of the model, no reference forward each step (DAPO, Dr. GRPO).
	ref := p
	switch {
	case rc.Beta == 0:
		ref = nil
	case !o.LoRA.Enabled:
		if ref, err = train.Open(rc.Init, lora.Options{}, 0); err != nil {
			return res, err
		}
		for _, nv := range ref.W.Named {
			nv.V.Requires, nv.V.Grad = false, nil
		}
	}
	tr := train.NewOptimizer(p, o.Optim, rc.LR, rc.Over(rc.Steps), o.Seed, o.YAML)
	if err := tr.ResumeFrom(o.Resume, o.Log); err != nil {
		return res, err
	}
	learner, err := train.NewLearner(tr, o.Learner, o.Log)
	if err != nil {
		return res, err
	}
	var perRollout *train.Metrics
	if sp.lead() {
		if perRollout, err = train.OpenMetrics(filepath.Join(rc.Out, "rollouts.jsonl"), o.Resume != ""); err != nil {
			return res, err
		}
		defer perRollout.Close()
	}
	if len(rc.Engines) > 0 {
		if err := sp.startEngines(rc, native.NewCodec(tok, tmpl, p.W.Config.MaxPositions, 0)); err != nil {
			return res, err
		}
		defer sp.close()
	}
	learner.SyncHost()
	if err := sp.sync(ctx, tr.Step, p, o.LoRA.Enabled); err != nil {
		return res, err
	}
	loss := hostLoss(rc)
	fmt.Fprintf(o.Log, "grpo: %d tasks, %d steps of %d tasks x %d rollouts, %d trainable parameters\n", o.Env.Len(), rc.Steps, rc.BatchTasks, rc.K, tr.NumParams())
	save := learner.Save
	if !sp.lead() {
		save = func(string) error { return nil } // rank 0 checkpoints: every rank holds the same weights
	}
	loop := train.Loop{Steps: rc.Steps, SaveEvery: rc.SaveEvery, Out: rc.Out, Resumed: o.Resume != "", Log: o.Log, TTY: o.TTY,
		Save: save,
		Charts: []train.Chart{{File: "reward.png", Title: "GRPO: mean reward of the step's rollouts and its components",
			YLabel: "reward", Series: []string{"reward", "r_task", "r_context", "r_memory"}},
			{File: "kl.png", Title: "GRPO: KL to the reference policy (k3 estimator)", YLabel: "KL (nats per token)", Series: []string{"kl"}}}}
	loop.Step = func(ctx context.Context, n int) (map[string]any, string, error) {
		t0 := time.Now()
		step := n - 1
		var err error
		// Rollouts with the current weights.
		learner.SyncHost()
		var pols []llm.Model
		var engines []*native.Engine
		pref := 0
		var models []*qwen.Model
		if len(rc.Engines) > 0 {
			if pols, pref, err = sp.remote(o.ResponseBudget); err != nil {
				return nil, "", err
			}
		} else if models, err = rolloutEngines(o.Device, learner, p.W); err != nil {
			return nil, "", err
		}
		for _, m := range models {
			eo := engine.Options{PrefixBudget: -1}
			if rc.KVBudget > 0 {
				// The pool always holds one whole sequence, so that a
				// conversation larger than the budget still runs (alone).
				eo.KVBudget = max(rc.KVBudget, m.MaxPositions+engine.KVBlock)
			}
			if rc.PrefixCache {
				// Each rollout's calls resend its growing context: keep
				// one cache per rollout for this step's weights (within
				// the KV budget, when there is one).
				eo.PrefixBudget = rc.BatchTasks * rc.K * m.MaxPositions
				if rc.KVBudget > 0 {
					eo.PrefixBudget = min(eo.PrefixBudget, rc.KVBudget)
				}
			}
			e := native.New(m, tok, tmpl, native.Options{Sampling: llm.Sampling{MaxTokens: o.ResponseBudget}, Engine: eo})
			defer e.Close()
			engines = append(engines, e)
			pols = append(pols, e)
		}
		st := StepStats{Step: n, Parts: map[string]float64{}, Engines: len(pols)}
		adapter := sp.name // the version these rollouts run
		var pl played
		engineStats := func(part *roundPart) {
			for _, e := range engines {
				part.Reused += int(e.Batching().Prefixes().Reused)
				kv := e.Batching().KV()
				part.KVPeak, part.Recomputed = max(part.KVPeak, kv.Peak*engine.KVBlock), part.Recomputed+kv.Preempted
			}
		}
		var last roundPart
		for round := 0; round < rc.MaxRounds && pl.kept < rc.BatchTasks; round++ {
			if last, err = playRound(ctx, o, sp, pols, pref, engineStats, step, round, n, t0, perRollout, &pl, &st); err != nil {
				return nil, "", err
			}
		}
		st.RolloutSeconds = time.Since(t0).Seconds()
		st.Reward /= float64(pl.rollouts)
		for k := range st.Parts {
			st.Parts[k] /= float64(pl.rollouts)
		}
		st.ComputedTokens = st.RolloutTokens - last.Reused
		st.KVPeak, st.Recomputed = last.KVPeak, last.Recomputed
		if err := sp.checkAdapters(pl.exps); err != nil {
			return nil, "", err
		}
		adv, err := pl.advantages(rc)
		if err != nil {
			return nil, "", err
		}
		exps := pl.exps
		if err := update(tr, learner, ref, exps, adv, rc, loss, &st); err != nil {
			return nil, "", err
		}
		learner.SyncHost()
		if err := sp.sync(ctx, tr.Step, p, o.LoRA.Enabled); err != nil {
			return nil, "", err
		}
		st.Seconds = time.Since(t0).Seconds()
		res.Steps = append(res.Steps, st)
		rec := map[string]any{"reward": st.Reward, "loss": st.Loss, "kl": st.KL, "clip_frac": st.ClipFrac,
			"entropy": st.Entropy, "grad_norm": st.GradNorm, "experiences": len(exps), "step_seconds": st.Seconds,
			"rollout_seconds": st.RolloutSeconds, "rollout_tokens": st.RolloutTokens, "computed_tokens": st.ComputedTokens}
		if rc.KVBudget > 0 {
			rec["kv_peak_positions"], rec["kv_recomputed"] = st.KVPeak, st.Recomputed
		}
		for k, v := range st.Parts {
			rec[k] = v
		}
		if rc.FilterGroups != "" {
			rec["groups_played"], rec["groups_kept"] = pl.played, pl.kept
		}
		if len(rc.Engines) > 0 {
			rec["rollouts_rerun"], rec["engines"], rec["adapter"] = st.Reruns, st.Engines, adapter
		}
		return rec, fmt.Sprintf("reward %.3f kl %.4f", st.Reward, st.KL), nil
	}
	var val *validation
	if o.Validate != nil && sp.lead() {
		if val, err = newValidation(rc.Out, o.Resume != "", rc.KeepBest); err != nil {
			return res, err
		}
		loop.EvalFirst, loop.EvalEvery = true, rc.ValEvery
		loop.Eval = func(ctx context.Context, n int) (map[string]any, error) {
			dir := rc.Init // before the first step: the starting policy
			if n > 0 {
				learner.SyncHost()
				dir = filepath.Join(rc.Out, "val-policy")
				if err := os.RemoveAll(dir); err != nil {
					return nil, err
				}
				if err := p.Export(dir, o.Dtype); err != nil {
					return nil, err
				}
			}
			j, se, err := o.Validate(ctx, dir)
			if err != nil {
				return nil, fmt.Errorf("validation after step %d: %w", n, err)
			}
			fmt.Fprintf(o.Log, "validation after step %d: J %.3f ± %.3f\n", n, j, se)
			if n > 0 {
				if err := val.offer(n, j, se, dir, rc.KeepBest); err != nil {
					return nil, err
				}
			}
			return map[string]any{"val_j": j, "val_j_se": se}, nil
		}
		loop.Charts = append(loop.Charts, train.Chart{File: "validation.png", Title: "GRPO: J on the validation tasks (greedy)", YLabel: "J", Series: []string{"val_j"}})
	} else if rc.KeepBest && o.Validate == nil {
		return res, fmt.Errorf("rl.keep_best needs validation tasks (data.val)")
	}
	if !sp.lead() {
		loop.Charts = nil
	}
	metrics, err := loop.Run(ctx, tr.Step)
	if err != nil {
		return res, err
	}
	defer metrics.Close()
	if par, ok := learner.(*train.Parallel); ok {
		par.MemoryReport()
	}
	learner.SyncHost()
	if !sp.lead() {
		return res, metrics.Close()
	}
	res.Policy = filepath.Join(rc.Out, "policy")
	if rc.KeepBest && val.best.Step > 0 {
		if err := val.install(res.Policy); err != nil {
			return res, err
		}
		fmt.Fprintf(o.Log, "policy: the weights after step %d (validation J %.3f ± %.3f), the best of the validated steps; the last step's are in checkpoint-%d\n",
			val.best.Step, val.best.J, val.best.SE, rc.Steps)
	} else if err := p.Export(res.Policy, o.Dtype); err != nil {
		return res, err
	}
	if val != nil {
		res.Best = val.best
	}
	return res, metrics.Close()
}

// played is what a step's rollout rounds leave for its update: the kept
// groups' rewards (task-major, K a group) and their calls, whose Rollout
// indexes rewards.
type played struct {
	rewards      []float64
	calls        [][]float64 // each kept rollout's Score.Calls
	exps         []rollout.Experience
	played, kept int // groups
	rollouts     int // every rollout played, kept or not
}

// advantages are every kept experience's: its rollout's advantage in its
// group, given to each of its calls (step-wise GRPO), plus its own call's
// shaping (rollout.Score.Calls).
func (pl *played) advantages(rc Config) ([]float64, error) {
	adv, err := grpo.GroupAdvantages(pl.rewards, rc.K, rc.Eps, rc.ScaleRewards)
	if err != nil {
		return nil, err
	}
	trajOf := make([]int, len(pl.exps))
	for i, e := range pl.exps {
		trajOf[i] = e.Rollout
	}
	out := grpo.Broadcast(adv, trajOf)
	for i, e := range pl.exps {
		if c := pl.calls[e.Rollout]; e.Call < len(c) {
			out[i] += c[e.Call]
		}
	}
	return out, nil
}

// playRound plays K rollouts of rl.batch_tasks tasks (this rank's share
// of the groups; the ranks gather the rest), scores and logs them, and
// keeps the groups rl.filter_groups lets through, up to rl.batch_tasks in
// all. Round 0 draws the tasks and seeds a run without filtering always
// drew, so turning the filter on changes nothing else.
func playRound[R any](ctx context.Context, o Options[R], sp *spread, pols []llm.Model, pref int, engineStats func(*roundPart), step, round, n int, t0 time.Time,
	perRollout *train.Metrics, pl *played, st *StepStats) (roundPart, error) {
	rc := o.Config
	tasks := tasksFor(o.Env.Len(), step*rc.MaxRounds+round, rc.BatchTasks, o.Seed)
	sampling := llm.Sampling{Temperature: rc.Temperature, TopP: rc.TopP, MaxTokens: o.ResponseBudget}
	rs, exps, err := rollout.RunOn(ctx, pols, o.Env, tasks, rollout.Options{K: rc.K, Seed: o.Seed<<20 ^ uint64(step) ^ uint64(round)<<56, Sampling: &sampling,
		EpisodeSeed: func(i int) uint64 { return uint64(step*100000+i) ^ uint64(round)<<40 }, Done: rolloutProgress(o.Log, o.TTY, n, t0),
		Groups: sp.mine(len(tasks)), Preferred: pref})
	if err != nil {
		return roundPart{}, err
	}
	var mine roundPart
	mine.Exps = exps
	for _, r := range rs {
		sc, err := o.Reward.Score(ctx, r.Result)
		if err != nil {
			return roundPart{}, err
		}
		s := scored{Index: r.Index, Group: r.Group, Total: sc.Total, Parts: sc.Parts, Info: sc.Info, Reruns: r.Reruns, Calls: sc.Calls}
		if r.Err != nil {
			s.Err = r.Err.Error()
		}
		mine.Rollouts = append(mine.Rollouts, s)
	}
	engineStats(&mine)
	all, err := sp.gather(ctx, fmt.Sprintf("step-%d/round-%d", n, round), mine, len(tasks)*rc.K)
	if err != nil {
		return roundPart{}, err
	}
	for _, e := range all.Exps {
		st.RolloutTokens += len(e.PromptIDs) + len(e.ResponseIDs)
	}
	rewards := make([]float64, len(all.Rollouts))
	metric := make([]float64, len(all.Rollouts))
	for i, r := range all.Rollouts {
		rewards[i] = r.Total
		if metric[i], err = filterMetric(rc.FilterGroups, r.score()); err != nil {
			return roundPart{}, err
		}
	}
	varied, err := grpo.Varied(metric, rc.K)
	if err != nil {
		return roundPart{}, err
	}
	newIndex := map[int]int{}
	kept := make([]bool, len(tasks))
	for g, v := range varied {
		if rc.FilterGroups != "" && !v || pl.kept == rc.BatchTasks {
			continue
		}
		kept[g] = true
		for i := g * rc.K; i < (g+1)*rc.K; i++ {
			newIndex[i] = len(pl.rewards)
			pl.rewards = append(pl.rewards, rewards[i])
			pl.calls = append(pl.calls, all.Rollouts[i].Calls)
		}
		pl.kept++
	}
	for i, r := range all.Rollouts {
		rec := map[string]any{"step": n, "group": r.Group, "rollout": i % rc.K}
		if rc.FilterGroups != "" {
			rec["round"], rec["kept"] = round, kept[r.Group]
		}
		for k, v := range r.Info {
			rec[k] = v
		}
		if r.Err != "" {
			rec["error"] = r.Err
		}
		if r.Reruns > 0 {
			rec["reruns"] = r.Reruns
		}
		if perRollout != nil {
			if err := perRollout.Log(rec); err != nil {
				return roundPart{}, err
			}
		}
		st.Reward += r.Total
		for k, v := range r.Parts {
			st.Parts[k] += v
		}
		st.Reruns += r.Reruns
	}
	pl.rollouts += len(all.Rollouts)
	pl.played += len(tasks)
	for _, e := range all.Exps {
		if j, ok := newIndex[e.Rollout]; ok {
			e.Rollout = j
			pl.exps = append(pl.exps, e)
		}
	}
	return all, nil
}

// filterMetric is the value rl.filter_groups compares within a group.
func filterMetric(name string, sc rollout.Score) (float64, error) {
	switch name {
	case "":
		return 0, nil
	case "reward":
		return sc.Total, nil
	}
	v, ok := sc.Parts[name]
	if !ok {
		parts := make([]string, 0, len(sc.Parts))
		for k := range sc.Parts {
			parts = append(parts, k)
		}
		sort.Strings(parts)
		return 0, fmt.Errorf("rl.filter_groups: the reward has no part %q (it has reward, %s)", name, strings.Join(parts, ", "))
	}
	return v, nil
}

// rolloutProgress reports a step's rollouts as they end, which at paper
// scale take minutes: on a terminal a redrawn line (the step's bar redraws
// over it), else a plain line at each quarter.
func rolloutProgress(log io.Writer, tty bool, step int, t0 time.Time) func(done, total int) {
	return func(done, total int) {
		el := time.Since(t0).Round(time.Second)
		switch {
		case tty:
			fmt.Fprintf(log, "\rstep %d: rollouts %d/%d (%s) ", step, done, total, el)
		case 4*done/total != 4*(done-1)/total:
			fmt.Fprintf(log, "step %d: rollouts %d/%d done (%s)\n", step, done, total, el)
		}
	}
}
