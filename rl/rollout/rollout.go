// Package rollout plays episodes of any environment for a batch of tasks,
// K rollouts each, and records every policy call as an experience for
// GRPO. All live rollouts wait on one batcher, which sends their requests
// to the policy as a single batch: generation advances every rollout in
// the same decoding steps. An environment says what a rollout is (AgeMem's
// three stages are env.AgeMem); this package never looks inside one.
package rollout

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"sync"

	"github.com/agemem/agemem/llm"
)

// Env is what rollouts are played in: a list of tasks and how one episode
// of a task goes with a policy. R is what an episode leaves for the reward
// to read.
type Env[R any] interface {
	// Len is the number of tasks.
	Len() int
	// Play runs one episode of task t with model m. seed is the rollout's
	// own (for whatever the episode draws: memory ids, say), so a run is
	// reproducible.
	Play(ctx context.Context, m llm.Model, t int, seed uint64) (R, error)
}

// Experience is one policy call: the tokens it saw and produced. (The
// update scores them itself, at the rollout temperature, on the training
// runtime: the engine's log-probabilities are not what it trains.)
type Experience struct {
	Rollout     int // index into the batch's rollouts
	Call        int // the call's place among its rollout's calls
	PromptIDs   []int
	ResponseIDs []int
}

// Rollout is one played episode.
type Rollout[R any] struct {
	Task   int // the task's index in the environment
	Group  int // the task's index in the batch: rollouts of one task form a GRPO group
	Result R
	Err    error // the episode failed (not counted; its group still trains)
}

// Score is what a reward makes of a rollout: the scalar GRPO normalises,
// named parts (averaged per step in the run's metrics) and anything else
// worth a line in the per-rollout log.
type Score struct {
	Total float64
	Parts map[string]float64
	Info  map[string]any
}

// Options shape a rollout batch.
type Options struct {
	K    int    // rollouts per task
	Seed uint64 // sampling
	// Sampling, when set, is every call's (the rollout temperature): each
	// batch draws from (a seed of Seed and the batch's number, its place
	// in the batch), so a run is reproducible. Nil keeps the model's own.
	Sampling *llm.Sampling
	// EpisodeSeed is the seed Play gets for rollout i (default: i).
	EpisodeSeed func(i int) uint64
	// Done, if set, is called as each rollout ends with how many have
	// ended of how many (from the rollouts' goroutines, one at a time).
	Done func(finished, total int)
}

// Run plays K rollouts of each task with the policy and returns them in
// order (task-major: rollouts g·K … g·K+K−1 belong to tasks[g]) with their
// experiences, in call order within each rollout.
func Run[R any](ctx context.Context, m llm.Model, e Env[R], tasks []int, o Options) ([]Rollout[R], []Experience, error) {
	return RunOn(ctx, []llm.Model{m}, e, tasks, o)
}

// RunOn is Run with the rollouts spread over several models, the same
// weights on different devices: rollout i is decoded by ms[i mod N],
// each batching its own rollouts, so N GPUs decode at once.
func RunOn[R any](ctx context.Context, pols []llm.Model, e Env[R], tasks []int, o Options) ([]Rollout[R], []Experience, error) {
	if o.K < 1 {
		return nil, nil, fmt.Errorf("rollout: K = %d, want at least 1", o.K)
	}
	if len(pols) == 0 {
		return nil, nil, fmt.Errorf("rollout: no policy")
	}
	for _, t := range tasks {
		if t < 0 || t >= e.Len() {
			return nil, nil, fmt.Errorf("rollout: task %d of an environment of %d", t, e.Len())
		}
	}
	seed := o.EpisodeSeed
	if seed == nil {
		seed = func(i int) uint64 { return uint64(i) }
	}
	n := len(tasks) * o.K
	rs := make([]Rollout[R], n)
	calls := make([][]Experience, n)
	bs := make([]*batcher, len(pols))
	for d, pol := range pols {
		live := 0
		for i := d; i < n; i += len(pols) {
			live++
		}
		bs[d] = &batcher{pol: pol, live: live, seed: o.Seed ^ uint64(d)<<48, sampling: o.Sampling}
	}
	var wg sync.WaitGroup
	var doneMu sync.Mutex
	finished := 0
	for i := range n {
		g := i / o.K
		rs[i] = Rollout[R]{Task: tasks[g], Group: g}
		b := bs[i%len(pols)]
		wg.Go(func() {
			defer b.done()
			rec := &recorder{b: b, rollout: i}
			rs[i].Result, rs[i].Err = e.Play(ctx, rec, tasks[g], seed(i))
			calls[i] = rec.calls
			if o.Done != nil {
				doneMu.Lock()
				finished++
				o.Done(finished, n)
				doneMu.Unlock()
			}
		})
	}
	wg.Wait()
	if err := ctx.Err(); err != nil {
		return nil, nil, err
	}
	var exps []Experience
	for _, c := range calls {
		exps = append(exps, c...)
	}
	return rs, exps, nil
}

