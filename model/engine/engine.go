package engine

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/agemem/agemem/kernels/cpu"
	"github.com/agemem/agemem/model/qwen"
)

// ErrClosed is returned by an Engine's Generate after Close.
var ErrClosed = errors.New("engine: closed")

// Options shape continuous batching.
type Options struct {
	// MaxBatch is how many sequences decode in the same step (0: no
	// limit; 1 runs them one after another).
	MaxBatch int
	// PrefillChunk bounds the prompt tokens one sequence feeds in a step,
	// so that a long new prompt delays the sequences already decoding by
	// at most one chunk (0: a prompt is fed whole).
	PrefillChunk int
	// OnStep, if set, is called after every decoding step with the number
	// of sequences in it and the tokens it fed (for metrics).
	OnStep func(seqs, tokens int)
	// PrefixBudget bounds the positions kept for prefix reuse (finished
	// sequences' caches; 0: 1<<16, negative: no reuse beyond SetPrefix).
	PrefixBudget int
	// KVBudget, when positive, keeps the live sequences' keys and values
	// in one pool of that many positions, in blocks of KVBlock (paged, as
	// vLLM): a request joins when the blocks for its next chunk are free,
	// and when the running ones need a block the pool does not have, the
	// last to join gives its blocks back and waits at the head of the
	// queue, to be recomputed (prompt and tokens so far) when blocks free
	// up. Memory is then the budget however many requests arrive; a
	// request whose prompt plus max tokens exceed it is refused. 0: each
	// sequence's cache grows as it needs.
	KVBudget int
}

// Request is one sequence to continue.
type Request struct {
	Prompt   []int
	Sampling Sampling
	// OnToken, if set, is called with each token as it is sampled (the
	// stop token included), from the engine's goroutine: it must not block.
	OnToken func(id int)
	// Namespace scopes prefix reuse: a request starts from the cached
	// prefix of an earlier request only of the same namespace, or of a
	// prefix SetPrefix shares with all.
	Namespace string
}

// Engine runs generation requests that arrive at any time in shared
// decoding steps (continuous batching, as in Orca and vLLM): every step is
// one batched forward over all live sequences, new requests join at the
// next step boundary, finished ones leave at once. Every generation in the
// toolkit goes through one: served requests, GRPO rollouts, evaluation
// episodes, agents, and the one-off Generate. A sequence samples from its
// own generator (Sampling.Seed, Sampling.Stream) and the CPU forward is the
// same whatever a row is batched with, so a request gives the same tokens
// however it was batched.
type Engine struct {
	m      *qwen.Model
	dec    Detokenizer
	opt    Options
	in     chan []*seq
	closed chan struct{}
	once   sync.Once
	done   sync.WaitGroup

	// prefixes keeps the system prompt's cache (SetPrefix) and each
	// finished sequence's, so a conversation's next request prefills only
	// what is new (serve's sessions, an episode's calls).
	prefixes *PrefixCache

	// pool holds the live sequences' keys and values with KVBudget (nil
	// without); only the loop's goroutine touches it. preempted counts the
	// sequences that gave their blocks back.
	pool            *qwen.Pool
	peak, preempted atomic.Int64
}

type seq struct {
	ctx context.Context
	Request

	cache *qwen.Cache
	next  []int // tokens still to feed: the prompt's rest, then the last sample
	// src is the cached prefix the sequence starts from (srcN positions),
	// looked up once when it first asks to join; base, its batch's shared
	// prefix when it had none.
	src     *qwen.Cache
	srcN    int
	matched bool
	base    *shared
	rng     *rand.Rand
	gen     Generation
	err     error
	ready   chan struct{}
}

// shared is a batch's common prefix, prefilled once: its sequences start
// from copies of it (in a pool, clones that share its blocks) until the
// last of them has joined, when it is let go.
type shared struct {
	cache   *qwen.Cache // nil once let go
	n       int         // the positions it holds
	pending int         // sequences still to join from it
}

func (b *shared) release() {
	if b.cache != nil {
		b.cache.Release()
		b.cache = nil
	}
}

// New starts an engine over m; dec decodes for stop strings (nil: none).
func New(m *qwen.Model, dec Detokenizer, o Options) *Engine {
	e := &Engine{m: m, dec: dec, opt: o, in: make(chan []*seq), closed: make(chan struct{}), prefixes: NewPrefixCache(max(o.PrefixBudget, 0))}
	if o.KVBudget > 0 {
		var err error
		if e.pool, err = m.NewPool((o.KVBudget+KVBlock-1)/KVBlock, KVBlock); err != nil {
			panic(err) // unreachable: at least one block of KVBlock positions
		}
	}
	e.done.Add(1)
	go e.loop()
	return e
}

