// Package train is what SFT and RL share: a policy's trainable weights with
// their AdamW state, one optimiser update (clip, schedule, step),
// checkpoints that resume bit-for-bit, the policy's export in the
// ecosystem's layout, and the run's metrics (JSONL, PNG curves, progress).
package train

import (
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"

	"github.com/agemem/agemem/model/checkpoint"
	"github.com/agemem/agemem/model/lora"
	"github.com/agemem/agemem/model/optim"
	"github.com/agemem/agemem/model/qwen"
	"github.com/agemem/agemem/model/safetensors"
)

// Policy is a model directory opened for training: float32 master weights
// (bf16 checkpoints are widened), with a fresh LoRA adapter when asked.
type Policy struct {
	Dir string // the base model directory
	W   *Weights[float32]
}

// Open loads dir for training. With l.Enabled, the base is frozen and a new
// adapter (B = 0, so training starts from the base exactly) is trained. dir
// may also be a PEFT adapter (an SFT run with LoRA): its base is loaded and
// the adapter merged in, so the policy starts where SFT ended.
func Open(dir string, l lora.Options, seed uint64) (*Policy, error) {
	if _, err := os.Stat(filepath.Join(dir, "adapter_config.json")); err == nil {
		return openAdapter(dir, l)
	}
	cfg, err := qwen.LoadConfig(dir)
	if err != nil {
		return nil, err
	}
	st, err := safetensors.OpenDir(dir)
	if err != nil {
		return nil, err
	}
	defer st.Close()
	w, err := newWeights[float32](cfg, st, !l.Enabled) // under LoRA the base is frozen: no gradient buffers
	if err != nil {
		return nil, fmt.Errorf("%s: %w", dir, err)
	}
	if l.Enabled {
		modules, shape := cfg.Linears()
		abs, _ := filepath.Abs(dir)
		a, err := lora.New(l.Config(abs),
			modules, shape, seed, false)
		if err != nil {
			return nil, err
		}
		if err := w.AttachLoRA(a); err != nil {
			return nil, err
		}
	}
	return &Policy{Dir: dir, W: w}, nil
}

// openAdapter loads an adapter's base and merges the adapter into it.
func openAdapter(dir string, l lora.Options) (*Policy, error) {
	if l.Enabled {
		return nil, fmt.Errorf("%s is a LoRA adapter: a new adapter on top of it would have no base on disk; merge it first (agemem-train merge) or train it in full", dir)
	}
	a, err := lora.Load(dir)
	if err != nil {
		return nil, err
	}
	if a.Config.BaseModel == "" {
		return nil, fmt.Errorf("%s/adapter_config.json names no base_model_name_or_path", dir)
	}
	p, err := Open(a.Config.BaseModel, lora.Options{}, 0)
	if err != nil {
		return nil, fmt.Errorf("adapter %s: base: %w", dir, err)
	}
	byName := map[string]NamedVar[float32]{}
	for _, nv := range p.W.Named {
		byName[nv.Name] = nv
	}
	for _, m := range a.Modules {
		nv, ok := byName[m.Name+".weight"]
		if !ok || len(nv.V.Val) != m.B.Rows*m.A.Cols {
			return nil, fmt.Errorf("adapter %s: module %s does not fit the base %s", dir, m.Name, a.Config.BaseModel)
		}
		for i, d := range a.Delta(m) {
			nv.V.Val[i] += d
		}
	}
	p.Dir = dir // its tokenizer files travel with the exported policy
	return p, nil
}

// Export writes the trained policy to dir: with LoRA, the adapter in PEFT's
// layout (load it with --adapter on top of the base); otherwise a full
// Hugging Face directory. The tokenizer files travel along either way.
func (p *Policy) Export(dir string, dtype safetensors.DType) error {
	if a := p.W.Adapter(); a != nil {
		if err := a.Save(dir); err != nil {
			return err
		}
	} else if err := p.W.SaveHF(dir, dtype); err != nil {
		return err
	}
	return lora.CopyFiles(p.Dir, dir, "tokenizer.json", "tokenizer_config.json", "generation_config.json")
}

// Optimizer applies AdamW updates to a policy's trainable parameters and
// saves and restores everything a resumed run needs.
type Optimizer struct {
	Model    *Policy
	Opt      *optim.AdamW
	Schedule optim.Schedule
	LR       float64 // peak rate
	ClipNorm float64
	Step     int // optimiser steps taken
	RNG      *rand.PCG
	Config   string // the effective config, saved with checkpoints
	params   []optim.Param
}

