package reward

import (
	"context"

	"github.com/agemem/agemem/env"
	"github.com/agemem/agemem/rl/rollout"
)

// Composite is the composite reward as the GRPO trainer asks for it: an
// episode's score, its components (averaged per step in metrics.jsonl) and
// the per-rollout record of rollouts.jsonl.
type Composite struct {
	Weights Weights
	Judges  Judges
}

// Score implements the trainer's reward.
func (a Composite) Score(ctx context.Context, o env.Outcome) (rollout.Score, error) {
	b, err := Compute(ctx, a.Weights, o.Task, o.Result, a.Judges)
	if err != nil {
		return rollout.Score{}, err
	}
	r := o.Result
	parts := b.Components()
	parts["prompt_tokens"] = float64(r.ContextTokens)
	for k, v := range r.ToolCalls() {
		parts["calls_"+k] = float64(v)
	}
	info := map[string]any{"task_id": o.Task.ID, "answer": r.Answer, "em": r.EM, "context_tokens": r.ContextTokens,
		"tool_calls": r.ToolCalls(), "format_errors": r.FormatErrors(), "overflow": b.Overflowed,
		"rounds_exceeded": b.RoundsOver, "stored": b.StoredTotal, "stored_high_quality": b.StoredGood}
	for k, v := range b.Components() {
		info[k] = v
	}
	info["reward"] = b.Total
	return rollout.Score{Total: b.Total, Parts: parts, Info: info}, nil
}

// Components are the reward's parts by their logged names.
func (b Breakdown) Components() map[string]float64 {
	return map[string]float64{"r_task": b.Task, "r_context": b.Context, "r_memory": b.Memory, "p_penalty": b.Penalty,
		"r_compression": b.Compression, "r_preventive": b.Preventive, "r_preservation": b.Preservation,
		"r_storage": b.Storage, "r_maintenance": b.Maintenance, "r_relevance": b.Relevance}
}
