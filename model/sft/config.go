package sft

import (
	"github.com/agemem/agemem/internal/valid"
	"github.com/agemem/agemem/model/optim"
)

// Config is supervised fine-tuning on chat JSONL (config section "sft").
type Config struct {
	// Data is chat JSONL: one {"messages": [...]} per line.
	Data string `yaml:"data"`
	// EvalFraction of the records is held out for the eval loss.
	EvalFraction float64 `yaml:"eval_fraction"`
	// Steps is the number of optimiser steps.
	Steps int `yaml:"steps"`
	// BatchTokens bounds the tokens of one micro-batch.
	BatchTokens int `yaml:"batch_tokens"`
	// GradAccum micro-batches make one optimiser step.
	GradAccum int `yaml:"grad_accum"`
	// The learning rate and its schedule.
	optim.ScheduleConfig `yaml:",inline"`
	// LossOn is "all" (every assistant message a record does not weight 0,
	// OpenAI's fine-tuning convention; what `data sft` writes) or "last"
	// (only the final one).
	LossOn string `yaml:"loss_on"`
	// EvalEvery and SaveEvery are in optimiser steps (0: only at the end).
	EvalEvery int `yaml:"eval_every"`
	SaveEvery int `yaml:"save_every"`
	// Recompute trades a second forward per layer for activation memory.
	Recompute bool `yaml:"recompute"`
	// CopySequences adds that many copy sequences (pretrain's: a random
	// span, a gap, the span again) to every step, so that a model whose
	// copying was pretrained keeps it while it learns the chat data.
	CopySequences int `yaml:"copy_sequences"`
	// CopyWeight multiplies the loss of reply tokens that copy the record's
	// context (CopyTargets: names and facts the user or a tool gave); 1
	// weighs every learned token alike. The held-out loss on those tokens
	// is logged as eval_copy_loss either way.
	CopyWeight float64 `yaml:"copy_weight"`
	// Out receives checkpoints, metrics.jsonl, loss.png and the final policy.
	Out string `yaml:"out"`
}

// DefaultConfig is the embedded default's: 300 steps of 4,096 tokens.
func DefaultConfig() Config {
	return Config{Data: "data/sft.jsonl", EvalFraction: 0.05, Steps: 300, BatchTokens: 4096, GradAccum: 1,
		ScheduleConfig: optim.ScheduleConfig{LR: 1e-2, Schedule: "cosine", WarmupSteps: 10, MinLRRatio: 0.1}, LossOn: "all", CopyWeight: 1,
		EvalEvery: 50, SaveEvery: 100, Out: "runs/tiny/sft"}
}

// Validate checks every key.
func (c Config) Validate() error {
	var e valid.Errors
	e.Fraction("eval_fraction", c.EvalFraction)
	e.AtLeast("steps", c.Steps, 1)
	e.AtLeast("batch_tokens", c.BatchTokens, 16)
	e.AtLeast("grad_accum", c.GradAccum, 1)
	if err := c.ScheduleConfig.Validate(); err != nil {
		e = append(e, err.(valid.Errors)...)
	}
	e.OneOf("loss_on", c.LossOn, "last", "all")
	e.AtLeast("eval_every", c.EvalEvery, 0)
	e.AtLeast("save_every", c.SaveEvery, 0)
	e.AtLeast("copy_sequences", c.CopySequences, 0)
	if !(c.CopyWeight >= 1) {
		e.Add("copy_weight", "%g must be at least 1 (1: no extra weight)", c.CopyWeight)
	}
	return e.Err()
}