// NewOptimizer prepares the optimiser for p's trainable parameters.
func NewOptimizer(p *Policy, o optim.Config, lr float64, s optim.Schedule, seed uint64, cfgYAML string) *Optimizer {
	t := &Optimizer{Model: p, Opt: optim.NewAdamW(o.AdamW()),
		Schedule: s, LR: lr, ClipNorm: o.ClipNorm, RNG: rand.NewPCG(seed, 0x747261696e), Config: cfgYAML}
	for _, nv := range p.W.Trainable() {
		t.params = append(t.params, optim.Param{Name: nv.Name, W: nv.V.Val, G: nv.V.Grad, Decay: optim.DecayFor(nv.Name)})
	}
	return t
}

// Params are the trainable parameters with their gradients.
func (t *Optimizer) Params() []optim.Param { return t.params }

// NumParams counts the trainable values.
func (t *Optimizer) NumParams() int {
	n := 0
	for _, p := range t.params {
		n += len(p.W)
	}
	return n
}

// ResumeFrom resumes from dir and says so on log; an empty dir is a fresh
// start.
func (t *Optimizer) ResumeFrom(dir string, log io.Writer) error {
	if dir == "" {
		return nil
	}
	if err := t.Resume(dir); err != nil {
		return err
	}
	fmt.Fprintf(log, "resumed from %s at step %d\n", dir, t.Step)
	return nil
}

// Update clips the accumulated gradients to the global norm, takes one
// AdamW step at the scheduled rate and clears the gradients. It returns
// the gradient norm before clipping and the rate used.
func (t *Optimizer) Update() (gradNorm, lr float64, err error) {
	gradNorm = optim.ClipGlobalNorm(t.params, t.ClipNorm)
	lr = t.Schedule.LR(t.LR, t.Step)
	if err := t.Opt.Step(t.params, lr); err != nil {
		return 0, 0, err
	}
	optim.ZeroGrad(t.params)
	t.Step++
	return gradNorm, lr, nil
}

// Save writes a checkpoint: trainable parameters, AdamW moments, step, RNG
// and config, each file with its SHA-256.
func (t *Optimizer) Save(dir string) error {
	rng, err := t.RNG.MarshalBinary()
	if err != nil {
		return err
	}
	s := checkpoint.State{Step: t.Step, Config: t.Config, RNG: rng, Params: map[string][]float32{}, Shapes: map[string][]int{}, Optim: t.Opt}
	for _, nv := range t.Model.W.Trainable() {
		s.Params[nv.Name], s.Shapes[nv.Name] = nv.V.Val, nv.Shape
	}
	return checkpoint.Save(dir, s)
}

// Resume restores a checkpoint written by Save for the same model and
// trainable set; anything that does not match is named.
func (t *Optimizer) Resume(dir string) error {
	s, err := checkpoint.Load(dir)
	if err != nil {
		return err
	}
	for _, nv := range t.Model.W.Trainable() {
		v, ok := s.Params[nv.Name]
		if !ok {
			return fmt.Errorf("checkpoint %s has no parameter %s (a LoRA checkpoint for full fine-tuning, or another model?)", dir, nv.Name)
		}
		if len(v) != len(nv.V.Val) || (s.Shapes[nv.Name] != nil && !slices.Equal(s.Shapes[nv.Name], nv.Shape)) {
			return fmt.Errorf("checkpoint %s: parameter %s has shape %v, the model %v", dir, nv.Name, s.Shapes[nv.Name], nv.Shape)
		}
	}
	if len(s.Params) != len(t.params) {
		return fmt.Errorf("checkpoint %s holds %d parameters, this run trains %d", dir, len(s.Params), len(t.params))
	}
	rng := *t.RNG
	if err := rng.UnmarshalBinary(s.RNG); err != nil {
		return fmt.Errorf("checkpoint %s: random-generator state: %w", dir, err)
	}
	// Everything checked: only now change the trainer.
	for _, nv := range t.Model.W.Trainable() {
		copy(nv.V.Val, s.Params[nv.Name])
	}
	*t.RNG = rng
	if s.Optim != nil {
		t.Opt = s.Optim
	}
	t.Step = s.Step
	return nil
}
