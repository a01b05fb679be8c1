// Package engine turns a Qwen model into text: sampling, and the one
// continuous-batching engine every generation runs on (served requests,
// rollouts, evaluation, agents), with prefix reuse and a paged KV cache.
// Package llm/native puts it behind the toolkit's chat-model interface.
package engine

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"sort"
	"strings"

	"github.com/agemem/agemem/model/qwen"
)

// Sampling controls generation. Temperature 0 is greedy decoding.
type Sampling struct {
	Temperature float64
	TopP        float64 // nucleus mass in (0, 1]; 0 or 1 keeps everything
	TopK        int     // 0 keeps everything
	Seed        uint64
	MaxTokens   int
	StopIDs     []int    // e.g. <|im_end|>, <|endoftext|>
	Stop        []string // stop strings, matched on the decoded text
	// Stream is the second word of the sampler's PCG state (Seed the
	// first): requests that share a seed draw apart by stream.
	Stream uint64
}

// Check refuses settings no sampler can follow (a negative temperature
// would sharpen into greedy, a top_p past 1 or a negative top_k would be
// read as "keep everything"), naming the setting.
func (s Sampling) Check() error {
	switch {
	case s.MaxTokens <= 0:
		return fmt.Errorf("max tokens must be positive, got %d", s.MaxTokens)
	case !(s.Temperature >= 0) || math.IsInf(s.Temperature, 1):
		return fmt.Errorf("temperature %g: want 0 (greedy) or more", s.Temperature)
	case !(s.TopP >= 0 && s.TopP <= 1):
		return fmt.Errorf("top_p %g is outside [0, 1] (0 or 1: no nucleus cut)", s.TopP)
	case s.TopK < 0:
		return fmt.Errorf("top_k %d: want 0 (no cut) or more", s.TopK)
	}
	return nil
}

// Detokenizer turns ids into text; a tokenizer provides it. Generation needs it
// only for stop strings.
type Detokenizer interface {
	Decode(ids []int, skipSpecial bool) string
}

// Generation is one sequence's output. LogProbs[i] is log pi(token i) under
// the model's own distribution (temperature 1, no truncation), what Score
// returns for the same tokens. (GRPO does not read it: its update scores
// the tokens at the rollout temperature in the training forward.)
type Generation struct {
	Tokens       []int
	LogProbs     []float32
	FinishReason string // "stop" (a stop id or string), "length"
}

// KVBlock is the positions of one block of a paged KV cache (vLLM's
// default): small enough that a sequence holds at most one block's worth
// it does not use, large enough that a block is one copy.
const KVBlock = 16

// KVStats describe the paged caches of generations under a KV budget.
type KVStats struct {
	Blocks    int // the pool's size in blocks of KVBlock positions
	Peak      int // the most blocks held at once
	Preempted int // sequences that gave their blocks back and were recomputed
}

// Generate continues each prompt together (a client of a fresh Engine:
// one batch, the shared prefix prefilled once); prompt i samples from the
// generator (s.Seed, i), so a run is reproducible.
func Generate(ctx context.Context, m *qwen.Model, prompts [][]int, s Sampling, dec Detokenizer) ([]Generation, error) {
	e := New(m, dec, Options{PrefixBudget: -1})
	defer e.Close()
	rs := make([]Request, len(prompts))
	for i, p := range prompts {
		rs[i] = Request{Prompt: p, Sampling: s}
		rs[i].Sampling.Stream = uint64(i)
	}
	return e.GenerateBatch(ctx, rs)
}

// GenerateStream generates one sequence and calls onToken with each token as
// it is sampled (the stop token included), for terminals and streaming
// APIs.
func GenerateStream(ctx context.Context, m *qwen.Model, prompt []int, s Sampling, dec Detokenizer, onToken func(id int)) (Generation, error) {
	e := New(m, dec, Options{PrefixBudget: -1})
	defer e.Close()
	return e.Generate(ctx, Request{Prompt: prompt, Sampling: s, OnToken: onToken})
}

func hasStop(text string, stops []string) bool {
	for _, s := range stops {
		if s != "" && strings.Contains(text, s) {
			return true
		}
	}
	return false
}

// sample draws a token from logits with temperature, top-k and top-p.
func sample(logits []float32, s Sampling, r *rand.Rand) int {
	if s.Temperature <= 0 {
		best := 0
		for i, v := range logits {
			if v > logits[best] {
				best = i
			}
		}
		return best
	}
	mx := float64(slices.Max(logits))
	if s.TopK <= 0 || s.TopK >= len(logits) {
		if s.TopP <= 0 || s.TopP >= 1 {
			// The whole distribution: the inverse CDF in id order, no
			// sort (sorting the vocabulary took 40% of a tiny policy's
			// rollouts).
			var z float64
			for _, v := range logits {
				z += math.Exp((float64(v) - mx) / s.Temperature)
			}
			u := r.Float64() * z
			last := 0
			for i, v := range logits {
				p := math.Exp((float64(v) - mx) / s.Temperature)
				if p == 0 {
					continue
				}
				if u -= p; u <= 0 {
					return i
				}
				last = i
			}
			return last
		}
	}
	type cand struct {
		id int
		p  float64
	}
	cs := make([]cand, len(logits))
	for i, v := range logits {
		cs[i] = cand{i, math.Exp((float64(v) - mx) / s.Temperature)}
	}
	sort.Slice(cs, func(a, b int) bool { return cs[a].p > cs[b].p || (cs[a].p == cs[b].p && cs[a].id < cs[b].id) })
	if s.TopK > 0 && s.TopK < len(cs) {
		cs = cs[:s.TopK]
	}
	var z float64
	for _, c := range cs {
		z += c.p
	}
	if s.TopP > 0 && s.TopP < 1 {
		acc := 0.0
		for k, c := range cs {
			acc += c.p / z
			if acc >= s.TopP {
				cs = cs[:k+1]
				break
			}
		}
		z = 0
		for _, c := range cs {
			z += c.p
		}
	}
	u := r.Float64() * z
	for _, c := range cs {
		u -= c.p
		if u <= 0 {
			return c.id
		}
	}
	return cs[len(cs)-1].id
}
