package train

import (
	"cmp"
	"fmt"
	"io"
	"slices"
	"strings"

	"github.com/agemem/agemem/model/lora"
	"github.com/agemem/agemem/model/qwen"
)

// PlanOptions are what the memory of a GRPO run (agemem-train train)
// depends on, from its config.
type PlanOptions struct {
	Policy  string      // rl.init, named in the report
	Model   qwen.Config // its config.json
	LoRA    lora.Options
	Learner LearnerOptions // where the steps run
	// Beta is rl.beta: at 0 there is no KL term, so no reference policy.
	Beta float64
	// Tasks x K rollouts a step (rl.batch_tasks, rl.k), each a context of
	// up to ContextBudget + ResponseBudget tokens (agent.context_budget,
	// agent.response_budget).
	Tasks, K                      int
	ContextBudget, ResponseBudget int
	// KVBudget is rl.kv_budget, the paged KV pool's positions (0: none);
	// PrefixCache (rl.prefix_cache) keeps that many again.
	KVBudget    int
	PrefixCache bool
	// BatchTokens is rl.batch_tokens, a micro-batch; Recompute is
	// rl.recompute.
	BatchTokens int
	Recompute   bool
}

// PlanItem is one thing a device holds during a run.
type PlanItem struct {
	Label string  // its line in the report
	Name  string  // as the advice names it
	Bytes float64 // per device
	Fix   string  // the settings that shrink it
}

// Plan is the memory a GRPO run needs on each device, item by item:
// agemem-train train --dry-run prints it.
type Plan struct {
	PlanOptions
	Params, Trainable float64 // the model's parameters, and those that train
	// LogitChunk is how many learned tokens' vocabulary logits exist at once.
	LogitChunk int
	// The items, in the report's order.
	Weights, Reference, Optimizer, Engine, KV, Activations, Logits PlanItem
}

