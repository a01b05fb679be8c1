// Package lora holds low-rank adapters in PEFT's on-disk layout
// (adapter_config.json + adapter_model.safetensors, tensors named
// base_model.model.<module>.lora_A.weight / lora_B.weight), and merging an
// adapter into its base: W' = W + (alpha/r)·B·A.
package lora

import (
	"encoding/json"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"

	"github.com/agemem/agemem/internal/jsonerr"
	"github.com/agemem/agemem/internal/valid"
	"github.com/agemem/agemem/model/safetensors"
)

// Config is PEFT's adapter_config.json for a LoRA adapter.
type Config struct {
	PeftType      string   `json:"peft_type"` // "LORA"
	TaskType      string   `json:"task_type"` // "CAUSAL_LM"
	BaseModel     string   `json:"base_model_name_or_path"`
	R             int      `json:"r"`
	Alpha         float64  `json:"lora_alpha"`
	Dropout       float64  `json:"lora_dropout"`
	TargetModules []string `json:"target_modules"`
	Bias          string   `json:"bias"`
	FanInFanOut   bool     `json:"fan_in_fan_out"`
	InferenceMode bool     `json:"inference_mode"`
	UseRSLoRA     bool     `json:"use_rslora"`
	UseDoRA       bool     `json:"use_dora"`
}

// Scale is the factor on B·A: alpha/r (alpha/sqrt(r) with rsLoRA).
func (c Config) Scale() float64 {
	if c.UseRSLoRA {
		return c.Alpha / math.Sqrt(float64(c.R))
	}
	return c.Alpha / float64(c.R)
}

// Matrix is a row-major float32 matrix.
type Matrix struct {
	Rows, Cols int
	Data       []float32
}

// Module is the adapter of one linear layer: A [r, in], B [out, r].
type Module struct {
	Name string // e.g. model.layers.0.self_attn.q_proj
	A, B Matrix
}

// Adapter is a LoRA adapter.
type Adapter struct {
	Config  Config
	Modules []Module
}

// Shape gives a linear layer's (out, in) by module name.
type Shape func(module string) (out, in int, ok bool)

// New creates an adapter for every module of the base whose last name part
// is in cfg.TargetModules. A is random (Kaiming-uniform-like), B is zero as
// in PEFT, so the adapted model starts equal to the base; randomB makes B
// random too (for tests).
func New(cfg Config, modules []string, shape Shape, seed uint64, randomB bool) (*Adapter, error) {
	if cfg.R < 1 {
		return nil, fmt.Errorf("lora r must be at least 1, got %d", cfg.R)
	}
	cfg.PeftType, cfg.TaskType = "LORA", "CAUSAL_LM"
	if cfg.Bias == "" {
		cfg.Bias = "none"
	}
	r := rand.New(rand.NewPCG(seed, 0x6c6f7261))
	a := &Adapter{Config: cfg}
	for _, m := range modules {
		if !slices.Contains(cfg.TargetModules, m[strings.LastIndex(m, ".")+1:]) {
			continue
		}
		out, in, ok := shape(m)
		if !ok {
			return nil, fmt.Errorf("module %s has no shape in the base model", m)
		}
		mod := Module{Name: m, A: Matrix{cfg.R, in, make([]float32, cfg.R*in)}, B: Matrix{out, cfg.R, make([]float32, out*cfg.R)}}
		bound := 1 / math.Sqrt(float64(in))
		for i := range mod.A.Data {
			mod.A.Data[i] = float32((2*r.Float64() - 1) * bound)
		}
		if randomB {
			for i := range mod.B.Data {
				mod.B.Data[i] = float32(r.NormFloat64() * 0.05)
			}
		}
		a.Modules = append(a.Modules, mod)
	}
	if len(a.Modules) == 0 {
		return nil, fmt.Errorf("no module of the base matches target_modules %v", cfg.TargetModules)
	}
	return a, nil
}

// TensorName is PEFT's saved name for a module's A or B ("A" or "B").
func TensorName(module, ab string) string {
	return "base_model.model." + module + ".lora_" + ab + ".weight"
}

// Save writes adapter_config.json and adapter_model.safetensors to dir.
func (a *Adapter) Save(dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	cfg, err := json.MarshalIndent(a.Config, "", "  ")
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "adapter_config.json"), cfg, 0o644); err != nil {
		return err
	}
	var ts []safetensors.Tensor
	for _, m := range a.Modules {
		ts = append(ts,
			safetensors.FromFloat32(TensorName(m.Name, "A"), safetensors.F32, []int{m.A.Rows, m.A.Cols}, m.A.Data),
			safetensors.FromFloat32(TensorName(m.Name, "B"), safetensors.F32, []int{m.B.Rows, m.B.Cols}, m.B.Data))
	}
	return safetensors.Write(filepath.Join(dir, "adapter_model.safetensors"), ts, map[string]string{"format": "pt"})
}

