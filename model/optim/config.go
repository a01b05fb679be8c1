package optim

import "github.com/agemem/agemem/internal/valid"

// Config is AdamW and gradient clipping (config section "optim", shared by
// SFT and RL).
type Config struct {
	// Beta1, Beta2, Eps and WeightDecay are AdamW's (PyTorch's names).
	Beta1       float64 `yaml:"beta1"`
	Beta2       float64 `yaml:"beta2"`
	Eps         float64 `yaml:"eps"`
	WeightDecay float64 `yaml:"weight_decay"`
	// ClipNorm clips gradients to this global L2 norm (0: off).
	ClipNorm float64 `yaml:"clip_norm"`
}

// DefaultConfig is PyTorch's AdamW with weight decay 0.01, clipped at 1.
func DefaultConfig() Config {
	return Config{Beta1: 0.9, Beta2: 0.999, Eps: 1e-8, WeightDecay: 0.01, ClipNorm: 1}
}

// Validate checks every key.
func (c Config) Validate() error {
	var e valid.Errors
	e.Fraction("beta1", c.Beta1)
	e.Fraction("beta2", c.Beta2)
	e.Positive("eps", c.Eps)
	e.NotNegative("weight_decay", c.WeightDecay)
	if c.ClipNorm < 0 {
		e.Add("clip_norm", "%g must not be negative (0 turns clipping off)", c.ClipNorm)
	}
	return e.Err()
}

// AdamW is the optimiser's part of the config.
func (c Config) AdamW() AdamWConfig {
	return AdamWConfig{Beta1: c.Beta1, Beta2: c.Beta2, Eps: c.Eps, WeightDecay: c.WeightDecay}
}

// ScheduleConfig is a learning-rate schedule as the sft and rl sections
// give it.
type ScheduleConfig struct {
	// LR is the peak rate; Schedule is constant or cosine after WarmupSteps
	// of linear warmup; cosine decays to MinLRRatio·LR.
	LR          float64 `yaml:"lr"`
	Schedule    string  `yaml:"schedule"`
	WarmupSteps int     `yaml:"warmup_steps"`
	MinLRRatio  float64 `yaml:"min_lr_ratio"`
}

// Validate checks every key.
func (s ScheduleConfig) Validate() error {
	var e valid.Errors
	e.Positive("lr", s.LR)
	e.OneOf("schedule", s.Schedule, "constant", "cosine")
	e.AtLeast("warmup_steps", s.WarmupSteps, 0)
	e.Ratio("min_lr_ratio", s.MinLRRatio)
	return e.Err()
}

// Over is the schedule over total steps.
func (s ScheduleConfig) Over(total int) Schedule {
	return Schedule{Warmup: s.WarmupSteps, Total: total, Cosine: s.Schedule == "cosine", MinRatio: s.MinLRRatio}
}
