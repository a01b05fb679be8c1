package qwen

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/agemem/agemem/kernels"
	"github.com/agemem/agemem/model/lora"
)

// ApplyAdapter adds a LoRA adapter to the model's linear layers without
// merging it: each targeted layer computes W x + (alpha/r)·B A x. The base
// weights stay untouched, so RemoveAdapter gives back the exact base (GRPO's
// reference policy when training LoRA).
func (m *Model) ApplyAdapter(a *lora.Adapter) error {
	scale := float32(a.Config.Scale())
	for _, mod := range a.Modules {
		l, err := m.linear(mod.Name)
		if err != nil {
			return err
		}
		out, in := l.W.Shape()[0], l.W.Shape()[1]
		if mod.A.Cols != in || mod.B.Rows != out {
			return fmt.Errorf("adapter module %s is [%d, %d], the model's layer is [%d, %d]", mod.Name, mod.B.Rows, mod.A.Cols, out, in)
		}
		b := make([]float32, len(mod.B.Data))
		for i, v := range mod.B.Data {
			b[i] = v * scale
		}
		l.LoraA = m.B.Upload(kernels.Weight{Rows: mod.A.Rows, Cols: mod.A.Cols, F32: mod.A.Data})
		l.LoraB = m.B.Upload(kernels.Weight{Rows: mod.B.Rows, Cols: mod.B.Cols, F32: b})
	}
	return nil
}

// RemoveAdapter drops every LoRA path.
func (m *Model) RemoveAdapter() {
	for i := range m.Layers {
		l := &m.Layers[i]
		for _, lin := range []*Linear{&l.Attn.Q, &l.Attn.K, &l.Attn.V, &l.Attn.O, &l.MLP.Gate, &l.MLP.Up, &l.MLP.Down} {
			lin.LoraA, lin.LoraB = nil, nil
		}
	}
}

// linear finds a layer by its PEFT module name, e.g. model.layers.3.mlp.up_proj.
func (m *Model) linear(name string) (*Linear, error) {
	rest, ok := strings.CutPrefix(name, "model.layers.")
	idx, part, ok2 := strings.Cut(rest, ".")
	i, err := strconv.Atoi(idx)
	if !ok || !ok2 || err != nil || i < 0 || i >= len(m.Layers) {
		return nil, fmt.Errorf("adapter module %s is not a layer of this %d-layer model", name, len(m.Layers))
	}
	l := &m.Layers[i]
	switch part {
	case "self_attn.q_proj":
		return &l.Attn.Q, nil
	case "self_attn.k_proj":
		return &l.Attn.K, nil
	case "self_attn.v_proj":
		return &l.Attn.V, nil
	case "self_attn.o_proj":
		return &l.Attn.O, nil
	case "mlp.gate_proj":
		return &l.MLP.Gate, nil
	case "mlp.up_proj":
		return &l.MLP.Up, nil
	case "mlp.down_proj":
		return &l.MLP.Down, nil
	}
	return nil, fmt.Errorf("adapter module %s: %q is not a linear layer of Qwen", name, part)
}
