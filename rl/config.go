package rl

import (
	"fmt"
	"net/url"
	"time"

	"github.com/agemem/agemem/internal/valid"
	"github.com/agemem/agemem/model/optim"
	"github.com/agemem/agemem/rl/grpo"
)

// Config is step-wise GRPO (config section "rl").
type Config struct {
	// Init is the policy GRPO starts from (a Hugging Face directory, the SFT
	// output); it is also the frozen reference π_ref (with LoRA: its base).
	Init string `yaml:"init"`
	// K rollouts per task form a group; BatchTasks tasks make a step.
	K          int `yaml:"k"`
	BatchTasks int `yaml:"batch_tasks"`
	// Steps is how many GRPO updates the run makes.
	Steps int `yaml:"steps"`
	// The learning rate and its schedule.
	optim.ScheduleConfig `yaml:",inline"`
	// Clip is PPO's ε; Beta the KL weight β (Eq. 6; 0: no KL term and no
	// reference policy); Eps the ε of Eq. 5.
	Clip float64 `yaml:"clip"`
	Beta float64 `yaml:"beta"`
	Eps  float64 `yaml:"eps"`
	// ScaleRewards divides each group's centred rewards by the group's
	// standard deviation (group, Eq. 5), the step's (batch) or nothing
	// (none), as TRL's scale_rewards.
	ScaleRewards string `yaml:"scale_rewards"`
	// Aggregation is token-mean or seq-mean-token-mean.
	Aggregation string `yaml:"aggregation"`
	// Epochs over each step's experiences, in Minibatches optimiser steps.
	Epochs      int `yaml:"epochs"`
	Minibatches int `yaml:"minibatches"`
	// BatchTokens bounds one forward/backward micro-batch.
	BatchTokens int `yaml:"batch_tokens"`
	// Temperature and TopP of rollout sampling. The update scores the
	// tokens at the same temperature (π_θ, π_old and π_ref of logits/T).
	Temperature float64 `yaml:"temperature"`
	TopP        float64 `yaml:"top_p"`
	// SaveEvery writes a checkpoint every that many steps (0: only at the
	// end), the one --resume continues from.
	SaveEvery int `yaml:"save_every"`
	// Recompute trades compute for memory: each layer's activations are
	// recomputed in the backward pass instead of kept (gradient
	// checkpointing).
	Recompute bool `yaml:"recompute"`
	// PrefixCache keeps each rollout's key/value cache between its calls,
	// so a call prefills only what its context gained (false: every call
	// prefills its whole context, as before).
	PrefixCache bool `yaml:"prefix_cache"`
	// KVBudget is, per rollout engine, the positions of the paged KV pool
	// the calls decode in, and the positions the prefix cache keeps:
	// rollouts beyond it wait, and one the pool runs short for is
	// recomputed (0: no bound, contiguous caches, every live rollout
	// decodes together).
	KVBudget int `yaml:"kv_budget"`
	// FilterGroups is DAPO's dynamic sampling: a task's group joins the
	// update only when this part of the reward (r_task, say; "reward" for
	// the total) differs between its rollouts; "" keeps every group.
	// MaxRounds bounds the rollout rounds a step plays to gather
	// BatchTasks such groups (1: the groups that do not vary are dropped
	// and the step learns from fewer).
	FilterGroups string `yaml:"filter_groups"`
	// MaxRounds bounds the rounds of regeneration FilterGroups makes for one step.
	MaxRounds int `yaml:"max_rounds"`
	// Validation (with Options.Validate, which the CLI sets from
	// data.val): the policy plays ValTasks validation tasks greedily
	// before the first step, every ValEvery steps and after the last
	// (0: only then); with KeepBest, out/policy is the trained step that
	// scored best, not the last (Hugging Face's load_best_model_at_end).
	ValEvery int `yaml:"val_every"`
	// ValTasks is how many validation tasks each validation plays.
	ValTasks int `yaml:"val_tasks"`
	// KeepBest makes out/policy the step that scored best on validation.
	KeepBest bool `yaml:"keep_best"`
	// Out is the run's directory: checkpoints, metrics, the final policy.
	Out string `yaml:"out"`
	// Engines are OpenAI-compatible servers the rollouts run on, by their
	// API roots (http://host:8000/v1): vLLM started with --enable-lora, or
	// serve, both with VLLM_ALLOW_RUNTIME_LORA_UPDATING=true; each loads
	// every adapter version before the step that uses it. Empty: rollouts
	// decode in process. Needs lora.enabled (rl/fleet).
	Engines []string `yaml:"engines"`
	// EngineKeyEnv names the variable that holds the engines' API key (an
	// admin key of serve); "" sends none.
	EngineKeyEnv string `yaml:"engine_key_env"`
	// EngineTimeout bounds one request to an engine, EngineRetries its
	// retries on a connection error or 5xx: past them the engine counts
	// as failed and its episodes are played again on the others.
	EngineTimeout time.Duration `yaml:"engine_timeout"`
	// EngineRetries is how often one request to an engine is retried on a
	// connection error or 5xx before the engine counts as failed.
	EngineRetries int `yaml:"engine_retries"`
	// AdapterDir is a directory every engine reads (a shared filesystem;
	// vLLM loads adapters from paths only) where each version is
	// published; "": they are published under out/adapters and served to
	// the engines over HTTP at AdapterAddr ("": a free port on every
	// interface, the engines told the address that routes to them).
	AdapterDir string `yaml:"adapter_dir"`
	// AdapterAddr is where the trainer serves published adapters over HTTP
	// when AdapterDir is "" ("": a free port on every interface).
	AdapterAddr string `yaml:"adapter_addr"`
}