// Model is the model the engine runs.
func (e *Engine) Model() *qwen.Model { return e.m }

// SetPrefix computes and keeps the cache of ids (say, the rendered system
// prompt every conversation starts with), shared by every namespace; a
// prompt that starts with them copies that cache instead of computing it
// again. The outputs are the same as without it.
func (e *Engine) SetPrefix(ids []int) error {
	if len(ids) == 0 {
		return nil
	}
	c := e.m.NewCache(len(ids))
	if _, err := e.m.ForwardLast([][]int{ids}, []*qwen.Cache{c}); err != nil {
		return err
	}
	e.prefixes.Pin(ids, c)
	return nil
}

// Prefixes is the engine's prefix cache (its hit counts).
func (e *Engine) Prefixes() *PrefixCache { return e.prefixes }

// KV reports the paged pool's blocks, the most held at once and the
// sequences preempted so far (zeros without KVBudget).
func (e *Engine) KV() KVStats {
	if e.pool == nil {
		return KVStats{}
	}
	return KVStats{Blocks: e.pool.Blocks(), Peak: int(e.peak.Load()), Preempted: int(e.preempted.Load())}
}

// check refuses a request before it reaches the loop.
func (e *Engine) check(r Request) error {
	if len(r.Prompt) == 0 {
		return fmt.Errorf("prompt is empty")
	}
	if err := r.Sampling.Check(); err != nil {
		return err
	}
	n := len(r.Prompt) + r.Sampling.MaxTokens
	if e.m.MaxPositions > 0 && n > e.m.MaxPositions {
		return fmt.Errorf("prompt plus max tokens (%d) exceeds the model's %d positions", n, e.m.MaxPositions)
	}
	if e.pool != nil && (n+KVBlock-1)/KVBlock > e.pool.Blocks() {
		return fmt.Errorf("prompt plus max tokens (%d) exceeds the KV cache budget of %d positions", n, e.pool.Blocks()*KVBlock)
	}
	return nil
}

// Generate continues r.Prompt and returns when the sequence is finished.
// A cancelled ctx takes the sequence out at the next step.
func (e *Engine) Generate(ctx context.Context, r Request) (Generation, error) {
	out, err := e.GenerateBatch(ctx, []Request{r})
	if err != nil {
		return Generation{}, err
	}
	return out[0], nil
}

// GenerateBatch continues every request, all joining the same step (a
// GRPO group's rollouts): the prompts' longest common prefix, where none
// of them has a longer one cached, is prefilled once and copied. It
// returns when all are finished, in order; the first failure is the error.
func (e *Engine) GenerateBatch(ctx context.Context, rs []Request) ([]Generation, error) {
	qs := make([]*seq, len(rs))
	for i, r := range rs {
		if err := e.check(r); err != nil {
			if len(rs) > 1 {
				err = fmt.Errorf("request %d: %w", i, err)
			}
			return nil, err
		}
		qs[i] = &seq{ctx: ctx, Request: r, ready: make(chan struct{})}
	}
	if len(qs) == 0 {
		return nil, nil
	}
	select {
	case e.in <- qs:
	case <-ctx.Done():
		return nil, ctx.Err()
	case <-e.closed:
		return nil, ErrClosed
	}
	out := make([]Generation, len(qs))
	var first error
	for i, q := range qs {
		<-q.ready
		out[i] = q.gen
		if q.err != nil && first == nil {
			first = q.err
		}
	}
	return out, first
}

// Close stops the engine after failing the sequences still in it.
func (e *Engine) Close() {
	e.once.Do(func() { close(e.closed) })
	e.done.Wait()
}

