package qwen

import (
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"testing"

	"github.com/agemem/agemem/model/safetensors"
)

// FuzzConfigOverWeights: a config.json edited in any of its numbers, over
// the weights of the tiny Qwen3, either fails to load with an error or
// gives a model whose logits are finite, one per vocabulary entry. `make
// test` runs the seeds; `make fuzz` explores.
func FuzzConfigOverWeights(f *testing.F) {
	dir := filepath.Join(f.TempDir(), "m")
	cfg := Presets["tiny-qwen3"]
	if err := InitRandom(dir, cfg, safetensors.F32, 1); err != nil {
		f.Fatal(err)
	}
	f.Add(cfg.HiddenSize, cfg.Layers, cfg.Heads, cfg.KVHeads, cfg.HeadDim, cfg.Intermediate, cfg.VocabSize, cfg.RMSNormEps, cfg.RopeTheta, cfg.MaxPositions)
	f.Add(cfg.HiddenSize, cfg.Layers, cfg.Heads, cfg.KVHeads, cfg.HeadDim, cfg.Intermediate, cfg.VocabSize, -1.0, -10000.0, 0)
	f.Add(cfg.HiddenSize, cfg.Layers, cfg.Heads, cfg.KVHeads, 0, cfg.Intermediate, cfg.VocabSize, math.Inf(1), 1.0, -5)
	f.Add(cfg.HiddenSize, cfg.Layers-1, cfg.Heads*2, cfg.KVHeads*2, cfg.HeadDim/2, cfg.Intermediate, cfg.VocabSize, 1e-6, 1e6, 4)
	f.Fuzz(func(t *testing.T, hidden, layers, heads, kvHeads, headDim, inter, vocab int, eps, theta float64, maxPos int) {
		c := cfg
		c.HiddenSize, c.Layers, c.Heads, c.KVHeads, c.HeadDim, c.Intermediate, c.VocabSize = hidden, layers, heads, kvHeads, headDim, inter, vocab
		c.RMSNormEps, c.RopeTheta, c.MaxPositions = eps, theta, maxPos
		raw, err := json.Marshal(c)
		if err != nil { // NaN and infinities are not JSON
			return
		}
		fdir := filepath.Join(t.TempDir(), "m")
		os.MkdirAll(fdir, 0o755)
		os.Symlink(filepath.Join(dir, "model.safetensors"), filepath.Join(fdir, "model.safetensors"))
		os.WriteFile(filepath.Join(fdir, "config.json"), raw, 0o644)
		m, err := Load(fdir)
		if err != nil {
			return
		}
		defer m.Close()
		logits, err := m.Forward([]int{1, 2, 3}, m.NewCache(8))
		if err != nil {
			t.Fatalf("loaded %s, then: %v", raw, err)
		}
		if len(logits) != 3*m.Config.VocabSize {
			t.Fatalf("%d logits for 3 tokens of a vocabulary of %d", len(logits), m.Config.VocabSize)
		}
		for _, v := range logits {
			if math.IsNaN(float64(v)) || math.IsInf(float64(v), 0) {
				t.Fatalf("loaded %s: logit %v", raw, v)
			}
		}
	})
}
