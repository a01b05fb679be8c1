package train

import (
	"errors"
	"fmt"
	"io"
	"math"
	"slices"
	"sort"
	"sync"

	"github.com/agemem/agemem/kernels"
	"github.com/agemem/agemem/kernels/device"
)

// Parallel is data-parallel training over devices: every device holds a
// replica of the trainable weights with their gradients and AdamW moments
// (Replica); a step's micro-batches are spread over the
// replicas, which run at once; the gradients are summed across replicas
// (all-reduce) and every replica takes the same AdamW step, so they stay
// identical. Because the loss weights of a step's tokens are fixed over
// the whole step, the summed gradient is the one device's gradient of the
// combined batch. The Optimizer keeps the schedule, the step count and the
// host copy of the weights that rollouts and checkpoints read.
type Parallel struct {
	T        *Optimizer
	Replicas []*Replica
	Reduce   kernels.Reducer
	frozen   map[*Weights[float32]][]*Replica // Score's reference replicas
	log      io.Writer
	stale    bool // the host weights lag the replicas (SyncHost)
	base     Base // how the devices hold frozen weights
	// owner[j] is the replica that holds parameter j's moments and updates
	// it (ZeRO-1); nil: every replica updates every parameter.
	owner []int
	// z2 sums each gradient onto its owner alone (ZeRO-2); nil: gradients
	// are all-reduced.
	z2 *zero2
	// offloadRef keeps a frozen reference's layers in host memory
	// (model.offload_reference).
	offloadRef bool
	// ranks, when set, is the run across processes this one is a rank of
	// (ranks.go); exchanges counts its exchanges, which name themselves.
	ranks     *Ranks
	exchanges int
}

// owners spreads parameters over n replicas, largest first onto the least
// loaded, so each holds about 1/n of the moments.
func owners(params []*DeviceParam, n int) []int {
	order := make([]int, len(params))
	for i := range order {
		order[i] = i
	}
	sort.SliceStable(order, func(a, b int) bool { return params[order[a]].W.Len() > params[order[b]].W.Len() })
	load := make([]int, n)
	own := make([]int, len(params))
	for _, j := range order {
		r := 0
		for i := range load {
			if load[i] < load[r] {
				r = i
			}
		}
		own[j] = r
		load[r] += params[j].W.Len()
	}
	return own
}

// owned is the mask of parameters replica r updates (nil: all).
func (p *Parallel) owned(r int) []bool {
	if p.owner == nil {
		return nil
	}
	m := make([]bool, len(p.owner))
	for j, o := range p.owner {
		m[j] = o == r
	}
	return m
}

// NewParallel puts a replica of t's policy on each backend, starting from
// the trainer's current weights and moments (a resumed run's included).
// reduce may be nil: kernels.HostReduce. o.BF16 and o.BaseQ8 say how the
// frozen weights are held (NewReplica); o.ZeroStage 1 gives each
// parameter an owner, 2 also shards the gradients and, under o.BF16, the
// float32 masters (zero2).
func NewParallel(t *Optimizer, bes []kernels.TrainBackend, reduce kernels.Reducer, o LearnerOptions, log io.Writer) (*Parallel, error) {
	if len(bes) == 0 {
		return nil, fmt.Errorf("data-parallel training needs at least one device")
	}
	if reduce == nil {
		reduce = kernels.HostReduce{}
	}
	p := &Parallel{T: t, Reduce: reduce, frozen: map[*Weights[float32]][]*Replica{}, base: o.base(), log: log, offloadRef: o.OffloadReference}
	for _, be := range bes {
		p.Replicas = append(p.Replicas, NewReplica(be, t.Model.W, p.base))
	}
	if o.ZeroStage >= 1 && len(bes) > 1 {
		p.owner = owners(p.Replicas[0].Params, len(bes))
	}
	if o.ZeroStage >= 2 && len(bes) > 1 {
		p.z2 = newZero2(p)
		if o.BF16 {
			p.z2.holdWorkingCopies()
		}
	}
	for r, rep := range p.Replicas {
		rep.LoadMoments(t.Opt, p.owned(r))
	}
	if log != nil {
		how := "gradients all-reduced through " + reduce.Name()
		if p.z2 != nil {
			how = "each gradient summed onto its owner (ZeRO-2) through " + reduce.Name()
		}
		fmt.Fprintf(log, "training on %d device(s), %s\n", len(bes), how)
	}
	return p, nil
}