func (e *Engine) loop() {
	defer e.done.Done()
	var live, waiting []*seq
	finish := func(q *seq, err error) {
		q.err = err
		q.leaveBase()
		if err == nil && e.opt.PrefixBudget >= 0 && q.cache != nil {
			// A compact copy, outside any pool: the prefix budget counts
			// positions held, and a grown cache holds up to twice what it
			// filled (halving what the budget keeps); a paged sequence's
			// blocks go back to the live ones.
			if c := e.m.NewCache(q.cache.Len); c.Fill(q.cache, q.cache.Len) == nil {
				e.prefixes.Put(fed(q.Prompt, q.gen), c, q.Namespace)
			}
		}
		if q.cache != nil {
			q.cache.Release()
		}
		q.cache = nil
		close(q.ready)
	}
	defer func() {
		for _, q := range append(live, waiting...) {
			finish(q, ErrClosed)
		}
	}()
	arrive := func(qs []*seq) {
		if err := e.shareBatchPrefix(qs); err != nil {
			for _, q := range qs {
				finish(q, err)
			}
			return
		}
		waiting = append(waiting, qs...)
	}
	logp := make([]float32, e.m.VocabSize)
	for {
		if len(live) == 0 && len(waiting) == 0 {
			select {
			case qs := <-e.in:
				arrive(qs)
			case <-e.closed:
				return
			}
		}
	drain:
		for {
			select {
			case qs := <-e.in:
				arrive(qs)
			case <-e.closed:
				return
			default:
				break drain
			}
		}
		// Sequences whose caller went away leave before the step, the
		// waiting ones too (their callers must not wait for a turn).
		live, waiting = dropGone(live, finish), dropGone(waiting, finish)
		// With a pool, the running sequences' next chunks come first: when
		// the pool cannot hold them, the last to join gives its blocks back.
		used := 0
		for e.pool != nil {
			used = 0
			for _, q := range live {
				used += q.cache.BlocksNeeded(e.chunk(len(q.next)))
			}
			if used <= e.pool.Free() {
				break
			}
			if len(live) <= 1 {
				// Alone it must fit: the shared prefixes still waiting to
				// be copied give their blocks back (their sequences
				// prefill themselves).
				releaseBases(waiting)
				break
			}
			q := live[len(live)-1]
			live = live[:len(live)-1]
			q.cache.Release()
			q.cache, q.next = nil, nil
			waiting = append([]*seq{q}, waiting...)
			e.preempted.Add(1)
		}
		for (e.opt.MaxBatch <= 0 || len(live) < e.opt.MaxBatch) && len(waiting) > 0 {
			q := waiting[0]
			if e.pool != nil {
				// First come, first served: the head waits for room.
				need := e.joinBlocks(q)
				if len(live) == 0 && need > e.pool.Free() {
					releaseBases(waiting)
					need = e.joinBlocks(q)
				}
				if len(live) > 0 && used+need > e.pool.Free() {
					break
				}
				used += need
			}
			waiting = waiting[1:]
			e.admit(q)
			live = append(live, q)
		}
		if len(live) == 0 {
			continue
		}
		toks := make([][]int, len(live))
		caches := make([]*qwen.Cache, len(live))
		fedN := 0
		for j, q := range live {
			n := e.chunk(len(q.next))
			toks[j], caches[j] = q.next[:n], q.cache
			fedN += n
		}
		logits, err := e.m.ForwardLast(toks, caches)
		if err != nil {
			for _, q := range live {
				finish(q, err)
			}
			live = nil
			continue
		}
		if e.pool != nil {
			e.peak.Store(int64(e.pool.Peak()))
		}
		if e.opt.OnStep != nil {
			e.opt.OnStep(len(live), fedN)
		}
		kept := live[:0]
		for j, q := range live {
			q.next = q.next[len(toks[j]):]
			if len(q.next) > 0 { // still prefilling: these logits predict prompt tokens
				kept = append(kept, q)
				continue
			}
			if q.step(logits[j], logp, e.dec) {
				kept = append(kept, q)
				continue
			}
			finish(q, nil)
		}
		live = kept
	}
}

// step samples q's next token from its logits, records it with its
// log-probability, and reports whether the sequence goes on.
func (q *seq) step(row, logp []float32, dec Detokenizer) bool {
	s := q.Sampling
	tok := sample(row, s, q.rng)
	cpu.LogSoftmax(logp, row)
	g := &q.gen
	g.Tokens = append(g.Tokens, tok)
	g.LogProbs = append(g.LogProbs, logp[tok])
	if q.OnToken != nil {
		q.OnToken(tok)
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
		return true
	}
	return false
}

// chunk is how many of n pending tokens a sequence feeds in one step.
func (e *Engine) chunk(n int) int {
	if e.opt.PrefillChunk > 0 {
		return min(n, e.opt.PrefillChunk)
	}
	return n
}

// dropGone finishes the sequences whose caller went away and returns the
// others, in order.
func dropGone(qs []*seq, finish func(*seq, error)) []*seq {
	kept := qs[:0]
	for _, q := range qs {
		if err := q.ctx.Err(); err != nil {
			finish(q, err)
			continue
		}
		kept = append(kept, q)
	}
	return kept
}

