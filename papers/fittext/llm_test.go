package fittext

import (
	"context"
	"sync"
	"testing"

	"github.com/agemem/agemem/internal/qwentest"
	"github.com/agemem/agemem/llm"
	"github.com/agemem/agemem/llm/native"
	"github.com/agemem/agemem/model/chat"
	"github.com/agemem/agemem/model/engine"
	"github.com/agemem/agemem/model/safetensors"
)

// TestModelLLMBatchesReproducibly: prompts asked concurrently of the native
// engine get the same text as asked one at a time; a prompt asked again
// gets a new sample; a greedy call is the model's greedy continuation.
func TestModelLLMBatchesReproducibly(t *testing.T) {
	tok := qwentest.Tokenizer(t)
	m := qwentest.Model(t, tok, safetensors.F32)
	prompts := []string{"Describe a weather tool.", "Describe a calendar tool.", "Describe a weather tool.", "Sort a list."}
	run := func(parallel bool) []string {
		e := native.New(m, tok, chat.Qwen3, native.Options{Sampling: llm.Sampling{MaxTokens: 12}, Engine: engine.Options{MaxBatch: 8}})
		defer e.Close()
		l := &ModelLLM{Model: e, Seed: 5}
		out := make([]string, len(prompts))
		var wg sync.WaitGroup
		for i, p := range prompts {
			if i == 2 { // the repeat is asked after the first has been
				wg.Wait()
			}
			wg.Add(1)
			f := func() {
				defer wg.Done()
				s, err := l.Generate(context.Background(), p, 1)
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
	e := native.New(m, tok, chat.Qwen3, native.Options{Sampling: llm.Sampling{MaxTokens: 12}})
	defer e.Close()
	l := &ModelLLM{Model: e, Seed: 5}
	a, _ := l.Generate(context.Background(), prompts[1], 0)
	b, _ := l.Generate(context.Background(), prompts[1], 0)
	if a != b {
		t.Fatalf("greedy calls differ: %q %q", a, b)
	}
}
