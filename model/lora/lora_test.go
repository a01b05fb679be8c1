package lora_test

import (
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/agemem/agemem/model/lora"
	"github.com/agemem/agemem/model/qwen"
	"github.com/agemem/agemem/model/safetensors"
)

func tinyBase(t *testing.T, dtype safetensors.DType) (string, qwen.Config) {
	dir := filepath.Join(t.TempDir(), "base")
	cfg := qwen.Presets["tiny-qwen3"]
	if err := qwen.InitRandom(dir, cfg, dtype, 3); err != nil {
		t.Fatal(err)
	}
	return dir, cfg
}

func newAdapter(t *testing.T, cfg qwen.Config) *lora.Adapter {
	names, shape := cfg.Linears()
	a, err := lora.New(lora.Config{R: 4, Alpha: 8, Dropout: 0.05, TargetModules: []string{"q_proj", "v_proj", "down_proj"}}, names, shape, 1, true)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

func TestSaveLoadPEFTLayout(t *testing.T) {
	_, cfg := tinyBase(t, safetensors.F32)
	a := newAdapter(t, cfg)
	if len(a.Modules) != 3*cfg.Layers {
		t.Fatalf("%d modules", len(a.Modules))
	}
	dir := filepath.Join(t.TempDir(), "adapter")
	if err := a.Save(dir); err != nil {
		t.Fatal(err)
	}
	f, err := safetensors.Open(filepath.Join(dir, "adapter_model.safetensors"))
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := f.Tensor("base_model.model.model.layers.1.self_attn.q_proj.lora_A.weight"); !ok {
		t.Fatalf("PEFT tensor names expected, got %v", f.Names()[:2])
	}
	f.Close()
	var cj map[string]any
	raw, _ := os.ReadFile(filepath.Join(dir, "adapter_config.json"))
	json.Unmarshal(raw, &cj)
	if cj["peft_type"] != "LORA" || cj["r"] != 4.0 || cj["lora_alpha"] != 8.0 || cj["task_type"] != "CAUSAL_LM" {
		t.Fatalf("adapter_config.json: %v", cj)
	}
	b, err := lora.Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(b.Modules) != len(a.Modules) || b.Config.Scale() != 2 {
		t.Fatalf("loaded %d modules, scale %v", len(b.Modules), b.Config.Scale())
	}
	loaded := map[string]lora.Module{}
	for _, m := range b.Modules {
		loaded[m.Name] = m
	}
	for _, m := range a.Modules {
		l, ok := loaded[m.Name]
		if !ok {
			t.Fatalf("module %s lost", m.Name)
		}
		for j, v := range m.B.Data {
			if l.B.Data[j] != v || l.A.Data[j%len(l.A.Data)] != m.A.Data[j%len(m.A.Data)] {
				t.Fatal("A or B changed in the round trip")
			}
		}
	}
}

// TestMergeFoldsBA checks every merged weight against W + (alpha/r)·B·A
// computed in float64, for f32 and bf16 bases.
func TestMergeFoldsBA(t *testing.T) {
	for _, dt := range []safetensors.DType{safetensors.F32, safetensors.BF16} {
		base, cfg := tinyBase(t, dt)
		a := newAdapter(t, cfg)
		ad := filepath.Join(t.TempDir(), "adapter")
		a.Save(ad)
		out := filepath.Join(t.TempDir(), "merged")
		if err := lora.Merge(base, ad, out); err != nil {
			t.Fatal(err)
		}
		bf, _ := safetensors.OpenDir(base)
		mf, err := safetensors.OpenDir(out)
		if err != nil {
			t.Fatal(err)
		}
		tol := 1e-6
		if dt == safetensors.BF16 {
			tol = 1.0 / 128
		}
		for _, m := range a.Modules {
			bw, _ := bf.Tensor(m.Name + ".weight")
			mw, _ := mf.Tensor(m.Name + ".weight")
			w0, w1 := bw.Float32(), mw.Float32()
			r, in := m.A.Rows, m.A.Cols
			for o := range m.B.Rows {
				for i := range in {
					want := float64(w0[o*in+i])
					for k := range r {
						want += 2 * float64(m.B.Data[o*r+k]) * float64(m.A.Data[k*in+i])
					}
					if math.Abs(float64(w1[o*in+i])-want) > tol*math.Max(1, math.Abs(want)) {
						t.Fatalf("%s %s[%d,%d] = %g, want %g", dt, m.Name, o, i, w1[o*in+i], want)
					}
				}
			}
		}
		untouched, _ := mf.Tensor("model.layers.0.self_attn.k_proj.weight")
		orig, _ := bf.Tensor("model.layers.0.self_attn.k_proj.weight")
		if string(untouched.Data) != string(orig.Data) {
			t.Fatal("a module outside target_modules changed")
		}
		if _, err := os.Stat(filepath.Join(out, "config.json")); err != nil {
			t.Fatal("config.json not copied")
		}
		if _, err := qwen.Load(out); err != nil {
			t.Fatalf("merged directory does not load: %v", err)
		}
		bf.Close()
		mf.Close()
	}
}

func TestBadAdapters(t *testing.T) {
	base, cfg := tinyBase(t, safetensors.F32)
	a := newAdapter(t, cfg)
	dir := filepath.Join(t.TempDir(), "a")
	a.Save(dir)
	// A config whose rank disagrees with the tensors.
	raw, _ := os.ReadFile(filepath.Join(dir, "adapter_config.json"))
	os.WriteFile(filepath.Join(dir, "adapter_config.json"), []byte(strings.Replace(string(raw), `"r": 4`, `"r": 8`, 1)), 0o644)
	if _, err := lora.Load(dir); err == nil || !strings.Contains(err.Error(), "needs lora_A [r=8") {
		t.Fatalf("rank mismatch: %v", err)
	}
	// A rank below 1 (alpha/r would divide by zero) and a weights file
	// without LoRA weights (a merge that changes nothing) are named.
	os.WriteFile(filepath.Join(dir, "adapter_config.json"), []byte(strings.Replace(string(raw), `"r": 4`, `"r": 0`, 1)), 0o644)
	if _, err := lora.Load(dir); err == nil || !strings.Contains(err.Error(), "r 0: a LoRA rank is at least 1") {
		t.Fatalf("rank 0: %v", err)
	}
	os.WriteFile(filepath.Join(dir, "adapter_config.json"), raw, 0o644)
	empty := filepath.Join(t.TempDir(), "e")
	os.MkdirAll(empty, 0o755)
	os.WriteFile(filepath.Join(empty, "adapter_config.json"), raw, 0o644)
	safetensors.Write(filepath.Join(empty, "adapter_model.safetensors"), nil, nil)
	if _, err := lora.Load(empty); err == nil || !strings.Contains(err.Error(), "no LoRA weights") {
		t.Fatalf("no weights: %v", err)
	}
	// An adapter for a bigger model than the base.
	big := cfg
	big.HiddenSize = 128
	names, shape := big.Linears()
	b, _ := lora.New(lora.Config{R: 2, Alpha: 2, TargetModules: []string{"q_proj"}}, names, shape, 1, true)
	bd := filepath.Join(t.TempDir(), "b")
	b.Save(bd)
	if err := lora.Merge(base, bd, t.TempDir()); err == nil || !strings.Contains(err.Error(), "has shape") {
		t.Fatalf("shape mismatch: %v", err)
	}
	if _, err := lora.New(lora.Config{R: 2, TargetModules: []string{"nope"}}, names, shape, 1, false); err == nil {
		t.Fatal("no matching module must be an error")
	}
}
