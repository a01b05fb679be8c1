package qwen

import (
	"encoding/json"
	"os"
	"path/filepath"
	"testing"

	"github.com/agemem/agemem/model/safetensors"
)

// TestExportForTransformers writes tiny checkpoints, the tokens fed and our
// logits to $AGEMEM_HF_EXPORT, for testdata/hf_compare.py to check against
// Hugging Face transformers on a machine that has it. Skipped otherwise.
func TestExportForTransformers(t *testing.T) {
	out := os.Getenv("AGEMEM_HF_EXPORT")
	if out == "" {
		t.Skip("set AGEMEM_HF_EXPORT=DIR to write checkpoints for the transformers comparison")
	}
	tokens := []int{1, 17, 300, 42, 42, 7, 511, 0, 99, 256, 3, 128, 64, 5, 400, 401}
	for _, c := range []struct {
		name   string
		preset string
		dtype  safetensors.DType
	}{
		{"qwen2-f32-tied", "tiny-qwen2", safetensors.F32},
		{"qwen2-bf16-tied", "tiny-qwen2", safetensors.BF16},
		{"qwen3-f32-untied", "tiny-qwen3", safetensors.F32},
		{"qwen3-bf16-untied", "tiny-qwen3", safetensors.BF16},
	} {
		dir := filepath.Join(out, c.name)
		if err := InitRandom(dir, Presets[c.preset], c.dtype, 11); err != nil {
			t.Fatal(err)
		}
		m, err := Load(dir)
		if err != nil {
			t.Fatal(err)
		}
		logits, err := m.Forward(tokens, m.NewCache(len(tokens)))
		if err != nil {
			t.Fatal(err)
		}
		raw, _ := json.Marshal(map[string]any{"tokens": tokens, "vocab": m.VocabSize, "logits": logits})
		if err := os.WriteFile(filepath.Join(dir, "agemem_logits.json"), raw, 0o644); err != nil {
			t.Fatal(err)
		}
	}
}
