package qwen

import (
	"math"
	"path/filepath"
	"slices"
	"testing"

	"github.com/agemem/agemem/internal/testkit"
	"github.com/agemem/agemem/model/safetensors"
)

// TestCUDAMatchesCPU loads tiny Qwen2 and Qwen3 checkpoints on the GPU and
// on the CPU: logits must agree and greedy generation must pick the same
// tokens. Skipped without a GPU (make test-gpu runs it).
func TestCUDAMatchesCPU(t *testing.T) {
	g := testkit.GPU(t)
	tokens := []int{1, 17, 300, 42, 42, 7, 511, 0, 99, 256, 3}
	for _, preset := range []string{"tiny-qwen2", "tiny-qwen3"} {
		dir := filepath.Join(t.TempDir(), preset)
		if err := InitRandom(dir, Presets[preset], safetensors.BF16, 7); err != nil {
			t.Fatal(err)
		}
		cm, err := Load(dir)
		if err != nil {
			t.Fatal(err)
		}
		gm, err := LoadOn(g, dir)
		if err != nil {
			t.Fatal(err)
		}
		want, _ := cm.Forward(tokens, cm.NewCache(64))
		got, err := gm.Forward(tokens, gm.NewCache(64))
		if err != nil {
			t.Fatal(err)
		}
		worst := 0.0
		for i := range want {
			worst = math.Max(worst, math.Abs(float64(got[i]-want[i])))
		}
		if worst > 1e-4 {
			t.Fatalf("%s: max |logit diff| %.3g", preset, worst)
		}
		prompts := [][]int{tokens, tokens[:5]}
		cg, gg := greedy(t, cm, prompts, 12), greedy(t, gm, prompts, 12)
		for i := range cg {
			if !slices.Equal(cg[i], gg[i]) {
				t.Fatalf("%s: greedy tokens differ: cpu %v gpu %v", preset, cg[i], gg[i])
			}
		}
		t.Logf("%s: max |logit diff| GPU vs CPU %.2e; greedy generation identical", preset, worst)

		// BF16 mode: activations rounded to bf16 in every product, so
		// logits move by about bf16's precision relative to their scale.
		g.BF16 = true
		bm, err := LoadOn(g, dir)
		g.BF16 = false
		if err != nil {
			t.Fatal(err)
		}
		got, err = bm.Forward(tokens, bm.NewCache(64))
		if err != nil {
			t.Fatal(err)
		}
		worst, scale, agree := 0.0, 0.0, 0
		for i := range want {
			worst = math.Max(worst, math.Abs(float64(got[i]-want[i])))
			scale = math.Max(scale, math.Abs(float64(want[i])))
		}
		for r := range tokens {
			if argmax(got[r*bm.VocabSize:(r+1)*bm.VocabSize]) == argmax(want[r*bm.VocabSize:(r+1)*bm.VocabSize]) {
				agree++
			}
		}
		if worst/scale > 2e-2 || agree < len(tokens)*8/10 {
			t.Fatalf("%s bf16: max |diff| %.3g of scale %.3g, argmax agrees on %d/%d", preset, worst, scale, agree, len(tokens))
		}
		t.Logf("%s bf16 GEMMs: max |logit diff| %.2e (scale %.2e), argmax agrees on %d/%d", preset, worst, scale, agree, len(tokens))
	}
}

// greedy decodes n tokens after each prompt, batched (decode.Generate's
// greedy path, without the sampler).
func greedy(t *testing.T, m *Model, prompts [][]int, n int) [][]int {
	caches := make([]*Cache, len(prompts))
	next := make([][]int, len(prompts))
	for i, p := range prompts {
		caches[i], next[i] = m.NewCache(len(p)+n), p
	}
	out := make([][]int, len(prompts))
	for range n {
		logits, err := m.ForwardLast(next, caches)
		if err != nil {
			t.Fatal(err)
		}
		for i, l := range logits {
			id := argmax(l)
			out[i] = append(out[i], id)
			next[i] = []int{id}
		}
	}
	return out
}

func argmax(v []float32) int {
	best := 0
	for i, x := range v {
		if x > v[best] {
			best = i
		}
	}
	return best
}
