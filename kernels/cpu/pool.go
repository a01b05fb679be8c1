package cpu

import (
	"runtime"
	"sync"
	"sync/atomic"
	"time"
)

// A decode step is about 170 matrix products of a few hundred microseconds
// each. Started as fresh goroutines, every product paid a futex wake-up of
// the other core and left it idle while it woke: the profile of a bf16
// 0.5B decode showed 1.6 of 2 cores busy. The pool keeps its workers
// spinning for a short while after each job, as ggml's thread pool does,
// so the next product starts on every core at once; past spinFor they park
// and cost nothing while the process is idle.

// spinFor is how long an idle worker polls for the next job before
// parking: longer than the gap between two products of one decode step
// (norms, attention), far shorter than a human-visible pause.
const spinFor = 200 * time.Microsecond

// job is one parallelFor call: n chunks taken in turn by whoever is free.
type job struct {
	f       func(lo, hi int)
	n       int
	chunk   int
	next    atomic.Int64 // next chunk to take
	pending atomic.Int64 // chunks not yet finished
}

// run takes chunks until none are left.
func (j *job) run() {
	for {
		c := int(j.next.Add(1) - 1)
		if c >= j.chunks() {
			return
		}
		lo := c * j.chunk
		j.f(lo, min(lo+j.chunk, j.n))
		j.pending.Add(-1)
	}
}

func (j *job) chunks() int { return (j.n + j.chunk - 1) / j.chunk }

type worker struct {
	parked atomic.Bool
	wake   chan struct{} // capacity 1: a wake-up is never lost, at most one spurious
}

// pool runs one job at a time on the calling goroutine and its workers.
type pool struct {
	mu      sync.Mutex // held by the caller whose job the workers run
	job     atomic.Pointer[job]
	gen     atomic.Uint64 // bumped when a job is published
	workers []*worker
}

var (
	sharedPool     *pool
	sharedPoolOnce sync.Once
)

// thePool is the process's pool, sized by GOMAXPROCS at first use.
func thePool() *pool {
	sharedPoolOnce.Do(func() {
		p := &pool{}
		for range runtime.GOMAXPROCS(0) - 1 {
			w := &worker{wake: make(chan struct{}, 1)}
			p.workers = append(p.workers, w)
			go p.loop(w)
		}
		sharedPool = p
	})
	return sharedPool
}

// loop is a worker: it waits for a new generation, spinning and then
// parked, and helps with the job published under it.
func (p *pool) loop(w *worker) {
	seen := p.gen.Load()
	for {
		deadline := time.Now().Add(spinFor)
		for spins := 0; ; spins++ {
			if g := p.gen.Load(); g != seen {
				seen = g
				break
			}
			if spins&255 != 255 || time.Now().Before(deadline) {
				continue
			}
			// Park. The publisher bumps gen before reading parked, and we
			// set parked before re-reading gen, so one of us sees the other.
			w.parked.Store(true)
			if g := p.gen.Load(); g != seen {
				w.parked.Store(false)
				seen = g
				break
			}
			<-w.wake
			w.parked.Store(false)
			deadline = time.Now().Add(spinFor)
		}
		if j := p.job.Load(); j != nil {
			j.run()
		}
	}
}

// parallelFor runs f over [0, n) in chunks, one per core, when the work
// (n × cost) is large enough to pay for sharing it. Each chunk is
// contiguous and f sees every index exactly once.
func parallelFor(n, cost int, f func(lo, hi int)) {
	procs := runtime.GOMAXPROCS(0)
	if procs == 1 || n*cost < 1<<15 || n == 1 {
		f(0, n)
		return
	}
	p := thePool()
	parts := min(procs, len(p.workers)+1, n)
	if parts < 2 || !p.mu.TryLock() {
		// Another caller holds the workers (or f itself called
		// parallelFor): share the work among fresh goroutines instead.
		spawnFor(n, min(procs, n), f)
		return
	}
	defer p.mu.Unlock()
	j := &job{f: f, n: n, chunk: (n + parts - 1) / parts}
	j.pending.Store(int64(j.chunks()))
	p.job.Store(j)
	p.gen.Add(1)
	for _, w := range p.workers[:parts-1] {
		if w.parked.Load() {
			select {
			case w.wake <- struct{}{}:
			default:
			}
		}
	}
	j.run()
	// What is left is in the workers' hands and nearly done.
	for spins := 0; j.pending.Load() != 0; spins++ {
		if spins&1023 == 1023 {
			runtime.Gosched()
		}
	}
}

// spawnFor is parallelFor on fresh goroutines.
func spawnFor(n, parts int, f func(lo, hi int)) {
	chunk := (n + parts - 1) / parts
	var wg sync.WaitGroup
	for lo := chunk; lo < n; lo += chunk {
		wg.Go(func() { f(lo, min(lo+chunk, n)) })
	}
	f(0, min(chunk, n))
	wg.Wait()
}
