// Package trainer is AgeMem's training loop (Algorithms 1-2): for each step,
// K three-stage rollouts of B tasks with the current policy, the composite
// reward of every rollout, group advantages broadcast to every policy call,
// and step-wise GRPO updates against the frozen starting policy.
package trainer

import (
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"path/filepath"
	"time"

	"github.com/agemem/agemem/config"
	"github.com/agemem/agemem/embed"
	"github.com/agemem/agemem/env"
	"github.com/agemem/agemem/kernels"
	"github.com/agemem/agemem/kernels/cpu"
	"github.com/agemem/agemem/kernels/device"
	"github.com/agemem/agemem/memtools"
	"github.com/agemem/agemem/model/chat"
	"github.com/agemem/agemem/model/decode"
	"github.com/agemem/agemem/model/optim"
	"github.com/agemem/agemem/model/safetensors"
	"github.com/agemem/agemem/model/tokenizer"
	"github.com/agemem/agemem/model/train"
	"github.com/agemem/agemem/rl/grpo"
	"github.com/agemem/agemem/rl/reward"
	"github.com/agemem/agemem/rl/rollout"
	"github.com/agemem/agemem/roles"
)

// Options are a run's inputs besides the config.
type Options struct {
	Config config.Config
	YAML   string
	Resume string
	Log    io.Writer
	TTY    bool
}

// StepStats are one step's figures (metrics.jsonl holds the same).
type StepStats struct {
	Step       int
	Reward     float64
	Components map[string]float64 // mean of each reward component
	ToolCalls  map[string]float64 // mean calls per rollout by tool
	Loss, KL   float64
	ClipFrac   float64
	Entropy    float64
	GradNorm   float64
	Seconds    float64
	// RolloutSeconds and RolloutTokens (prompt tokens prefilled plus
	// tokens generated) measure the rollout phase alone.
	RolloutSeconds float64
	RolloutTokens  int
}

// Result summarises a run.
type Result struct {
	Steps  []StepStats
	Policy string
}

