// Package decode turns a Qwen engine into text: sampling, batched
// generation, the continuous-batching scheduler that serves many requests
// in shared decoding steps, and Generator, the engine as a memtools policy
// (conversations rendered with the model's chat template, completions with
// the token ids and log-probabilities training needs).
package decode

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"sort"
	"strings"

	"github.com/agemem/agemem/kernels/cpu"
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

	onToken func(seq, id int) // set by GenerateStream
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

// Generate continues each prompt. Prompts that share a leading run of tokens
// (the system prompt of a group's rollouts) are prefilled once and the
// cache is copied. All live sequences advance together, one batched forward
// per step. Sequence i samples from its own generator seeded with
// (Seed, i), so a run is reproducible.
func Generate(ctx context.Context, m *qwen.Model, prompts [][]int, s Sampling, dec Detokenizer) ([]Generation, error) {
	return generate(ctx, m, prompts, s, dec, nil, 0)
}

// Generate is decode.Generate starting each prompt from its longest cached
// prefix, and keeping every finished sequence's cache for later prompts.
func (pc *PrefixCache) Generate(ctx context.Context, m *qwen.Model, prompts [][]int, s Sampling, dec Detokenizer) ([]Generation, error) {
	return generate(ctx, m, prompts, s, dec, pc, 0)
}

// generate decodes prompts together; first is the index of prompts[0] in
// the caller's whole list, which seeds each sequence's sampler, so a list
// decoded in groups samples what it would all at once.
func generate(ctx context.Context, m *qwen.Model, prompts [][]int, s Sampling, dec Detokenizer, pc *PrefixCache, first int) ([]Generation, error) {
	if len(prompts) == 0 {
		return nil, nil
	}
	if s.MaxTokens <= 0 {
		return nil, fmt.Errorf("max tokens must be positive, got %d", s.MaxTokens)
	}
	for i, p := range prompts {
		if len(p) == 0 {
			return nil, fmt.Errorf("prompt %d is empty", i)
		}
	}
	maxLen := 0
	for _, p := range prompts {
		maxLen = max(maxLen, len(p)+s.MaxTokens)
	}
	if m.MaxPositions > 0 && maxLen > m.MaxPositions {
		return nil, fmt.Errorf("prompt plus max tokens (%d) exceeds the model's %d positions", maxLen, m.MaxPositions)
	}
	n := len(prompts)
	caches := make([]*qwen.Cache, n)
	next := make([][]int, n)
	rngs := make([]*rand.Rand, n)
	out := make([]Generation, n)
	// Prompts with a cached prefix start from it; the others share the
	// longest run common to them all, prefilled once, each keeping at least
	// one token of its own to produce first logits from.
	var rest []int
	for i, p := range prompts {
		rngs[i] = rand.New(rand.NewPCG(s.Seed, uint64(first+i)))
		if src, k := pc.Match(p); k > 0 {
			caches[i], next[i] = withPrefix(m, src, k, maxLen), p[k:]
			continue
		}
		rest = append(rest, i)
	}
	if len(rest) > 0 {
		first := prompts[rest[0]]
		prefix := len(first) - 1
		for _, i := range rest[1:] {
			p, k := prompts[i], 0
			for k < prefix && k < len(p)-1 && p[k] == first[k] {
				k++
			}
			prefix = k
		}
		base := m.NewCache(maxLen)
		if prefix > 0 {
			if _, err := m.ForwardLast([][]int{first[:prefix]}, []*qwen.Cache{base}); err != nil {
				return nil, err
			}
		}
		for j, i := range rest {
			if j == len(rest)-1 {
				caches[i] = base
			} else {
				caches[i] = base.Clone()
			}
			next[i] = prompts[i][prefix:]
		}
	}
	live := make([]int, n)
	for i := range live {
		live[i] = i
	}
	logp := make([]float32, m.VocabSize)
	for len(live) > 0 {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		toks := make([][]int, len(live))
		cs := make([]*qwen.Cache, len(live))
		for j, i := range live {
			toks[j], cs[j] = next[i], caches[i]
		}
		logits, err := m.ForwardLast(toks, cs)
		if err != nil {
			return nil, err
		}
		var still []int
		for j, i := range live {
			row := logits[j]
			tok := sample(row, s, rngs[i])
			cpu.LogSoftmax(logp, row)
			g := &out[i]
			g.Tokens = append(g.Tokens, tok)
			g.LogProbs = append(g.LogProbs, logp[tok])
			if s.onToken != nil {
				s.onToken(first+i, tok)
			}
			switch {
			case slices.Contains(s.StopIDs, tok):
				g.FinishReason = "stop"
			case len(s.Stop) > 0 && dec != nil && hasStop(dec.Decode(g.Tokens, false), s.Stop):
				g.FinishReason = "stop"
			case len(g.Tokens) >= s.MaxTokens:
				g.FinishReason = "length"
			default:
				next[i] = []int{tok}
				still = append(still, i)
			}
		}
		live = still
	}
	for i, p := range prompts {
		pc.Put(fed(p, out[i]), caches[i])
	}
	return out, nil
}

// GenerateStream generates one sequence and calls onToken with each token as
// it is sampled (the stop token included), for terminals and streaming
// APIs.
func GenerateStream(ctx context.Context, m *qwen.Model, prompt []int, s Sampling, dec Detokenizer, onToken func(id int)) (Generation, error) {
	s.onToken = func(_, id int) { onToken(id) }
	out, err := Generate(ctx, m, [][]int{prompt}, s, dec)
	if err != nil {
		return Generation{}, err
	}
	return out[0], nil
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
	type cand struct {
		id int
		p  float64
	}
	mx := math.Inf(-1)
	for _, v := range logits {
		mx = math.Max(mx, float64(v))
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