// recorder is one rollout's model: it queues the rollout's requests on
// the batcher and keeps every call that produced tokens.
type recorder struct {
	b       *batcher
	rollout int
	calls   []Experience
}

// Chat implements llm.Model.
func (p *recorder) Chat(ctx context.Context, req llm.Request) (llm.Response, error) {
	c, err := p.b.complete(ctx, p.rollout, req)
	if err == nil && len(c.ResponseIDs) > 0 {
		p.calls = append(p.calls, Experience{Rollout: p.rollout, Call: len(p.calls), PromptIDs: c.PromptIDs,
			ResponseIDs: c.ResponseIDs})
	}
	return c, err
}

// batcher gathers the requests of all live rollouts and answers them as
// one batch once every live rollout is waiting (llm.Batcher's ChatBatch;
// concurrent calls on other models). The batch is sorted by rollout, so
// its makeup, and with a seed per batch every sample, is the same on every
// run.
type batcher struct {
	pol      llm.Model
	sampling *llm.Sampling
	mu       sync.Mutex
	live     int
	pending  []*request
	seed     uint64
	batches  uint64
}

type request struct {
	rollout int
	req     llm.Request
	out     llm.Response
	err     error
	ready   chan struct{}
}

func (b *batcher) complete(ctx context.Context, rollout int, req llm.Request) (llm.Response, error) {
	r := &request{rollout: rollout, req: req, ready: make(chan struct{})}
	b.mu.Lock()
	b.pending = append(b.pending, r)
	b.flushIfAllWaiting(ctx)
	b.mu.Unlock()
	<-r.ready
	return r.out, r.err
}

// done marks a rollout finished; the others may now be all waiting.
func (b *batcher) done() {
	b.mu.Lock()
	b.live--
	b.flushIfAllWaiting(context.Background())
	b.mu.Unlock()
}

// flushIfAllWaiting runs the pending batch when every live rollout is in
// it. Called with mu held, also while the policy runs: every live rollout
// is waiting on this batch, so none needs the lock until it is answered.
func (b *batcher) flushIfAllWaiting(ctx context.Context) {
	if len(b.pending) == 0 || len(b.pending) < b.live {
		return
	}
	batch := b.pending
	b.pending = nil
	sort.Slice(batch, func(i, j int) bool { return batch[i].rollout < batch[j].rollout })
	reqs := make([]llm.Request, len(batch))
	seed := b.seed*0x9e3779b97f4a7c15 + b.batches
	b.batches++
	for i, r := range batch {
		reqs[i] = r.req
		if b.sampling != nil {
			s := *b.sampling
			s.Seed, s.Stream = seed, uint64(i)
			reqs[i].Sampling = &s
		}
	}
	outs, err := chatAll(ctx, b.pol, reqs)
	for i, r := range batch {
		switch {
		case err == nil:
			r.out = outs[i]
		case ctx.Err() != nil:
			r.err = err
		default:
			// One bad conversation (say, a prompt over the limit) fails the
			// batch; retry alone so only its rollout sees the error.
			var one []llm.Response
			if one, r.err = chatAll(ctx, b.pol, reqs[i:i+1]); r.err == nil {
				r.out = one[0]
			}
		}
		close(r.ready)
	}
}

// chatAll answers reqs in one batch where the model batches, else with
// concurrent calls (a server batches them itself); the first failure is
// the error.
func chatAll(ctx context.Context, m llm.Model, reqs []llm.Request) ([]llm.Response, error) {
	if bm, ok := m.(llm.Batcher); ok {
		return bm.ChatBatch(ctx, reqs)
	}
	out := make([]llm.Response, len(reqs))
	errs := make([]error, len(reqs))
	var wg sync.WaitGroup
	for i, r := range reqs {
		wg.Go(func() { out[i], errs[i] = m.Chat(ctx, r) })
	}
	wg.Wait()
	return out, errors.Join(errs...)
}