// Run trains cfg.RL.Init with step-wise GRPO on cfg.Data.Train.
func Run(ctx context.Context, o Options) (Result, error) {
	c := o.Config
	rc := c.RL
	var res Result
	tok, err := tokenizer.Load(filepath.Join(rc.Init, "tokenizer.json"))
	if err != nil {
		return res, err
	}
	p, err := train.Open(rc.Init, c.LoRA, uint64(c.Seed))
	if err != nil {
		return res, err
	}
	tmpl, err := chat.Detect(rc.Init, p.W.ModelType)
	if err != nil {
		return res, err
	}
	// π_ref: the starting policy, frozen. With LoRA it is the policy's own
	// base run without the adapter; otherwise a second, frozen copy.
	ref := p
	if !c.LoRA.Enabled {
		if ref, err = train.Open(rc.Init, config.LoRA{}, 0); err != nil {
			return res, err
		}
		for _, nv := range ref.W.Named {
			nv.V.Requires, nv.V.Grad = false, nil
		}
	}
	var tasks []env.Task
	if err := env.StreamHotpotFile(c.Data.Train, func(t env.Task) error { tasks = append(tasks, t); return nil }); err != nil {
		return res, err
	}
	if len(tasks) < rc.BatchTasks {
		return res, fmt.Errorf("%s: %d tasks, rl.batch_tasks needs %d", c.Data.Train, len(tasks), rc.BatchTasks)
	}
	be, err := device.Open(c.Model.Device, o.Log)
	if err != nil {
		return res, err
	}
	judges, err := judgesFor(c, p, tok, tmpl)
	if err != nil {
		return res, err
	}
	helpers, err := roles.NewHelpers(ctx, c)
	if err != nil {
		return res, err
	}
	if err := roles.Judges(ctx, c, helpers, &judges); err != nil {
		return res, err
	}
	sched := optim.Schedule{Warmup: rc.WarmupSteps, Total: rc.Steps, Cosine: rc.Schedule == "cosine", MinRatio: rc.MinLRRatio}
	tr := train.NewOptimizer(p, c.Optim, rc.LR, sched, uint64(c.Seed), o.YAML)
	if err := tr.ResumeFrom(o.Resume, o.Log); err != nil {
		return res, err
	}
	learner, err := train.NewLearner(tr, c.Model, o.Log)
	if err != nil {
		return res, err
	}
	metrics, err := train.OpenMetrics(filepath.Join(rc.Out, "metrics.jsonl"), o.Resume != "")
	if err != nil {
		return res, err
	}
	defer metrics.Close()
	perRollout, err := train.OpenMetrics(filepath.Join(rc.Out, "rollouts.jsonl"), o.Resume != "")
	if err != nil {
		return res, err
	}
	defer perRollout.Close()
	weights := rewardWeights(c.Reward)
	ep := rollout.EpisodeConfig(c)
	fmt.Fprintf(o.Log, "grpo: %d tasks, %d steps of %d tasks x %d rollouts, %d trainable parameters\n", len(tasks), rc.Steps, rc.BatchTasks, rc.K, tr.NumParams())
	prog := train.NewProgress(o.Log, rc.Steps, o.TTY)
	for tr.Step < rc.Steps {
		if err := ctx.Err(); err != nil {
			return res, err
		}
		t0 := time.Now()
		step := tr.Step
		batch := tasksFor(tasks, step, rc.BatchTasks, uint64(c.Seed))
		// Rollouts with the current weights.
		learner.SyncHost()
		var pols []memtools.BatchPolicy
		for _, g := range rolloutBackends(be, learner) {
			m, err := p.W.Engine(g)
			if err != nil {
				return res, err
			}
			pol := decode.NewGenerator(m, tok, decode.Sampling{Temperature: rc.Temperature, TopP: rc.TopP, MaxTokens: c.Agent.ResponseBudget})
			pol.Template = tmpl
			pols = append(pols, pol)
		}
		rs, exps, err := rollout.RunOn(ctx, pols, batch, rollout.Options{K: rc.K, Seed: uint64(c.Seed)<<20 ^ uint64(step),
			Episode: ep, NewRuntime: func(i int) *memtools.Runtime { return helpers.Apply(rollout.NewRuntime(c, uint64(step*100000+i), tok)) }})
		if err != nil {
			return res, err
		}
		st := StepStats{Step: step + 1, Components: map[string]float64{}, ToolCalls: map[string]float64{}, RolloutSeconds: time.Since(t0).Seconds()}
		for _, e := range exps {
			st.RolloutTokens += len(e.PromptIDs) + len(e.ResponseIDs)
		}
		rewards := make([]float64, len(rs))
		var promptTokens float64
		for i, r := range rs {
			b, err := reward.Compute(ctx, weights, r.Task, r.Result, judges)
			if err != nil {
				return res, err
			}
			rewards[i] = b.Total
			rec := map[string]any{"step": step + 1, "task_id": r.Task.ID, "group": r.Group, "rollout": i % rc.K,
				"answer": r.Result.Answer, "em": r.Result.EM, "context_tokens": r.Result.ContextTokens, "tool_calls": r.Result.ToolCalls(),
				"format_errors": r.Result.FormatErrors(), "overflow": b.Overflowed, "rounds_exceeded": b.RoundsOver,
				"stored": b.StoredTotal, "stored_high_quality": b.StoredGood}
			if r.Err != nil {
				rec["error"] = r.Err.Error()
			}
			for k, v := range components(b) {
				rec[k] = v
			}
			rec["reward"] = b.Total
			if err := perRollout.Log(rec); err != nil {
				return res, err
			}
			st.Reward += b.Total / float64(len(rs))
			for k, v := range components(b) {
				st.Components[k] += v / float64(len(rs))
			}
			for k, v := range r.Result.ToolCalls() {
				st.ToolCalls[k] += float64(v) / float64(len(rs))
			}
			promptTokens += float64(r.Result.ContextTokens) / float64(len(rs))
		}
		adv, err := grpo.GroupAdvantages(rewards, rc.K, rc.Eps)
		if err != nil {
			return res, err
		}
		trajOf := make([]int, len(exps))
		for i, e := range exps {
			trajOf[i] = e.Rollout
		}
		expAdv := grpo.Broadcast(adv, trajOf)
		if err := update(tr, learner, ref, exps, expAdv, rc, &st); err != nil {
			return res, err
		}
		st.Seconds = time.Since(t0).Seconds()
		rec := map[string]any{"step": st.Step, "reward": st.Reward, "loss": st.Loss, "kl": st.KL, "clip_frac": st.ClipFrac,
			"entropy": st.Entropy, "grad_norm": st.GradNorm, "prompt_tokens": promptTokens, "experiences": len(exps), "step_seconds": st.Seconds,
			"rollout_seconds": st.RolloutSeconds, "rollout_tokens": st.RolloutTokens}
		for k, v := range st.Components {
			rec[k] = v
		}
		for k, v := range st.ToolCalls {
			rec["calls_"+k] = v
		}
		if err := metrics.Log(rec); err != nil {
			return res, err
		}
		res.Steps = append(res.Steps, st)
		prog.Update(tr.Step, fmt.Sprintf("reward %.3f kl %.4f", st.Reward, st.KL))
		if rc.SaveEvery > 0 && tr.Step%rc.SaveEvery == 0 && tr.Step < rc.Steps {
			if err := learner.Save(filepath.Join(rc.Out, fmt.Sprintf("checkpoint-%d", tr.Step))); err != nil {
				return res, err
			}
		}
	}
	if par, ok := learner.(*train.Parallel); ok {
		par.MemoryReport()
	}
	if err := learner.Save(filepath.Join(rc.Out, fmt.Sprintf("checkpoint-%d", tr.Step))); err != nil {
		return res, err
	}
	learner.SyncHost()
	dtype := map[string]safetensors.DType{"f32": safetensors.F32, "bf16": safetensors.BF16}[c.Model.Dtype]
	res.Policy = filepath.Join(rc.Out, "policy")
	if err := p.Export(res.Policy, dtype); err != nil {
		return res, err
	}
	curves := map[string][]train.Point{"reward": metrics.Series["reward"], "r_task": metrics.Series["r_task"],
		"r_context": metrics.Series["r_context"], "r_memory": metrics.Series["r_memory"]}
	if err := train.Plot(filepath.Join(rc.Out, "reward.png"), "GRPO: mean reward and its components", curves); err != nil {
		return res, err
	}
	if err := train.Plot(filepath.Join(rc.Out, "kl.png"), "KL to the reference (k3)", map[string][]train.Point{"kl": metrics.Series["kl"]}); err != nil {
		return res, err
	}
	return res, nil
}