// Run runs job(replica, i) for i in [0, n): job i on replica i mod N, the
// replicas concurrently and each replica's jobs in order. The first error
// is returned. Under ZeRO-2 a job runs at most one backward pass, and the
// replicas run theirs in lockstep (zero2.run).
func (p *Parallel) Run(n int, job func(r *Replica, i int) error) error {
	if p.z2 != nil {
		return p.z2.run(n, job)
	}
	first, stride := p.span()
	return runOn(p.Replicas, n, first, stride, job)
}

// runOn runs job i on replica (i − first) mod stride for the i this
// process's replicas own: every i from first+k in steps of stride on
// replica k (first 0 and stride len(reps) in one process).
func runOn(reps []*Replica, n, first, stride int, job func(r *Replica, i int) error) error {
	var wg sync.WaitGroup
	errs := make([]error, len(reps))
	for ri, r := range reps {
		wg.Go(func() {
			defer func() {
				if e := recover(); e != nil {
					if err, ok := e.(error); ok && errors.Is(err, errPeerFailed) {
						errs[ri] = err
						return
					}
					errs[ri] = fmt.Errorf("device %d (%s): %v", ri, r.Backend().Name(), e)
				}
			}()
			for i := first + ri; i < n; i += stride {
				if err := job(r, i); err != nil {
					errs[ri] = err
					return
				}
			}
		})
	}
	wg.Wait()
	// The failure itself before the others' "another device failed".
	for _, err := range errs {
		if err != nil && !errors.Is(err, errPeerFailed) {
			return err
		}
	}
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}

// Update all-reduces the gradients and takes one clipped AdamW step on
// every replica at the scheduled rate; the host copy of the weights is
// brought up to date by SyncHost, only when something reads it. It
// returns the gradient norm before clipping and the rate.
func (p *Parallel) Update() (gradNorm, lr float64, err error) {
	bes := make([]kernels.TrainBackend, len(p.Replicas))
	grads := make([][]kernels.Tensor, len(p.Replicas))
	for r, rep := range p.Replicas {
		bes[r] = rep.Backend()
		for _, prm := range rep.Params {
			grads[r] = append(grads[r], prm.G)
		}
	}
	t := p.T
	lr = t.Schedule.LR(t.LR, t.Step)
	if p.z2 != nil {
		t.Opt.StepN++
		ss, err := p.z2.update(t.Opt.StepN, lr)
		if err != nil {
			return 0, 0, err
		}
		t.Step++
		p.stale = true
		return math.Sqrt(float64(bes[0].ToHost(ss)[0])), lr, nil
	}
	if err := p.Reduce.AllReduce(bes, grads); err != nil {
		return 0, 0, err
	}
	t.Opt.StepN++
	var ss kernels.Tensor
	for r, rep := range p.Replicas {
		s := rep.Step(t.Opt.Config, t.Opt.StepN, lr, t.ClipNorm, p.owned(r))
		if ss == nil {
			ss = s
		}
	}
	if p.owner != nil {
		if err := p.sendOwned(); err != nil {
			return 0, 0, err
		}
	}
	t.Step++
	p.stale = true
	return math.Sqrt(float64(bes[0].ToHost(ss)[0])), lr, nil
}

