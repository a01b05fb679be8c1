package train

import (
	"errors"
	"fmt"
	"sync"

	"github.com/agemem/agemem/kernels"
	"github.com/agemem/agemem/kernels/half"
)

// zero2 is ZeRO stage 2 over a Parallel's replicas (model.zero_stage: 2):
// each trainable parameter's gradient lives on its owner only. The
// replicas run their backward passes in lockstep, one micro-batch each a
// round; at the end of each backward stage (a layer, the head, the
// embedding) the other replicas' gradients of that stage's parameters are
// added into the owner's and dropped, so a replica holds its own share of
// the gradients and one stage's worth of the others' (DeepSpeed's
// reduce-scatter in buckets, a bucket being a layer).
type zero2 struct {
	p      *Parallel
	stages [][]int // stage → indices of the parameters whose gradient it writes
	bar    *barrier
	// pos[r] is the next stage replica r begins, passes[r] how many whole
	// backward passes it has made; each replica only touches its own.
	pos, passes []int
}

// gradStages is told, around each stage of a backward pass, which stage
// it is: before(s) must give each gradient stage s writes a buffer,
// after(s) may take them (sum them onto their owner, ZeRO-2). The stages
// run in order: 0 the LM head and final norm, then 1+(L−1−li) for layer
// li from the last, then L+1 the embedding.
type gradStages interface {
	before(d *Replica, s int)
	after(d *Replica, s int)
}

// stage tells d.stages that stage s begins (before) or ends.
func (d *Replica) stage(s int, before bool) {
	switch {
	case d.stages == nil:
	case before:
		d.stages.before(d, s)
	default:
		d.stages.after(d, s)
	}
}

// stageParams lists the trainable parameters (indices into Params) whose
// gradient each backward stage writes; the tied embedding is in the
// head's stage and the embedding's.
func (d *Replica) stageParams() [][]int {
	index := map[*DeviceParam]int{}
	for j, p := range d.Params {
		index[p] = j
	}
	L := len(d.Layers)
	out := make([][]int, L+2)
	add := func(s int, ps ...*DeviceParam) {
		for _, p := range ps {
			if j, ok := index[p]; ok {
				out[s] = append(out[s], j)
			}
		}
	}
	add(0, d.Norm, d.LMHead)
	for li := range d.Layers {
		l := &d.Layers[li]
		s := 1 + L - 1 - li
		add(s, l.AttnNorm, l.MLPNorm, l.Attn.QNorm, l.Attn.KNorm)
		for _, lin := range []*devLinear{&l.Attn.Q, &l.Attn.K, &l.Attn.V, &l.Attn.O, &l.MLP.Gate, &l.MLP.Up, &l.MLP.Down} {
			add(s, lin.W, lin.B, lin.A, lin.LB)
		}
	}
	add(L+1, d.Embed)
	return out
}

// errPeerFailed is what a replica waiting for the others sees when one of
// them failed: the failure itself is reported by that one.
var errPeerFailed = errors.New("another device failed during the step")

func newZero2(p *Parallel) *zero2 {
	z := &zero2{p: p, stages: p.Replicas[0].stageParams(), bar: newBarrier(len(p.Replicas)),
		pos: make([]int, len(p.Replicas)), passes: make([]int, len(p.Replicas))}
	for _, r := range p.Replicas {
		r.stages = z
	}
	return z
}

func (z *zero2) index(d *Replica) int {
	for i, r := range z.p.Replicas {
		if r == d {
			return i
		}
	}
	panic("zero2: a replica of another run")
}

// before implements gradStages: buffers for the gradients of stage s that
// another replica owns.
func (z *zero2) before(d *Replica, s int) {
	ri := z.index(d)
	if z.pos[ri] != s {
		panic(fmt.Sprintf("device %d: backward stage %d began where %d was due (zero_stage 2 runs one backward a micro-batch)", ri, s, z.pos[ri]))
	}
	for _, j := range z.stages[s] {
		if p := d.Params[j]; p.G == nil {
			p.G = d.be.Zeros(p.W.Shape()...)
		}
	}
}

// after implements gradStages: once every replica has finished stage s,
// the last to arrive adds the others' gradients of its parameters into
// each owner's, in replica order, and drops them.
func (z *zero2) after(d *Replica, s int) {
	ri := z.index(d)
	z.pos[ri] = s + 1
	if s+1 == len(z.stages) {
		z.pos[ri], z.passes[ri] = 0, z.passes[ri]+1
	}
	if err := z.bar.wait(func() { z.reduce(s) }); err != nil {
		panic(err)
	}
}

// reduce sums stage s's gradients onto their owners: through host memory
// into the owner alone, or with a device reducer (NCCL) as an all-reduce
// of the stage, whose sum the owners keep (the owner's buffer holds what
// it summed before, the others' only this round's: their sum is the total).
func (z *zero2) reduce(s int) {
	reps := z.p.Replicas
	if _, host := z.p.Reduce.(kernels.HostReduce); !host {
		bes := make([]kernels.TrainBackend, len(reps))
		grads := make([][]kernels.Tensor, len(reps))
		for r, rep := range reps {
			bes[r] = rep.be
			for _, j := range z.stages[s] {
				grads[r] = append(grads[r], rep.Params[j].G)
			}
		}
		if err := z.p.Reduce.AllReduce(bes, grads); err != nil {
			panic(fmt.Errorf("stage %d: %w", s, err))
		}
		for r, rep := range reps {
			for _, j := range z.stages[s] {
				if z.p.owner[j] != r {
					rep.Params[j].G = nil
				}
			}
		}
		return
	}
	for _, j := range z.stages[s] {
		o := z.p.owner[j]
		dst, be := reps[o].Params[j].G, reps[o].be
		for r, rep := range reps {
			if r == o {
				continue
			}
			g := rep.Params[j].G
			be.AddScaled(dst, be.FromHost(rep.be.ToHost(g), g.Shape()...), 1)
			rep.Params[j].G = nil
		}
	}
}