// rolloutBackends are the devices rollouts decode on: every training GPU
// when training is data-parallel on GPUs (one engine each, the rollouts
// spread over them), else model.device alone.
func rolloutBackends(be kernels.Backend, l train.Learner) []kernels.Backend {
	par, ok := l.(*train.Parallel)
	if !ok {
		return []kernels.Backend{be}
	}
	var gpus []kernels.Backend
	for _, r := range par.Replicas {
		if r.Backend().Name() == "cuda" {
			gpus = append(gpus, r.Backend())
		}
	}
	if len(gpus) == 0 {
		return []kernels.Backend{be}
	}
	return gpus
}

// update runs rl.epochs passes over the step's experiences in
// rl.minibatches optimiser steps each.
func update(tr *train.Optimizer, l train.Learner, ref *train.Model, exps []rollout.Experience, adv []float64, rc config.RL, st *StepStats) error {
	if len(exps) == 0 {
		return nil
	}
	w := tr.Model.W
	chs := chains(exps)
	seqs := make([]train.Sequence, len(chs))
	for i, c := range chs {
		seqs[i] = c.seq
	}
	// π_old, the policy that sampled, recomputed by the training forward so
	// the first ratio is exactly 1 (with one epoch of one minibatch it is
	// the current log-probability itself, detached); π_ref per token.
	var old [][]float64
	var err error
	if rc.Epochs*rc.Minibatches > 1 {
		if old, err = score(l, w, seqs, rc.BatchTokens, train.TrainOptions{}); err != nil {
			return err
		}
	}
	refLp, err := score(l, ref.W, seqs, rc.BatchTokens, train.TrainOptions{NoAdapter: true})
	if err != nil {
		return err
	}
	rng := rand.New(rand.NewPCG(uint64(tr.Step), 0x67727077))
	var kl, loss, ent float64
	var clipped, tokens, updates int
	for range rc.Epochs {
		order := rng.Perm(len(chs))
		per := (len(order) + rc.Minibatches - 1) / rc.Minibatches
		for lo := 0; lo < len(order); lo += per {
			mb := order[lo:min(lo+per, len(order))]
			groups := microBatches(mb, seqs, rc.BatchTokens)
			var seqOf []int // the experience of every learned token, in micro-batch order
			offs := make([]int, len(groups))
			batches := make([]train.Batch, len(groups))
			for gi, g := range groups {
				offs[gi] = len(seqOf)
				var sub []train.Sequence
				for _, c := range g {
					sub = append(sub, seqs[c])
					for _, t := range chs[c].tokens {
						seqOf = append(seqOf, t.exp)
					}
				}
				batches[gi] = train.Pack(sub)
			}
			weights, err := grpo.TokenWeights(rc.Aggregation, seqOf)
			if err != nil {
				return err
			}
			ps, err := l.AccumulatePolicy(batches, func(gi int) train.TrainOptions {
				return train.TrainOptions{Recompute: rc.Recompute, Dropout: true, Seed: uint64(tr.Step)<<16 ^ uint64(offs[gi])}
			}, func(gi int) train.PolicyInputs {
				group, b := groups[gi], batches[gi]
				n := len(b.Seq)
				x := train.PolicyInputs{Ref: make([]float32, n), Adv: make([]float32, n), Weight: make([]float32, n)}
				if old != nil {
					x.Old = make([]float32, n)
				}
				pos := map[int]int{}
				for k, s := range b.Seq {
					c := group[s]
					j := pos[c]
					pos[c]++
					x.Ref[k], x.Adv[k] = float32(refLp[c][j]), float32(adv[chs[c].tokens[j].exp])
					x.Weight[k] = float32(weights[offs[gi]+k])
					if old != nil {
						x.Old[k] = float32(old[c][j])
					}
				}
				return x
			}, rc.Clip, rc.Beta)
			if err != nil {
				return err
			}
			loss += ps.Surrogate + rc.Beta*ps.KL
			kl += ps.KL
			clipped += int(ps.Clipped)
			tokens += ps.Tokens
			ent += ps.Entropy
			norm, _, err := l.Update()
			if err != nil {
				return err
			}
			st.GradNorm = norm
			updates++
		}
	}
	st.Loss = loss / float64(updates)
	st.KL = kl / float64(updates)
	st.ClipFrac = float64(clipped) / float64(max(tokens, 1))
	st.Entropy = ent / float64(max(tokens, 1))
	return nil
}

