package lora_test

import (
	"encoding/json"
	"os"
	"path/filepath"
	"testing"

	"github.com/agemem/agemem/model/lora"
	"github.com/agemem/agemem/model/qwen"
	"github.com/agemem/agemem/model/safetensors"
)

// TestExportForPEFT writes, to $AGEMEM_PEFT_EXPORT, a tiny base, a LoRA
// adapter on every projection, and the logits of our merged model, for
// testdata/peft_compare.py to compare with PeftModel.from_pretrained on a
// machine that has PEFT. Skipped otherwise.
func TestExportForPEFT(t *testing.T) {
	out := os.Getenv("AGEMEM_PEFT_EXPORT")
	if out == "" {
		t.Skip("set AGEMEM_PEFT_EXPORT=DIR to write the PEFT comparison")
	}
	for _, preset := range []string{"tiny-qwen2", "tiny-qwen3"} {
		dir := filepath.Join(out, preset)
		base, adapter, merged := filepath.Join(dir, "base"), filepath.Join(dir, "adapter"), filepath.Join(dir, "merged")
		cfg := qwen.Presets[preset]
		if err := qwen.InitRandom(base, cfg, safetensors.F32, 5); err != nil {
			t.Fatal(err)
		}
		names, shape := cfg.Linears()
		a, err := lora.New(lora.Config{R: 8, Alpha: 16, TargetModules: []string{"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"}}, names, shape, 2, true)
		if err != nil {
			t.Fatal(err)
		}
		if err := a.Save(adapter); err != nil {
			t.Fatal(err)
		}
		if err := lora.Merge(base, adapter, merged); err != nil {
			t.Fatal(err)
		}
		m, err := qwen.Load(merged)
		if err != nil {
			t.Fatal(err)
		}
		tokens := []int{3, 14, 159, 265, 358, 97, 9, 323}
		logits, err := m.Forward(tokens, m.NewCache(len(tokens)))
		if err != nil {
			t.Fatal(err)
		}
		raw, _ := json.Marshal(map[string]any{"tokens": tokens, "vocab": m.VocabSize, "logits": logits})
		os.WriteFile(filepath.Join(dir, "agemem_logits.json"), raw, 0o644)
	}
}
