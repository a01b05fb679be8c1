package simcse

import (
	"regexp"

	"github.com/agemem/agemem/internal/valid"
)

var cudaOrdinal = regexp.MustCompile(`^cuda:[0-9]+$`)

// Config is contrastive training of a sentence encoder (config section
// "simcse").
type Config struct {
	// Init is the encoder training starts from (agemem-train embed init
	// writes a random one; any BERT checkpoint directory works).
	Init string `yaml:"init"`
	// Data is one sentence per line (unsup) or anchor, entailment and
	// contradiction separated by tabs per line (sup).
	Data string `yaml:"data"`
	// Mode is unsup (dropout makes the positive pair) or sup (NLI
	// triples: entailment positive, contradiction hard negative).
	Mode string `yaml:"mode"`
	// Steps optimiser steps of Batch examples.
	Steps int `yaml:"steps"`
	Batch int `yaml:"batch"`
	// LR is the peak learning rate after WarmupSteps of linear warmup.
	LR          float64 `yaml:"lr"`
	WarmupSteps int     `yaml:"warmup_steps"`
	// Temperature is τ of InfoNCE; Dropout the hidden dropout and
	// AttnDropout the dropout on attention probabilities that together
	// make the unsupervised positive pairs (BERT's 0.1 and 0.1).
	Temperature float64 `yaml:"temperature"`
	Dropout     float64 `yaml:"dropout"`
	AttnDropout float64 `yaml:"attn_dropout"`
	// Pooling is what the loss sees: cls_mlp (SimCSE's), cls or mean.
	Pooling string `yaml:"pooling"`
	// SaveEvery and EvalEvery are in steps (0: only at the end).
	SaveEvery int `yaml:"save_every"`
	EvalEvery int `yaml:"eval_every"`
	// STS is an STS-B-format TSV and Tasks a HotpotQA-format file the run
	// is evaluated on (Spearman, supporting-fact recall@RecallK).
	STS     string `yaml:"sts"`
	Tasks   string `yaml:"tasks"`
	RecallK int    `yaml:"recall_k"`
	// Device is where the steps run: auto (a GPU when one is found, else
	// the CPU's autodiff tape), cpu (the tape), cuda or cuda:N (the
	// encoder's forward and backward on that GPU: bert.Trainer).
	Device string `yaml:"device"`
	// Dtype is the GPU's matmuls: f32, or bf16 (tensor cores, bf16
	// inputs, f32 accumulation; the weights, gradients and AdamW stay f32:
	// PyTorch's autocast).
	Dtype string `yaml:"dtype"`
	// Out receives checkpoints, metrics.jsonl, loss.png, eval.png and
	// encoder/.
	Out string `yaml:"out"`
}

// DefaultConfig is unsupervised SimCSE for 1,000 steps of 64 sentences.
func DefaultConfig() Config {
	return Config{Init: "runs/tiny/encoder", Data: "data/simcse/corpus.txt", Mode: "unsup", Steps: 1000, Batch: 64, LR: 5e-4,
		WarmupSteps: 20, Temperature: 0.05, Dropout: 0.1, AttnDropout: 0.1, Pooling: "mean", SaveEvery: 500, EvalEvery: 200,
		STS: "data/simcse/sts-dev.tsv", Tasks: "data/simcse/tasks-eval.json", RecallK: 3, Device: "auto", Dtype: "f32", Out: "runs/tiny/simcse"}
}

// Validate checks every key.
func (sc Config) Validate() error {
	var e valid.Errors
	e.OneOf("mode", sc.Mode, "unsup", "sup")
	e.AtLeast("steps", sc.Steps, 1)
	e.AtLeast("batch", sc.Batch, 2)
	e.Positive("lr", sc.LR)
	e.AtLeast("warmup_steps", sc.WarmupSteps, 0)
	e.Positive("temperature", sc.Temperature)
	e.Fraction("dropout", sc.Dropout)
	e.Fraction("attn_dropout", sc.AttnDropout)
	e.OneOf("pooling", sc.Pooling, "cls", "cls_mlp", "mean")
	e.AtLeast("save_every", sc.SaveEvery, 0)
	e.AtLeast("eval_every", sc.EvalEvery, 0)
	e.AtLeast("recall_k", sc.RecallK, 1)
	e.OneOf("dtype", sc.Dtype, "f32", "bf16")
	if d := sc.Device; d != "auto" && d != "cpu" && d != "cuda" && !cudaOrdinal.MatchString(d) {
		e.Add("device", "%q is not auto, cpu, cuda or cuda:N", d)
	}
	return e.Err()
}
