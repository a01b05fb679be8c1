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

// ErrSchedulerClosed is returned by Scheduler.Generate after Close.
var ErrSchedulerClosed = errors.New("qwen: scheduler closed")

// SchedulerOptions shape continuous batching.
type SchedulerOptions struct {
	// MaxBatch is how many sequences decode in the same step; 1 turns
	// batching off (sequences run one after another).
	MaxBatch int
	// PrefillChunk bounds the prompt tokens one sequence feeds in a step, so
	// a long new prompt delays the sequences already decoding by at most one
	// chunk (0: 512).
	PrefillChunk int
	// OnStep, if set, is called after every decoding step with the number of
	// sequences in it and the tokens it fed (for metrics).
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

// Scheduler runs generation requests that arrive at any time in shared
// decoding steps (continuous batching, as in Orca and vLLM): every step is
// one batched forward over all live sequences, new requests join at the
// next step boundary, finished ones leave at once. Concurrent callers of
// Generate therefore share weight reads instead of queueing behind each
// other.
type Scheduler struct {
	m      *qwen.Model
	dec    Detokenizer
	opt    SchedulerOptions
	in     chan *schedSeq
	closed chan struct{}
	once   sync.Once
	done   sync.WaitGroup

	// prefixes keeps the system prompt's cache (SetPrefix) and each
	// finished sequence's, so a conversation's next request prefills only
	// what is new (serve's sessions).
	prefixes *PrefixCache

	// pool holds the live sequences' keys and values with KVBudget (nil
	// without); only the loop's goroutine touches it. preempted counts the
	// sequences that gave their blocks back.
	pool            *qwen.Pool
	peak, preempted atomic.Int64
}

type schedSeq struct {
	ctx     context.Context
	prompt  []int
	s       Sampling
	onToken func(id int)

	cache *qwen.Cache
	next  []int // tokens still to feed: the prompt's rest, then the last sample
	// src is the cached prefix the sequence starts from (srcN positions),
	// looked up once when it first asks to join.
	src     *qwen.Cache
	srcN    int
	matched bool
	rng     *rand.Rand
	gen     Generation
	err     error
	ready   chan struct{}
}

// NewScheduler starts a scheduler over m; dec decodes for stop strings.
func NewScheduler(m *qwen.Model, dec Detokenizer, o SchedulerOptions) *Scheduler {
	if o.MaxBatch < 1 {
		o.MaxBatch = 1
	}
	if o.PrefillChunk < 1 {
		o.PrefillChunk = 512
	}
	sc := &Scheduler{m: m, dec: dec, opt: o, in: make(chan *schedSeq), closed: make(chan struct{}), prefixes: NewPrefixCache(max(o.PrefixBudget, 0))}
	if o.KVBudget > 0 {
		var err error
		if sc.pool, err = m.NewPool((o.KVBudget+KVBlock-1)/KVBlock, KVBlock); err != nil {
			panic(err) // unreachable: at least one block of KVBlock positions
		}
	}
	sc.done.Add(1)
	go sc.loop()
	return sc
}

// SetPrefix computes and keeps the cache of ids (say, the rendered system
// prompt every conversation starts with); a prompt that starts with them
// copies that cache instead of computing it again. The outputs are the same
// as without it.
func (sc *Scheduler) SetPrefix(ids []int) error {
	if len(ids) == 0 {
		return nil
	}
	c := sc.m.NewCache(len(ids))
	if _, err := sc.m.ForwardLast([][]int{ids}, []*qwen.Cache{c}); err != nil {
		return err
	}
	sc.prefixes.Pin(ids, c)
	return nil
}

// Prefixes is the scheduler's prefix cache (its hit counts).
func (sc *Scheduler) Prefixes() *PrefixCache { return sc.prefixes }

// KV reports the paged pool's blocks, the most held at once and the
// sequences preempted so far (zeros without KVBudget).
func (sc *Scheduler) KV() KVStats {
	if sc.pool == nil {
		return KVStats{}
	}
	return KVStats{Blocks: sc.pool.Blocks(), Peak: int(sc.peak.Load()), Preempted: int(sc.preempted.Load())}
}

// Generate continues prompt and returns when the sequence is finished,
// calling onToken (if not nil) with each token as it is sampled, from the
// scheduler's goroutine. Sampling is as in Model.Generate with the
// sequence's own generator seeded with (s.Seed, 0), so a request gives the
// same tokens however it was batched. A cancelled ctx takes the sequence
// out at the next step.
func (sc *Scheduler) Generate(ctx context.Context, prompt []int, s Sampling, onToken func(id int)) (Generation, error) {
	if len(prompt) == 0 {
		return Generation{}, fmt.Errorf("prompt is empty")
	}
	if err := s.Check(); err != nil {
		return Generation{}, err
	}
	if n := len(prompt) + s.MaxTokens; sc.m.MaxPositions > 0 && n > sc.m.MaxPositions {
		return Generation{}, fmt.Errorf("prompt plus max tokens (%d) exceeds the model's %d positions", n, sc.m.MaxPositions)
	}
	if n := len(prompt) + s.MaxTokens; sc.pool != nil && (n+KVBlock-1)/KVBlock > sc.pool.Blocks() {
		return Generation{}, fmt.Errorf("prompt plus max tokens (%d) exceeds the KV cache budget of %d positions", n, sc.pool.Blocks()*KVBlock)
	}
	q := &schedSeq{ctx: ctx, prompt: prompt, s: s, onToken: onToken, ready: make(chan struct{})}
	select {
	case sc.in <- q:
	case <-ctx.Done():
		return Generation{}, ctx.Err()
	case <-sc.closed:
		return Generation{}, ErrSchedulerClosed
	}
	<-q.ready
	return q.gen, q.err
}

// Close stops the scheduler after failing the sequences still in it.
func (sc *Scheduler) Close() {
	sc.once.Do(func() { close(sc.closed) })
	sc.done.Wait()
}

func (sc *Scheduler) loop() {
	defer sc.done.Done()
	var live, waiting []*schedSeq
	finish := func(q *schedSeq, err error) {
		q.err = err
		if err == nil && sc.opt.PrefixBudget >= 0 && q.cache != nil {
			// A compact copy, outside any pool: the prefix budget counts
			// positions held, and a grown cache holds up to twice what it
			// filled (halving what the budget keeps); a paged sequence's
			// blocks go back to the live ones.
			if c := sc.m.NewCache(q.cache.Len); c.Fill(q.cache, q.cache.Len) == nil {
				sc.prefixes.Put(fed(q.prompt, q.gen), c)
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
			finish(q, ErrSchedulerClosed)
		}
	}()
	logp := make([]float32, sc.m.VocabSize)
	for {
		if len(live) == 0 && len(waiting) == 0 {
			select {
			case q := <-sc.in:
				waiting = append(waiting, q)
			case <-sc.closed:
				return
			}
		}
	drain:
		for {
			select {
			case q := <-sc.in:
				waiting = append(waiting, q)
			case <-sc.closed:
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
		for sc.pool != nil {
			used = 0
			for _, q := range live {
				used += q.cache.BlocksNeeded(min(len(q.next), sc.opt.PrefillChunk))
			}
			if used <= sc.pool.Free() || len(live) <= 1 {
				break
			}
			q := live[len(live)-1]
			live = live[:len(live)-1]
			q.cache.Release()
			q.cache, q.next = nil, nil
			waiting = append([]*schedSeq{q}, waiting...)
			sc.preempted.Add(1)
		}
		for len(live) < sc.opt.MaxBatch && len(waiting) > 0 {
			q := waiting[0]
			if sc.pool != nil {
				// First come, first served: the head waits for room.
				need := sc.joinBlocks(q)
				if len(live) > 0 && used+need > sc.pool.Free() {
					break
				}
				used += need
			}
			waiting = waiting[1:]
			sc.admit(q)
			live = append(live, q)
		}
		if len(live) == 0 {
			continue
		}
		toks := make([][]int, len(live))
		caches := make([]*qwen.Cache, len(live))
		fed := 0
		for j, q := range live {
			n := min(len(q.next), sc.opt.PrefillChunk)
			toks[j], caches[j] = q.next[:n], q.cache
			fed += n
		}
		logits, err := sc.m.ForwardLast(toks, caches)
		if err != nil {
			for _, q := range live {
				finish(q, err)
			}
			live = nil
			continue
		}
		if sc.pool != nil {
			sc.peak.Store(int64(sc.pool.Peak()))
		}
		if sc.opt.OnStep != nil {
			sc.opt.OnStep(len(live), fed)
		}
		kept := live[:0]
		for j, q := range live {
			q.next = q.next[len(toks[j]):]
			if len(q.next) > 0 { // still prefilling: these logits predict prompt tokens
				kept = append(kept, q)
				continue
			}
			row := logits[j]
			tok := sample(row, q.s, q.rng)
			cpu.LogSoftmax(logp, row)
			g := &q.gen
			g.Tokens = append(g.Tokens, tok)
			g.LogProbs = append(g.LogProbs, logp[tok])
			if q.onToken != nil {
				q.onToken(tok)
			}
			switch {
			case slices.Contains(q.s.StopIDs, tok):
				g.FinishReason = "stop"
			case len(q.s.Stop) > 0 && sc.dec != nil && hasStop(sc.dec.Decode(g.Tokens, false), q.s.Stop):
				g.FinishReason = "stop"
			case len(g.Tokens) >= q.s.MaxTokens:
				g.FinishReason = "length"
			default:
				q.next = []int{tok}
				kept = append(kept, q)
				continue
			}
			finish(q, nil)
		}
		live = kept
	}
}

// dropGone finishes the sequences whose caller went away and returns the
// others, in order.
func dropGone(qs []*schedSeq, finish func(*schedSeq, error)) []*schedSeq {
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
func (q *schedSeq) all() []int { return append(slices.Clip(q.prompt), q.gen.Tokens...) }

// match looks the sequence's cached prefix up once.
func (sc *Scheduler) match(q *schedSeq) {
	if !q.matched {
		q.src, q.srcN = sc.prefixes.Match(q.prompt)
		q.matched = true
	}
}

// joinBlocks is the pool blocks q takes to join: its prefix's copy and its
// first chunk.
func (sc *Scheduler) joinBlocks(q *schedSeq) int {
	sc.match(q)
	n := len(q.all())
	return (min(n, q.srcN+sc.opt.PrefillChunk) + KVBlock - 1) / KVBlock
}

// admit gives a sequence its cache, starting from the longest cached
// prefix of its prompt (the system prompt's, or an earlier turn's of the
// same conversation) when there is one; a preempted sequence recomputes
// its prompt and the tokens it had, and goes on sampling where it was.
func (sc *Scheduler) admit(q *schedSeq) {
	maxT := len(q.prompt) + q.s.MaxTokens
	if q.rng == nil {
		q.rng = rand.New(rand.NewPCG(q.s.Seed, 0))
	}
	if sc.pool != nil {
		q.cache = sc.m.NewPagedCache(sc.pool, maxT)
	} else {
		q.cache = sc.m.NewCache(maxT)
	}
	all := q.all()
	q.next = all
	sc.match(q)
	if n := q.srcN; n > 0 && q.cache.Fill(q.src, n) == nil {
		q.next = all[n:]
	}
}