// Load reads an adapter saved by Save or by PEFT.
func Load(dir string) (*Adapter, error) {
	raw, err := os.ReadFile(filepath.Join(dir, "adapter_config.json"))
	if err != nil {
		return nil, err
	}
	a := &Adapter{}
	if err := json.Unmarshal(raw, &a.Config); err != nil {
		return nil, fmt.Errorf("%s/adapter_config.json: %w", dir, jsonerr.Explain(err))
	}
	if a.Config.PeftType != "LORA" {
		return nil, fmt.Errorf("%s/adapter_config.json: peft_type %q is not LORA", dir, a.Config.PeftType)
	}
	if a.Config.UseDoRA || a.Config.FanInFanOut {
		return nil, fmt.Errorf("%s/adapter_config.json: DoRA and fan_in_fan_out adapters are not supported", dir)
	}
	if a.Config.R < 1 {
		return nil, fmt.Errorf("%s/adapter_config.json: r %d: a LoRA rank is at least 1", dir, a.Config.R)
	}
	path := filepath.Join(dir, "adapter_model.safetensors")
	f, err := safetensors.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	byModule := map[string]*Module{}
	for _, name := range f.Names() {
		rest, ok := strings.CutPrefix(name, "base_model.model.")
		var module, ab string
		if ok {
			if m, found := strings.CutSuffix(rest, ".lora_A.weight"); found {
				module, ab = m, "A"
			} else if m, found := strings.CutSuffix(rest, ".lora_B.weight"); found {
				module, ab = m, "B"
			}
		}
		if module == "" {
			return nil, fmt.Errorf("%s: tensor %q is not a LoRA A or B weight", path, name)
		}
		t, _ := f.Tensor(name)
		if len(t.Shape) != 2 {
			return nil, fmt.Errorf("%s: tensor %q has shape %v, want a matrix", path, name, t.Shape)
		}
		m := byModule[module]
		if m == nil {
			m = &Module{Name: module}
			byModule[module] = m
		}
		mat := Matrix{t.Shape[0], t.Shape[1], t.Float32()}
		if ab == "A" {
			m.A = mat
		} else {
			m.B = mat
		}
	}
	names := make([]string, 0, len(byModule))
	for n := range byModule {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		m := byModule[n]
		if m.A.Data == nil || m.B.Data == nil || m.A.Rows != a.Config.R || m.B.Cols != a.Config.R {
			return nil, fmt.Errorf("%s: module %s needs lora_A [r=%d, in] and lora_B [out, r]; got A %dx%d, B %dx%d",
				path, n, a.Config.R, m.A.Rows, m.A.Cols, m.B.Rows, m.B.Cols)
		}
		a.Modules = append(a.Modules, *m)
	}
	if len(a.Modules) == 0 {
		return nil, fmt.Errorf("%s: no LoRA weights (an adapter that changes nothing)", path)
	}
	return a, nil
}

// Delta returns scale·B·A for a module, the [out, in] update to its weight.
func (a *Adapter) Delta(m Module) []float32 {
	s := float32(a.Config.Scale())
	out, in, r := m.B.Rows, m.A.Cols, m.A.Rows
	d := make([]float32, out*in)
	for o := range out {
		for k := range r {
			b := m.B.Data[o*r+k] * s
			if b == 0 {
				continue
			}
			arow := m.A.Data[k*in : (k+1)*in]
			drow := d[o*in : (o+1)*in]
			for i, av := range arow {
				drow[i] += b * av
			}
		}
	}
	return d
}

// Options ask for an adapter to train (config section "lora"; PEFT's
// names).
type Options struct {
	// Enabled trains a new adapter on a frozen base instead of every weight.
	Enabled bool `yaml:"enabled"`
	// R is the adapter's rank and Alpha its scale (the update is
	// Alpha/R · B·A, PEFT's lora_alpha).
	R     int     `yaml:"r"`
	Alpha float64 `yaml:"alpha"`
	// Dropout is applied to the adapter's input while training.
	Dropout float64 `yaml:"dropout"`
	// TargetModules are the linear layers that get an adapter, by PEFT's
	// names (q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj).
	TargetModules []string `yaml:"target_modules"`
}

// Validate checks every key; which target modules exist is the model's
// to say (qwen.LoRATargets).
func (o Options) Validate(targets []string) error {
	var e valid.Errors
	e.AtLeast("r", o.R, 1)
	e.Positive("alpha", o.Alpha)
	e.Fraction("dropout", o.Dropout)
	if len(o.TargetModules) == 0 {
		e.Add("target_modules", "must name at least one module")
	}
	for i, m := range o.TargetModules {
		e.OneOf(fmt.Sprintf("target_modules[%d]", i), m, targets...)
	}
	return e.Err()
}

// Config is the adapter_config.json these options make for a base.
func (o Options) Config(base string) Config {
	return Config{BaseModel: base, R: o.R, Alpha: o.Alpha, Dropout: o.Dropout, TargetModules: o.TargetModules}
}

// DefaultOptions are rank 8, α 16, dropout 0.05 on the given targets
// (disabled until asked for).
func DefaultOptions(targets []string) Options {
	return Options{R: 8, Alpha: 16, Dropout: 0.05, TargetModules: targets}
}