// finish completes replica d's backward pass of a round: the stages a job
// left unrun, or, when it ran none (no micro-batch left for d), a whole
// idle pass, so that every replica takes part in every stage's sum.
func (z *zero2) finish(d *Replica, passes int) {
	ri := z.index(d)
	if z.passes[ri] > passes+1 || (z.passes[ri] == passes+1 && z.pos[ri] != 0) {
		panic(fmt.Sprintf("device %d: more than one backward in a micro-batch (zero_stage 2 runs one)", ri))
	}
	if z.passes[ri] == passes+1 {
		return
	}
	for s := z.pos[ri]; s < len(z.stages); s++ {
		d.stage(s, true)
		d.stage(s, false)
	}
}

// run is Parallel.Run under ZeRO-2: rounds of one micro-batch per replica,
// the last round padded with idle passes; a replica that fails releases
// the others from the stage they wait at.
func (z *zero2) run(n int, job func(r *Replica, i int) error) error {
	reps := z.p.Replicas
	slots := (n + len(reps) - 1) / len(reps) * len(reps)
	// A step that failed may have left stages half run: start clean
	// (the others' gradient buffers dropped, every replica at stage 0).
	z.bar.reset()
	for r, rep := range reps {
		z.pos[r] = 0
		for j, p := range rep.Params {
			if z.p.owner[j] != r {
				p.G = nil
			}
		}
	}
	return runOn(reps, slots, 0, len(reps), func(r *Replica, i int) (err error) {
		defer func() {
			if e := recover(); e != nil {
				z.bar.abort()
				panic(e)
			}
			if err != nil {
				z.bar.abort()
			}
		}()
		start := z.passes[z.index(r)]
		if i < n {
			if err := job(r, i); err != nil {
				return err
			}
		}
		z.finish(r, start)
		return nil
	})
}

// update is Parallel.Update's step under ZeRO-2: the global gradient norm
// from each owner's share, each owner's AdamW step on its (master)
// parameters, then each parameter sent to the others (Parallel.sendOwned).
func (z *zero2) update(stepN int, lr float64) (kernels.Tensor, error) {
	p, t := z.p, z.p.T
	total := 0.0
	for r, rep := range p.Replicas {
		total += float64(rep.be.ToHost(rep.sumSquares(p.owned(r)))[0])
	}
	var ss0 kernels.Tensor
	for r, rep := range p.Replicas {
		ss := rep.be.FromHost([]float32{float32(total)}, 1)
		if ss0 == nil {
			ss0 = ss
		}
		rep.apply(t.Opt.Config, stepN, lr, t.ClipNorm, p.owned(r), ss)
	}
	return ss0, p.sendOwned()
}

func isMatrix(t kernels.Tensor) bool {
	s := t.Shape()
	return len(s) == 2 && s[0] > 1 && s[1] > 1
}

// holdWorkingCopies makes every trainable matrix a bf16 working copy on
// every replica, the float32 master (the current weight) kept by its owner
// alone.
func (z *zero2) holdWorkingCopies() {
	for r, rep := range z.p.Replicas {
		rep.working = true
		for j, prm := range rep.Params {
			if !isMatrix(prm.W) {
				continue
			}
			s := prm.W.Shape()
			vals := rep.be.ToHost(prm.W)
			bits := make([]uint16, len(vals))
			for i, v := range vals {
				bits[i] = half.F32ToBF16(v)
			}
			if z.p.owner[j] == r {
				prm.Master = prm.W
			}
			prm.W = rep.be.Upload(kernels.Weight{Rows: s[0], Cols: s[1], BF16: bits})
		}
	}
}

// barrier lets n goroutines meet: the last to arrive runs an action before
// any leaves. abort releases every waiter with errPeerFailed, now and at
// every later wait until reset.
type barrier struct {
	mu      sync.Mutex
	cond    *sync.Cond
	n, here int
	gen     uint64
	broken  bool
}

func newBarrier(n int) *barrier {
	b := &barrier{n: n}
	b.cond = sync.NewCond(&b.mu)
	return b
}

func (b *barrier) wait(action func()) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.broken {
		return errPeerFailed
	}
	b.here++
	if b.here == b.n {
		ok := false
		defer func() {
			if !ok { // the action panicked: nobody else may wait for it
				b.broken = true
				b.cond.Broadcast()
			}
		}()
		action()
		ok = true
		b.here = 0
		b.gen++
		b.cond.Broadcast()
		return nil
	}
	gen := b.gen
	for gen == b.gen && !b.broken {
		b.cond.Wait()
	}
	if b.broken {
		return errPeerFailed
	}
	return nil
}

func (b *barrier) abort() {
	b.mu.Lock()
	b.broken = true
	b.cond.Broadcast()
	b.mu.Unlock()
}

func (b *barrier) reset() {
	b.mu.Lock()
	b.broken, b.here = false, 0
	b.mu.Unlock()
}
