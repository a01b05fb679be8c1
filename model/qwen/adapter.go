package qwen

import (
	"fmt"

	"github.com/agemem/agemem/kernels"
	"github.com/agemem/agemem/model/lora"
)

// ApplyAdapter adds a LoRA adapter to the model's projections without
// merging it: each targeted layer computes W x + (alpha/r)·B A x. The base
// weights stay untouched, so RemoveAdapter gives back the exact base (GRPO's
// reference policy when training LoRA).
func (m *Model) ApplyAdapter(a *lora.Adapter) error {
	scale := float32(a.Config.Scale())
	for _, mod := range a.Modules {
		l, err := m.Linear(mod.Name)
		if err != nil {
			return fmt.Errorf("adapter: %w", err)
		}
		if mod.A.Cols != l.In || mod.B.Rows != l.Out || mod.A.Rows != mod.B.Cols {
			return fmt.Errorf("adapter module %s is [%d, %d] through rank %d, the model's layer is [%d, %d]", mod.Name, mod.B.Rows, mod.A.Cols, mod.A.Rows, l.Out, l.In)
		}
		b := make([]float32, len(mod.B.Data))
		for i, v := range mod.B.Data {
			b[i] = v * scale
		}
		l.A = m.B.Upload(kernels.Weight{Rows: mod.A.Rows, Cols: mod.A.Cols, F32: mod.A.Data})
		l.LB = m.B.Upload(kernels.Weight{Rows: mod.B.Rows, Cols: mod.B.Cols, F32: b})
		l.Scale = 1
	}
	return nil
}

// RemoveAdapter drops every LoRA path.
func (m *Model) RemoveAdapter() {
	for _, l := range m.Linears() {
		l.A, l.LB = nil, nil
	}
}

// WithAdapter is a model over the same base weights with adapter a
// instead of any adapter m has (vLLM's LoRA request: the base plus the
// named adapter), so one server holds several adapters for the price of
// their small matrices. Only the adapter is the new model's own; m must
// outlive it.
func (m *Model) WithAdapter(a *lora.Adapter) (*Model, error) {
	d := *m.Decoder
	d.Layers = append([]Layer[kernels.Tensor](nil), m.Layers...)
	out := &Model{Decoder: &d, B: m.B, weights: m.weights}
	out.RemoveAdapter()
	if err := out.ApplyAdapter(a); err != nil {
		return nil, err
	}
	return out, nil
}
