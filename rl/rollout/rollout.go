// Package rollout plays AgeMem's three-stage episodes (Algorithms 3-5) for
// a batch of tasks, K rollouts each, every rollout with a fresh long-term
// memory, and records every policy call as an experience for GRPO. All live
// rollouts wait on one batcher, which sends their requests to the policy as
// a single batch: generation advances every rollout in the same decoding
// steps.
package rollout

import (
	"context"
	"fmt"
	"sort"
	"sync"

	"github.com/agemem/agemem/env"
	"github.com/agemem/agemem/memtools"
	"github.com/agemem/agemem/memtools/stm"
)

// Experience is one policy call: the tokens it saw and produced and their
// log-probabilities under the policy that sampled them.
type Experience struct {
	Rollout     int // index into the batch's rollouts
	Stage, Turn int // 1-3; the user turn within the stage
	PromptIDs   []int
	ResponseIDs []int
	OldLogProbs []float32
}

// Rollout is one played episode.
type Rollout struct {
	Task   env.Task
	Group  int // the task's index in the batch: rollouts of one task form a GRPO group
	Result env.Result
	Err    error // the episode failed (not counted; its group still trains)
}

// Seeder is a policy whose sampling seed can be set per batch (the native
// policy), so a run is reproducible from its seed.
type Seeder interface{ SetSeed(uint64) }

// Options shape a rollout batch.
type Options struct {
	K       int // rollouts per task
	Seed    uint64
	Episode env.EpisodeConfig
	// NewRuntime returns the runtime of rollout i: a fresh long-term store
	// and context, the embedder and summariser.
	NewRuntime func(i int) *memtools.Runtime
}

// Run plays K rollouts of each task with the policy and returns them in
// order (task-major: rollouts g·K … g·K+K−1 belong to tasks[g]) with their
// experiences.
func Run(ctx context.Context, pol memtools.BatchPolicy, tasks []env.Task, o Options) ([]Rollout, []Experience, error) {
	return RunOn(ctx, []memtools.BatchPolicy{pol}, tasks, o)
}

// RunOn is Run with the rollouts spread over several policies, the same
// weights on different devices: rollout i is decoded by pols[i mod N],
// each policy batching its own rollouts, so N GPUs decode at once.
func RunOn(ctx context.Context, pols []memtools.BatchPolicy, tasks []env.Task, o Options) ([]Rollout, []Experience, error) {
	if o.K < 1 {
		return nil, nil, fmt.Errorf("rollout: K = %d, want at least 1", o.K)
	}
	if len(pols) == 0 {
		return nil, nil, fmt.Errorf("rollout: no policy")
	}
	n := len(tasks) * o.K
	rs := make([]Rollout, n)
	bs := make([]*batcher, len(pols))
	for d, pol := range pols {
		live := 0
		for i := d; i < n; i += len(pols) {
			live++
		}
		bs[d] = newBatcher(pol, live, o.Seed^uint64(d)<<48)
	}
	var wg sync.WaitGroup
	for i := range n {
		g := i / o.K
		rs[i] = Rollout{Task: tasks[g], Group: g}
		b := bs[i%len(pols)]
		wg.Go(func() {
			defer b.done()
			res, err := env.RunEpisode(ctx, b.policy(i), o.NewRuntime(i), tasks[g], o.Episode)
			rs[i].Result, rs[i].Err = res, err
		})
	}
	wg.Wait()
	if err := ctx.Err(); err != nil {
		return nil, nil, err
	}
	var exps []Experience
	for i, r := range rs {
		for stage, turns := range r.Result.Stages {
			for t, turn := range turns {
				for _, s := range turn.Trace.Steps {
					c := s.Completion
					if len(c.ResponseIDs) == 0 {
						continue
					}
					exps = append(exps, Experience{Rollout: i, Stage: stage + 1, Turn: t, PromptIDs: c.PromptIDs, ResponseIDs: c.ResponseIDs, OldLogProbs: c.LogProbs})
				}
			}
		}
	}
	return rs, exps, nil
}

// batcher gathers the requests of all live rollouts and answers them with
// one CompleteBatch once every live rollout is waiting. The batch is sorted
// by rollout, so its makeup, and with a seed per batch every sample, is the
// same on every run.
type batcher struct {
	pol     memtools.BatchPolicy
	mu      sync.Mutex
	live    int
	pending []*request
	seed    uint64
	batches uint64
}

type request struct {
	rollout int
	msgs    []stm.Message
	out     memtools.Completion
	err     error
	ready   chan struct{}
}

func newBatcher(pol memtools.BatchPolicy, live int, seed uint64) *batcher {
	return &batcher{pol: pol, live: live, seed: seed}
}

type proxy struct {
	b       *batcher
	rollout int
}

func (b *batcher) policy(i int) memtools.Policy { return proxy{b, i} }

// Complete implements memtools.Policy for one rollout.
func (p proxy) Complete(ctx context.Context, msgs []stm.Message) (memtools.Completion, error) {
	r := &request{rollout: p.rollout, msgs: msgs, ready: make(chan struct{})}
	p.b.mu.Lock()
	p.b.pending = append(p.b.pending, r)
	p.b.flushIfAllWaiting(ctx)
	p.b.mu.Unlock()
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
	convs := make([][]stm.Message, len(batch))
	for i, r := range batch {
		convs[i] = r.msgs
	}
	if s, ok := b.pol.(Seeder); ok {
		s.SetSeed(b.seed*0x9e3779b97f4a7c15 + b.batches)
	}
	b.batches++
	outs, err := b.pol.CompleteBatch(ctx, convs)
	for i, r := range batch {
		switch {
		case err == nil:
			r.out = outs[i]
		case ctx.Err() != nil:
			r.err = err
		default:
			// One bad conversation (say, a prompt over the limit) fails the
			// batch; retry alone so only its rollout sees the error.
			var one []memtools.Completion
			if one, r.err = b.pol.CompleteBatch(ctx, convs[i:i+1]); r.err == nil {
				r.out = one[0]
			}
		}
		close(r.ready)
	}
}