// sendOwned brings every replica's copy of each parameter to the value its
// owner's update gave it (ZeRO-1 and 2), rounded to bf16 where a replica
// holds a working copy. Through host memory with the host reducer; with a
// device one (NCCL) as an all-reduce to which only the owner contributes,
// device to device, a parameter at a time (one parameter's buffer on each
// device).
func (p *Parallel) sendOwned() error {
	_, host := p.Reduce.(kernels.HostReduce)
	for j, o := range p.owner {
		src := p.Replicas[o].Params[j].master()
		// got[r] is the new value on replica r, in float32.
		got := make([]kernels.Tensor, len(p.Replicas))
		if host {
			vals := p.Replicas[o].be.ToHost(src)
			for r, rep := range p.Replicas {
				if r != o {
					got[r] = rep.be.FromHost(vals, src.Shape()...)
				}
			}
		} else {
			bes := make([]kernels.TrainBackend, len(p.Replicas))
			bufs := make([][]kernels.Tensor, len(p.Replicas))
			for r, rep := range p.Replicas {
				bes[r] = rep.be
				got[r] = rep.be.Zeros(src.Shape()...)
				if r == o {
					rep.be.AddScaled(got[r], src, 1)
				}
				bufs[r] = []kernels.Tensor{got[r]}
			}
			if err := p.Reduce.AllReduce(bes, bufs); err != nil {
				return fmt.Errorf("sending %s from device %d: %w", p.Replicas[o].Params[j].Name, o, err)
			}
		}
		for r, rep := range p.Replicas {
			dst := rep.Params[j]
			switch {
			case dst.Master != nil:
				rep.be.NarrowBF16Into(dst.W, dst.Master)
			case dst.W == src:
			case rep.working && isMatrix(dst.W):
				rep.be.NarrowBF16Into(dst.W, got[r])
			default:
				rep.be.CopyRows(dst.W, 0, got[r], 0, dst.W.Shape()[0])
			}
		}
	}
	return nil
}

// SyncHost implements Learner: one device-to-host copy of the trainable
// weights after an update, none when nothing changed.
func (p *Parallel) SyncHost() {
	if p.stale {
		p.download()
		p.stale = false
	}
}

// download copies the trainable weights to the host: from the first
// replica, or under ZeRO-2 each from its owner (which alone holds its
// float32 master).
func (p *Parallel) download() {
	if p.z2 == nil {
		p.Replicas[0].Download(p.T.Model.W, nil)
		return
	}
	for j, nv := range p.T.Model.W.Trainable() {
		r := p.Replicas[p.owner[j]]
		copy(nv.V.Val, r.be.ToHost(r.Params[j].master()))
	}
}

// Save copies the weights and AdamW moments to the trainer and writes a
// checkpoint (Optimizer.Save).
func (p *Parallel) Save(dir string) error {
	p.download()
	for _, r := range p.Replicas { // each holds its share of the moments
		r.DownloadMoments(p.T.Opt)
	}
	p.stale = false
	return p.T.Save(dir)
}

// Accumulate implements Learner: micro-batch i on replica i mod N.
func (p *Parallel) Accumulate(batches []Batch, opts func(i int) TrainOptions, loss LossFunc) error {
	return p.Run(len(batches), func(r *Replica, i int) error {
		be := r.Backend()
		acts := r.Forward(batches[i], opts(i))
		lp := be.ToHost(acts.LogProbs)
		d := loss(i, lp)
		if len(d) != len(lp) {
			return fmt.Errorf("micro-batch %d: %d gradients for %d log-probabilities", i, len(d), len(lp))
		}
		r.Backward(acts, be.FromHost(d, len(d)))
		return nil
	})
}

