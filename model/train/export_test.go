package train

import (
	"encoding/json"
	"os"
	"path/filepath"
	"testing"

	"github.com/agemem/agemem/kernels/cpu"
	"github.com/agemem/agemem/model/lora"
	"github.com/agemem/agemem/model/optim"
	"github.com/agemem/agemem/model/qwen"
	"github.com/agemem/agemem/model/safetensors"
)

// TestExportTrainedAdapterForPEFT trains LoRA adapters for a few steps,
// exports them as this package does for users, and writes, to
// $AGEMEM_PEFT_EXPORT, the base, the adapter and our engine's logits with
// the adapter applied, in the layout model/lora/testdata/peft_compare.py
// reads (it loads them with PeftModel.from_pretrained). Skipped otherwise.
func TestExportTrainedAdapterForPEFT(t *testing.T) {
	out := os.Getenv("AGEMEM_PEFT_EXPORT")
	if out == "" {
		t.Skip("set AGEMEM_PEFT_EXPORT=DIR to write the PEFT comparison")
	}
	for _, preset := range []string{"tiny-qwen2", "tiny-qwen3"} {
		dir := filepath.Join(out, "trained-"+preset)
		base := filepath.Join(dir, "base")
		if err := qwen.InitRandom(base, qwen.Presets[preset], safetensors.F32, 6); err != nil {
			t.Fatal(err)
		}
		l := lora.DefaultOptions(qwen.LoRATargets)
		l.Enabled = true
		p, err := Open(base, l, 3)
		if err != nil {
			t.Fatal(err)
		}
		tr := NewOptimizer(p, optim.DefaultConfig(), 2e-2, optim.Schedule{}, 1, "")
		for range 5 {
			step(t, tr)
		}
		if err := p.Export(filepath.Join(dir, "adapter"), safetensors.F32); err != nil {
			t.Fatal(err)
		}
		m, err := p.W.Engine(cpu.New())
		if err != nil {
			t.Fatal(err)
		}
		tokens := []int{3, 14, 159, 265, 358, 97, 9, 323}
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