// chain is one training sequence holding consecutive policy calls of a
// rollout: while the context only grows, call j+1's prompt begins with call
// j's prompt and response, so one sequence carries them all and each
// response is learned where it stands. Filter, Summary and the Stage 2
// reset rewrite the context and start a new chain. The loss is the same as
// training each call on its own sequence, for a fraction of the tokens.
type chain struct {
	seq    train.Sequence
	tokens []chainToken // the learned tokens, in order
}

type chainToken struct{ exp, pos int }

func chains(exps []rollout.Experience) []chain {
	var out []chain
	last := map[int]int{} // rollout -> index of its open chain
	for i, e := range exps {
		full := append(append([]int(nil), e.PromptIDs...), e.ResponseIDs...)
		if ci, ok := last[e.Rollout]; ok && hasPrefix(e.PromptIDs, out[ci].seq.IDs) {
			c := &out[ci]
			n := len(c.seq.IDs)
			c.seq.IDs = append(c.seq.IDs, full[n:]...)
			for j := n; j < len(full); j++ {
				c.seq.Loss = append(c.seq.Loss, j >= len(e.PromptIDs))
			}
			for j := range e.ResponseIDs {
				c.tokens = append(c.tokens, chainToken{i, j})
			}
			continue
		}
		c := chain{seq: train.Sequence{IDs: full, Loss: make([]bool, len(full))}}
		for j := len(e.PromptIDs); j < len(full); j++ {
			c.seq.Loss[j] = true
			c.tokens = append(c.tokens, chainToken{i, j - len(e.PromptIDs)})
		}
		last[e.Rollout] = len(out)
		out = append(out, c)
	}
	return out
}

func hasPrefix(s, prefix []int) bool {
	if len(prefix) > len(s) {
		return false
	}
	for i, v := range prefix {
		if s[i] != v {
			return false
		}
	}
	return true
}