// AccumulatePolicy implements Learner: on devices with a fused kernel
// (kernels.PolicyGradienter) the loss runs there, its inputs uploaded
// without waiting and its sums read once all micro-batches are done;
// elsewhere each micro-batch's log-probabilities come back to the host.
func (p *Parallel) AccumulatePolicy(batches []Batch, opts func(i int) TrainOptions, in func(i int) PolicyInputs, loss PolicyLoss) (PolicyStats, error) {
	sums := make([]kernels.Tensor, len(p.Replicas))
	host := make([]kernels.PolicyStats, len(batches))
	for k, r := range p.Replicas {
		if _, ok := r.Backend().(kernels.PolicyGradienter); ok {
			sums[k] = r.Backend().Zeros(4)
		}
	}
	tokens := make([]int, len(batches))
	err := p.Run(len(batches), func(r *Replica, i int) error {
		be := r.Backend()
		acts := r.Forward(batches[i], opts(i))
		n := acts.LogProbs.Len()
		x := in(i)
		if err := x.check(i, n); err != nil {
			return err
		}
		tokens[i] = n
		pg, ok := be.(kernels.PolicyGradienter)
		if !ok {
			d := make([]float32, n)
			host[i] = hostPolicy(loss, d, be.ToHost(acts.LogProbs), be.ToHost(acts.Ent), x)
			r.Backward(acts, be.FromHost(d, n))
			return nil
		}
		up := func(v []float32) kernels.Tensor {
			if v == nil {
				return nil
			}
			return be.FromHost(v, n)
		}
		d := be.Zeros(n)
		pg.PolicyGradient(d, sums[slices.Index(p.Replicas, r)], acts.LogProbs, acts.Ent, up(x.Old), up(x.Ref), up(x.Adv), up(x.Weight), float32(loss.Clip), float32(loss.Beta))
		r.Backward(acts, d)
		return nil
	})
	var st PolicyStats
	if err != nil {
		return st, err
	}
	var dev [][]float64 // each replica's device sums, every rank's in rank order
	for k, r := range p.Replicas {
		if sums[k] != nil {
			v := kernels.PolicyStatsOf(r.Backend().ToHost(sums[k]))
			dev = append(dev, []float64{v.Surrogate, v.KL, v.Clipped, v.Entropy})
		}
	}
	if p.ranks != nil {
		if dev, err = p.gatherPolicyStats(host, tokens, dev); err != nil {
			return st, err
		}
	}
	for _, h := range host {
		st.add(h, 0)
	}
	for _, v := range dev {
		st.add(kernels.PolicyStats{Surrogate: v[0], KL: v[1], Clipped: v[2], Entropy: v[3]}, 0)
	}
	for _, n := range tokens {
		st.Tokens += n
	}
	return st, nil
}

// Score implements Learner. A w other than the policy (a frozen
// reference) gets replicas of its own on the same devices, made once; under
// model.offload_reference their layers stay in host memory (one copy for
// all devices), uploaded a layer at a time as the forward reaches them.
func (p *Parallel) Score(w *Weights[float32], batches []Batch, o TrainOptions) ([][]float32, error) {
	reps := p.Replicas
	if w != p.T.Model.W {
		if reps = p.frozen[w]; reps == nil {
			var host hostLayers
			if p.offloadRef {
				host = newHostLayers(w, p.base)
			}
			for _, r := range p.Replicas {
				reps = append(reps, newReplica(r.Backend(), w, p.base, host))
			}
			p.frozen[w] = reps
		}
	}
	out := make([][]float32, len(batches))
	first, stride := p.span()
	err := runOn(reps, len(batches), first, stride, func(r *Replica, i int) error {
		out[i] = r.Backend().ToHost(r.Forward(batches[i], o).LogProbs)
		return nil
	})
	if err == nil && p.ranks != nil {
		err = p.gatherScores(batches, out)
	}
	return out, err
}

// MemoryReport writes each device's memory use to the log (GPUs only).
func (p *Parallel) MemoryReport() {
	if p.log == nil {
		return
	}
	for i, r := range p.Replicas {
		if m := device.Memory(r.Backend()); m != "" {
			fmt.Fprintf(p.log, "device %d: %s\n", i, m)
		}
	}
}