// NewPlan estimates o's memory per device from StateBytes,
// ReferenceBytes and ActivationBytes.
func NewPlan(o PlanOptions) Plan {
	mc := o.Model
	L, kvw := float64(mc.Layers), float64(mc.KVHeads*mc.HeadDim)
	devices := o.Learner.Devices
	// The frozen base as the devices hold it (the CPU tape holds float32).
	base, shards, stage := BaseF32, 1, 0
	if len(devices) > 0 {
		base = o.Learner.base()
		if o.Learner.ZeroStage > 0 && len(devices) > 1 {
			shards, stage = len(devices), o.Learner.ZeroStage
		}
	}
	st := StateBytes(mc, o.LoRA, base, shards, stage)
	p := Plan{PlanOptions: o, Params: st.Params, Trainable: st.Trainable}
	working := stage >= 2 && base != BaseF32
	wname := "weights (f32 masters)"
	switch {
	case !o.LoRA.Enabled && working:
		wname = fmt.Sprintf("weights (bf16 working copies, 1/%d of the f32 masters)", shards)
	case working:
		wname = fmt.Sprintf("weights (bf16 frozen base, bf16 adapters, 1/%d of their f32 masters)", shards)
	case o.LoRA.Enabled && base == BaseBF16:
		wname = "weights (bf16 frozen base, f32 adapters)"
	case o.LoRA.Enabled && base == BaseQ8:
		wname = "weights (Q8_0 projections, bf16 embeddings, f32 adapters)"
	case o.LoRA.Enabled:
		wname = "weights (f32 frozen base and adapters)"
	}
	// The frozen reference: the base itself under LoRA, none at rl.beta 0
	// (no KL term), else a copy held as the devices hold frozen weights.
	offload := o.Learner.OffloadReference && len(devices) > 0
	ref, refName := ReferenceBytes(mc, base, offload), "reference policy"
	switch {
	case o.LoRA.Enabled || o.Beta == 0:
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
	engine := 4 * st.Params // the rollout engine's copy of the weights
	ename := "rollout engine weights"
	if slices.ContainsFunc(devices, func(d string) bool { return strings.HasPrefix(d, "cuda") }) {
		// Rollouts decode on the training GPUs over the replicas' own
		// weights (Replica.Engine): no second copy.
		engine, ename = 0, "rollout engine weights (the trainer's, shared)"
	}
	seqs := float64(o.K * o.Tasks)
	kvPos := seqs * float64(o.ContextBudget+o.ResponseBudget)
	kvName := "KV caches of all rollouts (upper bound)"
	if b := float64(o.KVBudget); b > 0 {
		// The paged pool holds at least one whole rollout (it runs alone).
		b = max(b, float64(o.ContextBudget+o.ResponseBudget))
		if o.PrefixCache {
			b += float64(o.KVBudget) // the prefix cache keeps the budget again
		}
		if b < kvPos {
			kvPos, kvName = b, "KV caches (rl.kv_budget)"
		}
	}
	kv := kvPos * L * 2 * kvw * 4
	// A micro-batch is rl.batch_tokens, but never less than one whole
	// rollout: a sequence is not split across micro-batches.
	mb := max(o.BatchTokens, o.ContextBudget+o.ResponseBudget)
	onDevices, bf16 := len(devices) > 0, base != BaseF32
	act, logits := ActivationBytes(mc, mb, o.BatchTokens, TrainOptions{Recompute: o.Recompute}, onDevices, bf16)
	actName := "activations of a micro-batch"
	if o.Recompute && onDevices && bf16 {
		actName = "activations of a micro-batch (bf16 checkpoints)"
	}
	p.LogitChunk = min(o.BatchTokens, max(1, LogitChunkFloats/mc.VocabSize))

	// What shrinks each item, for a run that does not fit.
	weightsFix := "lora.enabled: true with model.train_dtype: bf16 (a bf16 frozen base)"
	switch {
	case len(devices) == 0:
		weightsFix = "GPUs in model.devices (the CPU tape holds every weight in f32) with lora.enabled: true and model.train_dtype: bf16 or q8_0"
	case o.LoRA.Enabled && base == BaseF32:
		weightsFix = "model.train_dtype: bf16 or q8_0 (a 16- or 8-bit frozen base)"
	case o.LoRA.Enabled && base == BaseBF16:
		weightsFix = "model.train_dtype: q8_0 (the base's projections in 8 bits)"
	case o.LoRA.Enabled && base == BaseQ8:
		weightsFix = "a larger device: the base is 8-bit already (a 4-bit base is not built)"
	case !o.LoRA.Enabled && !working:
		weightsFix = "model.train_dtype: bf16 with model.zero_stage: 2 over several model.devices (bf16 working weights, the f32 masters split across the devices), or lora.enabled: true"
	case !o.LoRA.Enabled:
		weightsFix = "lora.enabled: true (a bf16 frozen base and small adapters), or more devices (each holds 1/N of the masters)"
	}
	refFix := "rl.beta: 0 (no KL term, so no reference: DAPO, Dr. GRPO), or lora.enabled: true (the reference is the base without the adapter)"
	if len(devices) > 0 && !offload {
		refFix = "model.offload_reference: true (its layers uploaded one at a time), " + refFix
	}
	if base == BaseF32 && len(devices) > 0 {
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
	if o.KVBudget > 0 && o.PrefixCache {
		kvFix = "rl.prefix_cache: false (the prefix cache holds rl.kv_budget again), a smaller rl.kv_budget, or lower agent.context_budget"
	}
	actFix := "rl.recompute: true, or a smaller rl.batch_tokens"
	if o.Recompute {
		actFix = "a smaller rl.batch_tokens (recomputation is on; a rollout is never split)"
	}

	p.Weights = PlanItem{wname, wname, st.Weights, weightsFix}
	p.Reference = PlanItem{refName, "the reference policy", ref, refFix}
	p.Optimizer = PlanItem{oname, oname, st.Optimizer, optFix}
	p.Engine = PlanItem{ename, "the rollout engine's weights", engine, "GPUs in model.devices (rollouts then decode with the trainer's own weights)"}
	p.KV = PlanItem{kvName, "the KV caches", kv, kvFix}
	p.Activations = PlanItem{actName, "the activations", act, actFix}
	p.Logits = PlanItem{fmt.Sprintf("vocabulary logits and gradient (%d tokens at a time)", p.LogitChunk), "the vocabulary logits", logits, "nothing: they are already chunked"}
	return p
}

// Items are the plan's items in the report's order.
func (p Plan) Items() []PlanItem {
	return []PlanItem{p.Weights, p.Reference, p.Optimizer, p.Engine, p.KV, p.Activations, p.Logits}
}

// Update is what the update holds alone: no engine, no KV caches.
func (p Plan) Update() float64 {
	return p.Weights.Bytes + p.Reference.Bytes + p.Optimizer.Bytes + p.Activations.Bytes + p.Logits.Bytes
}

// Total is every item's bytes. The update's items were checked on an H100
// (BenchmarkCUDAPaperStep, 7B shape, one 10240-token rollout a
// micro-batch) before the MLP chunks and bf16 checkpoints: 24.54 GiB
// predicted, 25.65 GiB measured at the allocator's peak.
func (p Plan) Total() float64 {
	return p.Weights.Bytes + p.Reference.Bytes + p.Optimizer.Bytes + p.Engine.Bytes + p.KV.Bytes + p.Activations.Bytes + p.Logits.Bytes
}

// Print writes the plan and whether it fits devices of deviceGiB GiB;
// when it does not, the largest item and the setting that shrinks it,
// then the others a setting can still shrink.
func (p Plan) Print(w io.Writer, deviceGiB float64) {
	gib := func(b float64) string { return fmt.Sprintf("%.2f GiB", b/(1<<30)) }
	mc := p.Model
	fmt.Fprintf(w, "config valid; policy %s: %s, %d layers, hidden %d, %.2fM parameters, %.2fM trainable (%s)\n",
		p.Policy, mc.ModelType, mc.Layers, mc.HiddenSize, p.Params/1e6, p.Trainable/1e6, map[bool]string{true: "LoRA", false: "full"}[p.LoRA.Enabled])
	fmt.Fprintf(w, "a step: %d tasks x %d rollouts, contexts up to %d + %d tokens, micro-batches of %d tokens\n", p.Tasks, p.K, p.ContextBudget, p.ResponseBudget, p.BatchTokens)
	devs := "the CPU tape (model.devices is empty)"
	if len(p.Learner.Devices) > 0 {
		devs = strings.Join(p.Learner.Devices, ", ")
	}
	fmt.Fprintf(w, "memory per device (%s):\n", devs)
	lines := p.Items()
	lines = append(lines, PlanItem{Label: "the update alone (no engine, no KV caches)", Bytes: p.Update()}, PlanItem{Label: "total (approximate)", Bytes: p.Total()})
	for _, l := range lines {
		fmt.Fprintf(w, "  %-58s %s\n", l.Label, gib(l.Bytes))
	}
	if p.Total() <= deviceGiB*(1<<30) {
		fmt.Fprintf(w, "fits in %.0f GiB per device\n", deviceGiB)
		return
	}
	// The largest first, then the others a setting can still shrink: the
	// largest may take the biggest change (LoRA, more devices) where a
	// smaller item's setting is enough.
	items := p.Items()
	slices.SortStableFunc(items, func(a, b PlanItem) int { return cmp.Compare(b.Bytes, a.Bytes) })
	fmt.Fprintf(w, "does not fit in %.0f GiB per device (--device-gib): the largest item is %s (%s); to shrink it: %s\n", deviceGiB, items[0].Name, gib(items[0].Bytes), items[0].Fix)
	for _, it := range items[1:] {
		if it.Bytes >= 1<<28 && !strings.HasPrefix(it.Fix, "nothing") { // a quarter GiB
			fmt.Fprintf(w, "  then %s (%s): %s\n", it.Name, gib(it.Bytes), it.Fix)
		}
	}
}
