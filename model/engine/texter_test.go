package engine

import (
	"context"
	"sync"
	"testing"

	"github.com/agemem/agemem/model/safetensors"
)

// TestTexterBatchesReproducibly: prompts asked concurrently get the same
// text as asked one at a time; a prompt asked again gets a new sample; a
// greedy call is the model's greedy continuation. (f32 weights: with bf16
// a batch's rounding can differ from a lone sequence's, and a sample with it.)
func TestTexterBatchesReproducibly(t *testing.T) {
	tok := qwen3Tokenizer(t)
	m := randomQwen3(t, tok, safetensors.F32)
	prompts := []string{"Describe a weather tool.", "Describe a calendar tool.", "Describe a weather tool.", "Sort a list."}
	run := func(parallel bool) []string {
		tx := NewTexter(NewGenerator(m, tok, Sampling{Seed: 5, MaxTokens: 12}), 8)
		defer tx.Close()
		out := make([]string, len(prompts))
		var wg sync.WaitGroup
		for i, p := range prompts {
			if i == 2 { // the repeat is asked after the first has been
				wg.Wait()
			}
			wg.Add(1)
			f := func() {
				defer wg.Done()
				s, err := tx.Generate(context.Background(), p, 1)
				if err != nil {
					t.Error(err)
				}
				out[i] = s
			}
			if parallel {
				go f()
			} else {
				f()
			}
		}
		wg.Wait()
		return out
	}
	seq, par := run(false), run(true)
	for i := range seq {
		if seq[i] != par[i] {
			t.Fatalf("prompt %d: %q alone, %q batched", i, seq[i], par[i])
		}
	}
	if seq[0] == seq[2] {
		t.Fatalf("a prompt asked twice got the same sample %q", seq[0])
	}
	tx := NewTexter(NewGenerator(m, tok, Sampling{Seed: 5, MaxTokens: 12}), 8)
	defer tx.Close()
	a, _ := tx.Generate(context.Background(), prompts[1], 0)
	b, _ := tx.Generate(context.Background(), prompts[1], 0)
	if a != b {
		t.Fatalf("greedy calls differ: %q %q", a, b)
	}
}
