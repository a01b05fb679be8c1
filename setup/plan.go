package setup

import (
	"fmt"

	"github.com/agemem/agemem/model/qwen"
	"github.com/agemem/agemem/model/train"
)

// Plan is the memory per device of the GRPO run cfg describes (agemem-train
// train --dry-run), the policy's shape read from rl.init's config.json.
func Plan(cfg Config) (train.Plan, error) {
	mc, err := qwen.LoadConfig(cfg.RL.Init)
	if err != nil {
		return train.Plan{}, fmt.Errorf("rl.init: %w", err)
	}
	rc := cfg.RL
	return train.NewPlan(train.PlanOptions{Policy: rc.Init, Model: mc, LoRA: cfg.LoRA, Learner: learnerOptions(cfg), Beta: rc.Beta,
		Tasks: rc.BatchTasks, K: rc.K, ContextBudget: cfg.Agent.ContextBudget, ResponseBudget: cfg.Agent.ResponseBudget,
		KVBudget: rc.KVBudget, PrefixCache: rc.PrefixCache, BatchTokens: rc.BatchTokens, Recompute: rc.Recompute}), nil
}
