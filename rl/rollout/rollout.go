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
	// Adapter is the model that produced it as its engine named it (a
	// LoRA adapter's versioned name on a remote engine; "" in process).
	Adapter string
}

// Rollout is one played episode.
type Rollout[R any] struct {
	Task   int // the task's index in the environment
	Group  int // the task's index in the batch: rollouts of one task form a GRPO group
	Index  int // the rollout's index in the batch (task-major)
	Result R
	Err    error // the episode failed (not counted; its group still trains)
	// Engine is the policy (index into RunOn's) that played it; Reruns
	// how often it was played again from its start because an engine
	// failed under it.
	Engine, Reruns int
}

// Score is what a reward makes of a rollout: the scalar GRPO normalises,
// named parts (averaged per step in the run's metrics) and anything else
// worth a line in the per-rollout log.
type Score struct {
	Total float64
	Parts map[string]float64
	Info  map[string]any
	// Calls, when set, shape single calls: Calls[j] is added to the
	// advantage of the tokens of the rollout's call j (Experience.Call),
	// after the group normalisation, and to no other call's. A call that
	// went wrong on its own (a malformed tool call, say) pays for it
	// without charging the calls around it, which the episode's reward
	// alone would (step-wise GRPO gives every call the same advantage).
	Calls []float64
}

// EngineError is a policy call that failed because its engine did: down,
// hung past its timeout, answering 5xx, or answering with another model
// than asked (a stale adapter). The rollout is played again from its
// start on another engine, with the same seeds, so it comes out as it
// would have.
type EngineError struct {
	Engine string
	Err    error
}

func (e *EngineError) Error() string { return fmt.Sprintf("engine %s: %v", e.Engine, e.Err) }
func (e *EngineError) Unwrap() error { return e.Err }

// Options shape a rollout batch.
type Options struct {
	K    int    // rollouts per task
	Seed uint64 // sampling
	// Sampling, when set, is every call's (the rollout temperature), each
	// call drawing from a seed of Seed, its rollout's index and its place
	// among the rollout's calls: what a rollout samples does not depend on
	// what it was batched with, on which engine or rank played it, or on
	// how often it was played. Nil keeps the model's own.
	Sampling *llm.Sampling
	// EpisodeSeed is the seed Play gets for rollout i (default: i).
	EpisodeSeed func(i int) uint64
	// Done, if set, is called as each rollout ends with how many have
	// ended of how many (from the rollouts' goroutines, one at a time).
	Done func(finished, total int)
	// Groups, when set, are the only tasks' groups played (a rank's
	// share of the batch); the rest are another rank's.
	Groups []int
	// Preferred is how many of the policies (the first) take rollouts at
	// the start; the others only take rollouts whose engine failed (0:
	// all take them).
	Preferred int
}

// CallSeed is the sampling seed of call j of rollout i of a batch seeded
// with seed: SplitMix64 of the three, its top bit clear so that it passes
// through protocols whose seed is a signed 64-bit integer.
func CallSeed(seed uint64, i, j int) uint64 {
	mix := func(x uint64) uint64 {
		x += 0x9e3779b97f4a7c15
		x = (x ^ x>>30) * 0xbf58476d1ce4e5b9
		x = (x ^ x>>27) * 0x94d049bb133111eb
		return x ^ x>>31
	}
	return mix(mix(seed)^uint64(i)<<24^uint64(j)) &^ (1 << 63)
}

// Run plays K rollouts of each task with the policy and returns them in
// order (task-major: rollouts g·K … g·K+K−1 belong to tasks[g]) with their
// experiences, in call order within each rollout.
func Run[R any](ctx context.Context, m llm.Model, e Env[R], tasks []int, o Options) ([]Rollout[R], []Experience, error) {
	return RunOn(ctx, []llm.Model{m}, e, tasks, o)
}

// RunOn is Run with the rollouts spread over several models: each
// engine batches its own rollouts, so N GPUs (or N servers) decode at
// once. The i-th rollout played goes to preferred engine i mod N; an
// episode stays on its engine (whose prefix cache holds its context). A
// rollout whose engine fails under it (EngineError) is played again from
// its start on the least-loaded engine still up, and that engine is not
// used again in this batch; with none left the batch fails.
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
	groups := o.Groups
	if groups == nil {
		groups = make([]int, len(tasks))
		for g := range groups {
			groups[g] = g
		}
	}
	var idx []int // the rollouts this call plays, in order
	for _, g := range groups {
		if g < 0 || g >= len(tasks) {
			return nil, nil, fmt.Errorf("rollout: group %d of a batch of %d tasks", g, len(tasks))
		}
		for k := range o.K {
			idx = append(idx, g*o.K+k)
		}
	}
	seed := o.EpisodeSeed
	if seed == nil {
		seed = func(i int) uint64 { return uint64(i) }
	}
	pref := o.Preferred
	if pref <= 0 || pref > len(pols) {
		pref = len(pols)
	}
	p := &pool{bs: make([]*batcher, len(pols)), down: make([]error, len(pols))}
	for d, pol := range pols {
		p.bs[d] = &batcher{pol: pol, sampling: o.Sampling, seed: o.Seed}
	}
	rs := make([]Rollout[R], len(idx))
	calls := make([][]Experience, len(idx))
	for n, i := range idx {
		rs[n] = Rollout[R]{Task: tasks[i/o.K], Group: i / o.K, Index: i, Engine: n % pref}
		p.bs[n%pref].live++
	}
	var wg sync.WaitGroup
	var doneMu sync.Mutex
	var fatal error
	finished := 0
	for n, i := range idx {
		wg.Go(func() {
			r := &rs[n]
			for {
				b := p.bs[r.Engine]
				rec := &recorder{b: b, rollout: i}
				r.Result, r.Err = e.Play(ctx, rec, r.Task, seed(i))
				b.done()
				if rec.failed == nil || ctx.Err() != nil {
					calls[n] = rec.calls
					break
				}
				// The engine failed under the episode: play it again
				// elsewhere, from its start, discarding what it recorded.
				next, err := p.fail(r.Engine, rec.failed)
				if err != nil {
					doneMu.Lock()
					fatal = errors.Join(fatal, fmt.Errorf("rollout %d: %w", i, err))
					doneMu.Unlock()
					r.Err = err
					break
				}
				r.Engine = next
				r.Reruns++
			}
			if o.Done != nil {
				doneMu.Lock()
				finished++
				o.Done(finished, len(idx))
				doneMu.Unlock()
			}
		})
	}
	wg.Wait()
	if err := ctx.Err(); err != nil {
		return nil, nil, err
	}
	if fatal != nil {
		return nil, nil, fmt.Errorf("rollout: every engine failed: %w", fatal)
	}
	var exps []Experience
	for _, c := range calls {
		exps = append(exps, c...)
	}
	return rs, exps, nil
}