// DefaultConfig is the paper's K 8, β 0.1 and the common PPO clip 0.2.
func DefaultConfig() Config {
	return Config{Init: "checkpoints/tiny", K: 8, BatchTasks: 2, Steps: 6,
		ScheduleConfig: optim.ScheduleConfig{LR: 1e-4, Schedule: "constant", MinLRRatio: 0.1},
		Clip:           0.2, Beta: 0.1, Eps: 1e-6, ScaleRewards: "group", Aggregation: "token-mean", Epochs: 1, Minibatches: 1, BatchTokens: 4096,
		Temperature: 1, TopP: 1, SaveEvery: 10, PrefixCache: true, MaxRounds: 1, ValEvery: 10, ValTasks: 200, Out: "runs/tiny/rl",
		Engines: []string{}, EngineTimeout: 2 * time.Minute, EngineRetries: 1}
}

// Validate checks every key.
func (c Config) Validate() error {
	var e valid.Errors
	// GRPO's advantage is a rollout's reward against its group's: a group
	// of one, or greedy rollouts (identical), would train on zeros.
	if c.K < 2 {
		e.Add("k", "%d is below the minimum 2: GRPO compares a task's rollouts with one another", c.K)
	}
	e.AtLeast("batch_tasks", c.BatchTasks, 1)
	e.AtLeast("steps", c.Steps, 1)
	e.AtLeast("kv_budget", c.KVBudget, 0)
	e.AtLeast("max_rounds", c.MaxRounds, 1)
	if err := c.ScheduleConfig.Validate(); err != nil {
		e = append(e, err.(valid.Errors)...)
	}
	if c.Clip <= 0 || c.Clip >= 1 {
		e.Add("clip", "%g is outside (0, 1)", c.Clip)
	}
	e.NotNegative("beta", c.Beta)
	e.Positive("eps", c.Eps)
	e.OneOf("scale_rewards", c.ScaleRewards, grpo.ScaleGroup, grpo.ScaleBatch, grpo.ScaleNone)
	e.OneOf("aggregation", c.Aggregation, "token-mean", "seq-mean-token-mean")
	e.AtLeast("epochs", c.Epochs, 1)
	e.AtLeast("minibatches", c.Minibatches, 1)
	e.AtLeast("batch_tokens", c.BatchTokens, 16)
	if !(c.Temperature > 0) {
		e.Add("temperature", "%g must be positive: greedy rollouts of a task are identical, so GRPO's advantages would all be zero", c.Temperature)
	}
	if c.TopP <= 0 || c.TopP > 1 {
		e.Add("top_p", "%g is outside (0, 1]", c.TopP)
	}
	e.AtLeast("save_every", c.SaveEvery, 0)
	e.AtLeast("val_every", c.ValEvery, 0)
	e.AtLeast("val_tasks", c.ValTasks, 1)
	for i, u := range c.Engines {
		if pu, err := url.Parse(u); err != nil || (pu.Scheme != "http" && pu.Scheme != "https") || pu.Host == "" {
			e.Add(fmt.Sprintf("engines[%d]", i), "%q is not an http(s) API root such as http://10.0.0.5:8000/v1", u)
		}
	}
	if c.EngineTimeout <= 0 {
		e.Add("engine_timeout", "%v must be positive", c.EngineTimeout)
	}
	e.AtLeast("engine_retries", c.EngineRetries, 0)
	return e.Err()
}