// all is what a (re)joining sequence has: its prompt, then the tokens it
// sampled before it was preempted.
func (q *seq) all() []int { return append(slices.Clip(q.Prompt), q.gen.Tokens...) }

// match looks the sequence's cached prefix up once.
func (e *Engine) match(q *seq) {
	if !q.matched {
		q.src, q.srcN = e.prefixes.Match(q.Prompt, q.Namespace)
		q.matched = true
	}
}

// shareBatchPrefix prefills once the longest prefix the batch's prompts
// share, for those that have no cached prefix of their own, each keeping
// at least one token of its own to produce first logits from. In a pool it
// takes blocks there (when they are free), which the sequences' clones
// share.
func (e *Engine) shareBatchPrefix(qs []*seq) error {
	var rest []*seq
	for _, q := range qs {
		if e.match(q); q.srcN == 0 {
			rest = append(rest, q)
		}
	}
	if len(rest) < 2 {
		return nil
	}
	first := rest[0].Prompt
	prefix, maxT := len(first)-1, 0
	for _, q := range rest {
		k := 0
		for k < prefix && k < len(q.Prompt)-1 && q.Prompt[k] == first[k] {
			k++
		}
		prefix, maxT = k, max(maxT, len(q.Prompt)+q.Sampling.MaxTokens)
	}
	if prefix == 0 {
		return nil
	}
	var c *qwen.Cache
	switch {
	case e.pool == nil:
		c = e.m.NewCache(prefix)
	case (prefix+KVBlock-1)/KVBlock > e.pool.Free():
		return nil // no room now: each prefills its own
	default:
		c = e.m.NewPagedCache(e.pool, maxT)
	}
	if _, err := e.m.ForwardLast([][]int{first[:prefix]}, []*qwen.Cache{c}); err != nil {
		c.Release()
		return err
	}
	b := &shared{cache: c, n: prefix, pending: len(rest)}
	for _, q := range rest {
		q.base = b
	}
	return nil
}

// leaveBase counts q out of its batch's shared prefix: the last to join
// lets it go.
func (q *seq) leaveBase() {
	if b := q.base; b != nil {
		q.base = nil
		if b.pending--; b.pending == 0 {
			b.release()
		}
	}
}

// releaseBases lets go of the shared prefixes waiting sequences would
// start from (their blocks are needed now); those sequences prefill their
// whole prompts.
func releaseBases(waiting []*seq) {
	for _, q := range waiting {
		if q.base != nil {
			q.base.release()
		}
	}
}

// joinBlocks is the pool blocks q takes to join: its first chunk past the
// prefix it starts from, its prefix's copy too unless it is a shared
// prefix's clone (which copies only a shared block it writes into).
func (e *Engine) joinBlocks(q *seq) int {
	e.match(q)
	n := len(q.all())
	if b := q.base; b != nil && b.cache != nil {
		return (b.n+e.chunk(n-b.n)+KVBlock-1)/KVBlock - b.n/KVBlock
	}
	return (q.srcN + e.chunk(n-q.srcN) + KVBlock - 1) / KVBlock
}

// admit gives a sequence its cache, starting from the longest cached
// prefix of its prompt (the system prompt's, an earlier turn's of the same
// conversation, its batch's shared one) when there is one; a preempted
// sequence recomputes its prompt and the tokens it had, and goes on
// sampling where it was.
func (e *Engine) admit(q *seq) {
	maxT := len(q.Prompt) + q.Sampling.MaxTokens
	if q.rng == nil {
		q.rng = rand.New(rand.NewPCG(q.Sampling.Seed, q.Sampling.Stream))
	}
	all := q.all()
	q.next = all
	e.match(q)
	switch b := q.base; {
	case b != nil && b.cache != nil && e.pool != nil:
		q.cache, q.next = b.cache.Clone(), all[b.n:]
	case e.pool != nil:
		q.cache = e.m.NewPagedCache(e.pool, maxT)
	default:
		q.cache = e.m.NewCache(maxT)
	}
	switch b := q.base; {
	case q.cache.Len > 0:
	case b != nil && b.cache != nil:
		if q.cache.Fill(b.cache, b.n) == nil {
			q.next = all[b.n:]
		}
	case q.srcN > 0:
		if q.cache.Fill(q.src, q.srcN) == nil {
			q.next = all[q.srcN:]
		}
	}
	q.leaveBase()
}
