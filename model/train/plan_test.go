package train

import (
	"strings"
	"testing"

	"github.com/agemem/agemem/model/lora"
	"github.com/agemem/agemem/model/qwen"
)

// TestPlan: a run's plan holds what the run would hold, item by item, on
// Qwen3-4B's shape (36 layers of 8 KV heads of 128: 294,912 bytes of keys
// and values a position): the reference policy only for full fine-tuning
// at rl.beta > 0; a rollout engine of its own (every parameter in f32)
// except on GPUs, whose rollouts decode with the trainer's weights; KV
// caches of every rollout, or of rl.kv_budget (at least one whole
// rollout) and as much again for the prefix cache. Print names the
// largest item first when the run does not fit.
func TestPlan(t *testing.T) {
	const kvPerPos = 36 * 2 * 8 * 128 * 4
	base := PlanOptions{Policy: "qwen3-4b", Model: qwen.Presets["qwen3-4b-shape"],
		LoRA:    lora.Options{Enabled: true, R: 16, Alpha: 32, TargetModules: qwen.LoRATargets},
		Learner: LearnerOptions{Devices: []string{"cuda:0", "cuda:1"}, BF16: true}, Beta: 0.1,
		Tasks: 8, K: 8, ContextBudget: 8192, ResponseBudget: 2048, KVBudget: 8192, PrefixCache: true, BatchTokens: 10240, Recompute: true}
	for _, c := range []struct {
		name            string
		edit            func(o *PlanOptions)
		ref, engine     bool
		kvPositions     float64
		weightsLabel    string
		activationsBF16 bool
	}{
		{"LoRA on GPUs", func(*PlanOptions) {}, false, false, 10240 + 8192, "weights (bf16 frozen base, f32 adapters)", true},
		{"without the prefix cache", func(o *PlanOptions) { o.PrefixCache = false }, false, false, 10240, "weights (bf16 frozen base, f32 adapters)", true},
		{"a budget above a rollout", func(o *PlanOptions) { o.KVBudget, o.PrefixCache = 20000, false }, false, false, 20000, "weights (bf16 frozen base, f32 adapters)", true},
		{"no budget", func(o *PlanOptions) { o.KVBudget = 0 }, false, false, 64 * 10240, "weights (bf16 frozen base, f32 adapters)", true},
		{"full fine-tuning", func(o *PlanOptions) { o.LoRA.Enabled = false }, true, false, 10240 + 8192, "weights (f32 masters)", true},
		{"full fine-tuning at rl.beta 0", func(o *PlanOptions) { o.LoRA.Enabled, o.Beta = false, 0 }, false, false, 10240 + 8192, "weights (f32 masters)", true},
		{"the CPU tape", func(o *PlanOptions) { o.Learner.Devices = nil }, false, true, 10240 + 8192, "weights (f32 frozen base and adapters)", false},
	} {
		t.Run(c.name, func(t *testing.T) {
			o := base
			o.Learner.Devices = append([]string(nil), base.Learner.Devices...)
			c.edit(&o)
			p := NewPlan(o)
			if got := p.Reference.Bytes > 0; got != c.ref {
				t.Errorf("reference policy %.0f bytes, want one: %v", p.Reference.Bytes, c.ref)
			}
			if got := p.Engine.Bytes; c.engine && got != 4*p.Params || !c.engine && got != 0 {
				t.Errorf("rollout engine %.0f bytes of %.0f parameters, want its own f32 copy: %v", got, p.Params, c.engine)
			}
			if want := c.kvPositions * kvPerPos; p.KV.Bytes != want {
				t.Errorf("KV caches %.0f bytes, want %.0f positions' %.0f", p.KV.Bytes, c.kvPositions, want)
			}
			if p.Weights.Label != c.weightsLabel {
				t.Errorf("weights line %q, want %q", p.Weights.Label, c.weightsLabel)
			}
			if got := strings.Contains(p.Activations.Label, "bf16 checkpoints"); got != c.activationsBF16 {
				t.Errorf("activations line %q: bf16 checkpoints %v, want %v", p.Activations.Label, got, c.activationsBF16)
			}
			sum := 0.0
			for _, it := range p.Items() {
				sum += it.Bytes
			}
			if d := sum - p.Total(); d > 1 || d < -1 {
				t.Errorf("total %.0f, items sum to %.0f", p.Total(), sum)
			}
			if d := p.Total() - p.Update() - p.Engine.Bytes - p.KV.Bytes; d > 1 || d < -1 {
				t.Errorf("the update alone %.0f is not the total %.0f less the engine and the KV caches", p.Update(), p.Total())
			}
		})
	}
	p := NewPlan(base)
	var fits, tight strings.Builder
	p.Print(&fits, p.Total()/(1<<30)+1)
	p.Print(&tight, 1)
	if !strings.Contains(fits.String(), "fits in") || strings.Contains(fits.String(), "does not fit") {
		t.Errorf("a device larger than the total:\n%s", fits.String())
	}
	largest := p.Weights // 4B parameters at 2 bytes: the largest on a 1 GiB device
	for _, it := range p.Items() {
		if it.Bytes > largest.Bytes {
			t.Fatalf("%s (%.0f bytes) outweighs the weights (%.0f)", it.Name, it.Bytes, largest.Bytes)
		}
	}
	if !strings.Contains(tight.String(), "does not fit in 1 GiB per device (--device-gib): the largest item is "+largest.Name) ||
		!strings.Contains(tight.String(), "to shrink it: "+largest.Fix) {
		t.Errorf("a 1 GiB device: the advice does not start with the weights:\n%s", tight.String())
	}
}
