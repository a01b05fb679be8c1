// Package decode turns a Qwen engine into text: sampling, batched
// generation, the continuous-batching scheduler that serves many requests
// in shared decoding steps, and Generator, the engine as a memtools policy
// (conversations rendered with the model's chat template, completions with
// the token ids and log-probabilities training needs).
package engine

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

// Generate continues each prompt. Prompts that share a leading run of tokens
// (the system prompt of a group's rollouts) are prefilled once and the
// cache is copied. All live sequences advance together, one batched forward
// per step. Sequence i samples from its own generator seeded with
// (Seed, i), so a run is reproducible.
func Generate(ctx context.Context, m *qwen.Model, prompts [][]int, s Sampling, dec Detokenizer) ([]Generation, error) {
	out, _, err := generate(ctx, m, prompts, s, dec, nil, 0)
	return out, err
}

// Generate is decode.Generate starting each prompt from its longest cached
// prefix, and keeping every finished sequence's cache for later prompts.
func (pc *PrefixCache) Generate(ctx context.Context, m *qwen.Model, prompts [][]int, s Sampling, dec Detokenizer) ([]Generation, error) {
	out, _, err := generate(ctx, m, prompts, s, dec, pc, 0)
	return out, err
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

// genSeq is one sequence of a generation: its cache and the tokens it
// feeds next (the prompt's rest, then the last sample).
type genSeq struct {
	i     int
	cache *qwen.Cache
	next  []int
	src   *qwen.Cache // a prefix cache's match, and its length
	srcN  int
	rest  bool // starts from the prompts' common prefix
}

// generate decodes prompts together. With budget > 0 the sequences' keys
// and values live in a pool of about budget positions, in blocks (paged):
// a sequence joins when the blocks it needs are free, in order, and when
// the running ones need a block the pool does not have, the last to join
// gives its blocks back and waits, to be recomputed (prompt and tokens so
// far, in one forward) when blocks free up, as vLLM preempts. The pool
// always holds one whole sequence, so a conversation larger than the
// budget runs alone. Each sequence samples what it would in one unbounded
// batch.
func generate(ctx context.Context, m *qwen.Model, prompts [][]int, s Sampling, dec Detokenizer, pc *PrefixCache, budget int) ([]Generation, KVStats, error) {
	var st KVStats
	if len(prompts) == 0 {
		return nil, st, nil
	}
	if err := s.Check(); err != nil {
		return nil, st, err
	}
	for i, p := range prompts {
		if len(p) == 0 {
			return nil, st, fmt.Errorf("prompt %d is empty", i)
		}
	}
	maxLen := 0
	for _, p := range prompts {
		maxLen = max(maxLen, len(p)+s.MaxTokens)
	}
	if m.MaxPositions > 0 && maxLen > m.MaxPositions {
		return nil, st, fmt.Errorf("prompt plus max tokens (%d) exceeds the model's %d positions", maxLen, m.MaxPositions)
	}
	var pool *qwen.Pool
	if budget > 0 {
		per := (maxLen + KVBlock - 1) / KVBlock
		var err error
		if pool, err = m.NewPool(max((budget+KVBlock-1)/KVBlock, per+1), KVBlock); err != nil {
			return nil, st, err
		}
		st.Blocks = pool.Blocks()
	}
	newCache := func() *qwen.Cache {
		if pool != nil {
			return m.NewPagedCache(pool, maxLen)
		}
		return m.NewCache(maxLen)
	}
	n := len(prompts)
	rngs := make([]*rand.Rand, n)
	out := make([]Generation, n)
	seqs := make([]*genSeq, n)
	// Prompts with a cached prefix start from it; the others share the
	// longest run common to them all, prefilled once, each keeping at least
	// one token of its own to produce first logits from.
	var rest []int
	for i, p := range prompts {
		rngs[i] = rand.New(rand.NewPCG(s.Seed, uint64(i)))
		seqs[i] = &genSeq{i: i}
		if src, k := pc.Match(p); k > 0 {
			seqs[i].src, seqs[i].srcN = src, k
			continue
		}
		seqs[i].rest = true
		rest = append(rest, i)
	}
	var base *qwen.Cache
	prefix := 0
	if len(rest) > 0 {
		first := prompts[rest[0]]
		prefix = len(first) - 1
		for _, i := range rest[1:] {
			p, k := prompts[i], 0
			for k < prefix && k < len(p)-1 && p[k] == first[k] {
				k++
			}
			prefix = k
		}
		if prefix > 0 {
			base = newCache()
			if _, err := m.ForwardLast([][]int{prompts[rest[0]][:prefix]}, []*qwen.Cache{base}); err != nil {
				return nil, st, err
			}
		}
	}
	// start gives a waiting sequence a cache and what to feed: everything
	// it has (the prompt and its tokens so far, after a preemption) past
	// the prefix it starts from.
	start := func(q *genSeq) {
		all := append(slices.Clip(prompts[q.i]), out[q.i].Tokens...)
		switch {
		case q.src != nil:
			q.cache, q.next = newCache(), all[q.srcN:]
		case q.rest && base != nil && pool == nil && q.i == rest[len(rest)-1]:
			q.cache, q.next, base = base, all[prefix:], nil // the last to start takes the prefix's own cache
		case q.rest && base != nil:
			q.cache, q.next = base.Clone(), all[prefix:]
		default:
			q.cache, q.next = newCache(), all
		}
	}
	// need is the blocks q's next forward takes (its prefix copy included).
	need := func(q *genSeq) int {
		if q.src != nil && q.cache.Len == 0 {
			return (q.srcN + len(q.next) + KVBlock - 1) / KVBlock
		}
		return q.cache.BlocksNeeded(len(q.next))
	}
	waiting := slices.Clone(seqs)
	var live []*genSeq
	done := make([]*qwen.Cache, n)
	defer func() {
		for _, q := range append(live, waiting...) {
			if q.cache != nil {
				q.cache.Release()
			}
		}
		if base != nil {
			base.Release()
		}
	}()
	logp := make([]float32, m.VocabSize)
	for len(live) > 0 || len(waiting) > 0 {
		if err := ctx.Err(); err != nil {
			return nil, st, err
		}
		// The running sequences' next blocks first: when the pool cannot
		// give them, the last to join waits for a later turn.
		used := 0
		for pool != nil {
			used = 0
			for _, q := range live {
				used += need(q)
			}
			if used <= pool.Free() {
				break
			}
			if len(live) == 1 {
				if base != nil { // alone it must fit: the shared prefix goes
					base.Release()
					base = nil
				}
				break
			}
			q := live[len(live)-1]
			live = live[:len(live)-1]
			q.cache.Release()
			q.cache = nil
			waiting = append([]*genSeq{q}, waiting...)
			st.Preempted++
		}
		for len(waiting) > 0 {
			q := waiting[0]
			if q.cache == nil {
				start(q)
			}
			if pool != nil && len(live) == 0 && need(q) > pool.Free() && base != nil {
				// Alone it must fit: the shared prefix gives its blocks
				// back (the sequences still to start prefill it themselves).
				base.Release()
				base = nil
			}
			if pool != nil && len(live) > 0 && used+need(q) > pool.Free() {
				q.cache.Release() // a waiting sequence holds no block, not even a shared one
				q.cache = nil
				break
			}
			if q.src != nil && q.cache.Len == 0 {
				if err := q.cache.Fill(q.src, q.srcN); err != nil {
					return nil, st, err
				}
			}
			used += need(q)
			live = append(live, q)
			waiting = waiting[1:]
		}
		if base != nil && !slices.ContainsFunc(waiting, func(q *genSeq) bool { return q.rest }) {
			base.Release() // every sequence that starts from it holds its blocks now
			base = nil
		}
		toks := make([][]int, len(live))
		cs := make([]*qwen.Cache, len(live))
		for j, q := range live {
			toks[j], cs[j] = q.next, q.cache
		}
		logits, err := m.ForwardLast(toks, cs)
		if err != nil {
			return nil, st, err
		}
		var still []*genSeq
		for j, q := range live {
			i, row := q.i, logits[j]
			tok := sample(row, s, rngs[i])
			cpu.LogSoftmax(logp, row)
			g := &out[i]
			g.Tokens = append(g.Tokens, tok)
			g.LogProbs = append(g.LogProbs, logp[tok])
			if s.onToken != nil {
				s.onToken(i, tok)
			}
			switch {
			case slices.Contains(s.StopIDs, tok):
				g.FinishReason = "stop"
			case len(s.Stop) > 0 && dec != nil && hasStop(dec.Decode(g.Tokens, false), s.Stop):
				g.FinishReason = "stop"
			case len(g.Tokens) >= s.MaxTokens:
				g.FinishReason = "length"
			default:
				q.next = []int{tok}
				still = append(still, q)
				continue
			}
			// A finished sequence gives its blocks back at once; the prefix
			// cache keeps a compact contiguous copy (a grown cache holds
			// up to twice what it filled, and the budget counts what is
			// held).
			done[i] = q.cache
			if pc != nil {
				c := m.NewCache(q.cache.Len)
				if err := c.Fill(q.cache, q.cache.Len); err != nil {
					return nil, st, err
				}
				done[i] = c
				q.cache.Release()
			} else if pool != nil {
				q.cache.Release()
			}
			q.cache = nil
		}
		live = still
		if pool != nil {
			st.Peak = pool.Peak()
		}
	}
	if pc != nil {
		for i, p := range prompts {
			pc.Put(fed(p, out[i]), done[i])
		}
	}
	return out, st, nil
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