// microBatches groups sequence indices into packs of at most batchTokens.
func microBatches(idx []int, seqs []train.Sequence, batchTokens int) [][]int {
	var out [][]int
	var cur []int
	size := 0
	for _, i := range idx {
		n := len(seqs[i].IDs)
		if len(cur) > 0 && size+n > batchTokens {
			out = append(out, cur)
			cur, size = nil, 0
		}
		cur = append(cur, i)
		size += n
	}
	if len(cur) > 0 {
		out = append(out, cur)
	}
	return out
}

// score returns each sequence's learned-token log-probabilities under w,
// without gradients.
func score(l train.Learner, w *train.Weights[float32], seqs []train.Sequence, batchTokens int, o train.TrainOptions) ([][]float64, error) {
	idx := make([]int, len(seqs))
	for i := range idx {
		idx[i] = i
	}
	groups := microBatches(idx, seqs, batchTokens)
	batches := make([]train.Batch, len(groups))
	for gi, group := range groups {
		var sub []train.Sequence
		for _, i := range group {
			sub = append(sub, seqs[i])
		}
		batches[gi] = train.Pack(sub)
	}
	lps, err := l.Score(w, batches, o)
	if err != nil {
		return nil, err
	}
	out := make([][]float64, len(seqs))
	for gi, group := range groups {
		for k, s := range batches[gi].Seq {
			out[group[s]] = append(out[group[s]], float64(lps[gi][k]))
		}
	}
	return out, nil
}

// tasksFor picks step's tasks: a seeded shuffle of the task list, walked in
// order and reshuffled each pass, so a resumed run sees the same tasks.
func tasksFor(tasks []env.Task, step, n int, seed uint64) []env.Task {
	per := len(tasks) / n
	epoch, at := step/per, (step%per)*n
	order := rand.New(rand.NewPCG(seed, uint64(epoch))).Perm(len(tasks))
	out := make([]env.Task, n)
	for i := range out {
		out[i] = tasks[order[at+i]]
	}
	return out
}

func rewardWeights(r config.Reward) reward.Weights {
	return reward.Weights{Task: r.WTask, Context: r.WContext, Memory: r.WMemory,
		Compression: r.AlphaCompression, Preventive: r.AlphaPreventive, Preservation: r.AlphaPreservation,
		Storage: r.BetaStorage, Maintenance: r.BetaMaintenance, Relevance: r.BetaRelevance,
		NoAnswer: r.PNoAnswer, Rounds: r.PRounds, Overflow: r.POverflow, TMax: r.TMax}
}

func components(b reward.Breakdown) map[string]float64 {
	return map[string]float64{"r_task": b.Task, "r_context": b.Context, "r_memory": b.Memory, "p_penalty": b.Penalty,
		"r_compression": b.Compression, "r_preventive": b.Preventive, "r_preservation": b.Preservation,
		"r_storage": b.Storage, "r_maintenance": b.Maintenance, "r_relevance": b.Relevance}
}

// judgesFor builds the judges of the reward section: deterministic by
// default; "policy" sends the paper's prompts to the starting policy
// (rl.init), frozen, so the judge does not drift with what it judges.
func judgesFor(c config.Config, p *train.Model, tok *tokenizer.Tokenizer, tmpl chat.Template) (reward.Judges, error) {
	j := reward.Judges{Task: reward.F1Judge{}, Storage: reward.F1Storage{Threshold: c.Reward.StorageF1Threshold},
		Relevance: reward.CosineRelevance{Embedder: embed.NewHashing(c.Embed.Dim, c.Embed.CharNgrams)}}
	r := c.Reward
	if r.Judge != "policy" && r.StorageJudge != "policy" && r.RelevanceJudge != "policy" {
		// ollama judges are set by roles.Judges.
		if r.Judge == "em" {
			j.Task = reward.EMJudge{}
		}
		return j, nil
	}
	m, err := p.W.Engine(cpu.New())
	if err != nil {
		return j, err
	}
	pol := decode.NewGenerator(m, tok, decode.Sampling{MaxTokens: 16})
	pol.Template = tmpl
	switch r.Judge {
	case "em":
		j.Task = reward.EMJudge{}
	case "policy":
		j.Task = reward.LLMJudge{Policy: pol}
	}
	if r.StorageJudge == "policy" {
		j.Storage = reward.LLMStorage{Policy: pol}
	}
	if r.RelevanceJudge == "policy" {
		j.Relevance = reward.LLMRelevance{Policy: pol}
	}
	return j, nil
}