// pool is the engines of a batch, which are up, and how loaded.
type pool struct {
	mu   sync.Mutex
	bs   []*batcher
	down []error // why an engine was taken out (nil: up)
}

// fail takes engine d out (its error said why) and joins the rollout to
// the least-loaded engine still up.
func (p *pool) fail(d int, why error) (int, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.down[d] == nil {
		p.down[d] = why
	}
	best := -1
	for k, b := range p.bs {
		if p.down[k] != nil {
			continue
		}
		if best < 0 || b.load() < p.bs[best].load() {
			best = k
		}
	}
	if best < 0 {
		return 0, errors.Join(p.down...)
	}
	p.bs[best].join()
	return best, nil
}

// recorder is one rollout's model: it queues the rollout's requests on
// the batcher and keeps every call that produced tokens. Once its engine
// has failed it answers every call with that failure at once, so the
// episode ends and is played again elsewhere.
type recorder struct {
	b       *batcher
	rollout int
	calls   []Experience
	asked   int // requests made: the next call's place, for its seed
	failed  error
}

// Chat implements llm.Model.
func (p *recorder) Chat(ctx context.Context, req llm.Request) (llm.Response, error) {
	if p.failed != nil {
		return llm.Response{}, p.failed
	}
	c, err := p.b.complete(ctx, p.rollout, p.asked, req)
	p.asked++
	var ee *EngineError
	if errors.As(err, &ee) {
		p.failed = err
	}
	if err == nil && len(c.ResponseIDs) > 0 {
		p.calls = append(p.calls, Experience{Rollout: p.rollout, Call: len(p.calls), PromptIDs: c.PromptIDs,
			ResponseIDs: c.ResponseIDs, Adapter: c.Model})
	}
	return c, err
}

// batcher gathers the requests of all live rollouts and answers them as
// one batch once every live rollout is waiting (llm.Batcher's ChatBatch;
// concurrent calls on other models). The batch is sorted by rollout, so
// its makeup is the same on every run (each call's sample depends only on
// its own seed: see Options.Sampling).
type batcher struct {
	pol      llm.Model
	sampling *llm.Sampling
	mu       sync.Mutex
	live     int
	pending  []*request
	seed     uint64
}

type request struct {
	rollout int
	call    int
	req     llm.Request
	out     llm.Response
	err     error
	ready   chan struct{}
}

func (b *batcher) complete(ctx context.Context, rollout, call int, req llm.Request) (llm.Response, error) {
	r := &request{rollout: rollout, call: call, req: req, ready: make(chan struct{})}
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

// join adds a rollout to the engine (a rollout moved from a failed one).
func (b *batcher) join() {
	b.mu.Lock()
	b.live++
	b.mu.Unlock()
}

func (b *batcher) load() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.live
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
	for i, r := range batch {
		reqs[i] = r.req
		if b.sampling != nil {
			s := *b.sampling
			s.Seed, s.Stream = CallSeed(b.seed, r.rollout, r.call), 0
			reqs[i].Sampling = &s
		}
	}
	outs, errs := chatAll(ctx, b.pol, reqs)
	for i, r := range batch {
		r.out, r.err = outs[i], errs[i]
		close(r.ready)
	}
}

// chatAll answers reqs in one batch where the model batches, else with
// concurrent calls (a server batches them itself), each with its own
// error. A batch that fails for one bad conversation (say, a prompt over
// the limit) is retried a request at a time, so that only its rollout sees
// the error; one that fails for its engine fails every request.
func chatAll(ctx context.Context, m llm.Model, reqs []llm.Request) ([]llm.Response, []error) {
	out := make([]llm.Response, len(reqs))
	errs := make([]error, len(reqs))
	bm, ok := m.(llm.Batcher)
	if !ok {
		var wg sync.WaitGroup
		for i, r := range reqs {
			wg.Go(func() { out[i], errs[i] = m.Chat(ctx, r) })
		}
		wg.Wait()
		return out, errs
	}
	all, err := bm.ChatBatch(ctx, reqs)
	var ee *EngineError
	switch {
	case err == nil:
		return all, errs
	case ctx.Err() != nil || errors.As(err, &ee):
		for i := range errs {
			errs[i] = err
		}
		return out, errs
	}
	for i := range reqs {
		var one []llm.Response
		if one, errs[i] = bm.ChatBatch(ctx, reqs[i:i+1]); errs[i] == nil {
			out[i] = one[0]
		}
	}
	return out, errs
}
