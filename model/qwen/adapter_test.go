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

// TestWithAdapterSharesTheBase: a model WithAdapter gives the logits of the
// base with that adapter applied, bit for bit, and leaves the base (and an
// adapter it had) as they were.
func TestWithAdapterSharesTheBase(t *testing.T) {
	dir := t.TempDir()
	cfg := qwen.Presets["tiny-qwen2"]
	if err := qwen.InitRandom(dir, cfg, safetensors.F32, 4); err != nil {
		t.Fatal(err)
	}
	names, shape := cfg.Linears()
	mk := func(seed uint64, targets ...string) *lora.Adapter {
		a, err := lora.New(lora.Config{R: 4, Alpha: 8, TargetModules: targets}, names, shape, seed, true)
		if err != nil {
			t.Fatal(err)
		}
		return a
	}
	first, second := mk(3, "q_proj", "down_proj"), mk(5, "v_proj", "up_proj")
	tokens := []int{5, 9, 200, 31}
	logits := func(m *qwen.Model) []float32 {
		out, err := m.Forward(tokens, m.NewCache(8))
		if err != nil {
			t.Fatal(err)
		}
		return out
	}
	base, _ := qwen.Load(dir)
	if err := base.ApplyAdapter(first); err != nil {
		t.Fatal(err)
	}
	before := logits(base)
	shared, err := base.WithAdapter(second)
	if err != nil {
		t.Fatal(err)
	}
	got := logits(shared)
	direct, _ := qwen.Load(dir)
	direct.ApplyAdapter(second)
	want := logits(direct)
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("logit %d: %v with the shared base, %v applied to a fresh one (the first adapter must not remain)", i, got[i], want[i])
		}
	}
	for i, v := range logits(base) {
		if v != before[i] {
			t.Fatal("WithAdapter changed the model it shares")
		}
	}
}
