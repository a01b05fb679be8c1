package qwen_test

import (
	"math"
	"path/filepath"
	"strings"
	"testing"

	"github.com/agemem/agemem/model/lora"
	"github.com/agemem/agemem/model/qwen"
	"github.com/agemem/agemem/model/safetensors"
)

// TestAdapterEqualsMerged: applying an adapter at run time gives the logits
// of the merged checkpoint, and removing it gives back the base.
func TestAdapterEqualsMerged(t *testing.T) {
	dir := t.TempDir()
	base := filepath.Join(dir, "base")
	cfg := qwen.Presets["tiny-qwen2"]
	if err := qwen.InitRandom(base, cfg, safetensors.F32, 4); err != nil {
		t.Fatal(err)
	}
	names, shape := cfg.Linears()
	a, err := lora.New(lora.Config{R: 4, Alpha: 8, TargetModules: []string{"q_proj", "v_proj", "o_proj", "up_proj", "down_proj"}}, names, shape, 3, true)
	if err != nil {
		t.Fatal(err)
	}
	ad, merged := filepath.Join(dir, "adapter"), filepath.Join(dir, "merged")
	a.Save(ad)
	if err := lora.Merge(base, ad, merged); err != nil {
		t.Fatal(err)
	}
	tokens := []int{5, 9, 200, 31, 7, 400}
	logits := func(m *qwen.Model) []float32 {
		out, err := m.Forward(tokens, m.NewCache(16))
		if err != nil {
			t.Fatal(err)
		}
		return out
	}
	mm, _ := qwen.Load(merged)
	want := logits(mm)
	m, _ := qwen.Load(base)
	plain := logits(m)
	loaded, err := lora.Load(ad)
	if err != nil {
		t.Fatal(err)
	}
	if err := m.ApplyAdapter(loaded); err != nil {
		t.Fatal(err)
	}
	got := logits(m)
	diff, moved := 0.0, 0.0
	for i := range want {
		diff = math.Max(diff, math.Abs(float64(got[i]-want[i])))
		moved = math.Max(moved, math.Abs(float64(want[i]-plain[i])))
	}
	if diff > 1e-5 || moved < 1e-2 {
		t.Fatalf("adapter vs merged: max diff %g (the adapter moves logits by %g)", diff, moved)
	}
	m.RemoveAdapter()
	for i, v := range logits(m) {
		if v != plain[i] {
			t.Fatal("RemoveAdapter did not restore the base")
		}
	}
	bad := *loaded
	bad.Modules = append([]lora.Module(nil), loaded.Modules...)
	bad.Modules[0].Name = "model.layers.9.self_attn.q_proj"
	if err := m.ApplyAdapter(&bad); err == nil || !strings.Contains(err.Error(), "not a layer") {
		t.Fatalf("adapter for a missing layer: %v", err)
	}
}
