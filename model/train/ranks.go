package train

import (
	"fmt"

	"github.com/agemem/agemem/kernels"
)

// Ranks is data parallelism across processes (torchrun's ranks): this
// process trains one replica, rank Rank of Size, on its one device; Reduce
// sums the gradients across the processes (a TCP ring, NCCL) and Exchange
// all-gathers a few float64s per rank, exactly (the loss's sums, for the
// step's metrics). Micro-batch i runs on rank i mod Size, as it runs on
// replica i mod N in one process, so a run over Size ranks is the run of
// one process over Size devices.
type Ranks struct {
	Rank, Size int
	Reduce     kernels.Reducer
	// ReduceFor, when Reduce is nil, makes the reducer for the rank's
	// device once it is open (NCCL needs the GPU's backend).
	ReduceFor func(kernels.TrainBackend) (kernels.Reducer, error)
	// Exchange returns every rank's values, rank order; key is the same on
	// every rank for one call.
	Exchange func(key string, mine []float64) ([][]float64, error)
}

// newRankLearner is the Parallel of one rank of o.Ranks.
func newRankLearner(t *Optimizer, bes []kernels.TrainBackend, o LearnerOptions) (*Parallel, error) {
	r := o.Ranks
	switch {
	case len(bes) != 1:
		return nil, fmt.Errorf("rank %d: %d devices: a rank of a run across processes trains on one (model.devices names it, or the launcher's LOCAL_RANK picks it)", r.Rank, len(bes))
	case o.ZeroStage > 0:
		return nil, fmt.Errorf("model.zero_stage %d: ZeRO shards state between one process's devices; a run across processes holds a whole replica per rank (zero_stage 0)", o.ZeroStage)
	case (r.Reduce == nil && r.ReduceFor == nil) || r.Exchange == nil:
		return nil, fmt.Errorf("rank %d: no reducer or exchange between the ranks", r.Rank)
	}
	if r.Reduce == nil {
		red, err := r.ReduceFor(bes[0])
		if err != nil {
			return nil, fmt.Errorf("rank %d: %w", r.Rank, err)
		}
		rr := *r
		rr.Reduce = red
		r = &rr
	}
	p, err := NewParallel(t, bes, r.Reduce, LearnerOptions{BF16: o.BF16, BaseQ8: o.BaseQ8, OffloadReference: o.OffloadReference}, nil)
	if err != nil {
		return nil, err
	}
	p.ranks = r
	return p, nil
}

// span is which micro-batches this process's replicas run: replica k runs
// i = first+k, first+k+stride, ….
func (p *Parallel) span() (first, stride int) {
	if p.ranks == nil {
		return 0, len(p.Replicas)
	}
	return p.ranks.Rank * len(p.Replicas), p.ranks.Size * len(p.Replicas)
}

// rankOf is the rank that runs micro-batch i.
func (p *Parallel) rankOf(i int) int {
	if p.ranks == nil {
		return 0
	}
	return i % p.ranks.Size
}

// exchange all-gathers mine across the ranks under a key unique to this
// call (every rank makes the same calls in the same order).
func (p *Parallel) exchange(what string, mine []float64) ([][]float64, error) {
	p.exchanges++
	out, err := p.ranks.Exchange(fmt.Sprintf("%s/%d", what, p.exchanges), mine)
	if err != nil {
		return nil, fmt.Errorf("rank %d: exchanging %s: %w", p.ranks.Rank, what, err)
	}
	if len(out) != p.ranks.Size {
		return nil, fmt.Errorf("rank %d: exchanging %s: %d ranks answered, want %d", p.ranks.Rank, what, len(out), p.ranks.Size)
	}
	return out, nil
}

// gatherScores fills every rank's micro-batches' outputs into out (each
// rank computed its own): an all-reduce of a buffer where each rank wrote
// its batches and zeros elsewhere, which is exact (x + 0 = x).
func (p *Parallel) gatherScores(batches []Batch, out [][]float32) error {
	total := 0
	for _, b := range batches {
		total += len(b.LossRows)
	}
	flat := make([]float32, total)
	at := 0
	for i, b := range batches {
		if p.rankOf(i) == p.ranks.Rank {
			if len(out[i]) != len(b.LossRows) {
				return fmt.Errorf("micro-batch %d: %d log-probabilities for %d learned rows", i, len(out[i]), len(b.LossRows))
			}
			copy(flat[at:], out[i])
		}
		at += len(b.LossRows)
	}
	if total > 0 {
		be := p.Replicas[0].Backend()
		t := be.FromHost(flat, total)
		if err := p.Reduce.AllReduce([]kernels.TrainBackend{be}, [][]kernels.Tensor{{t}}); err != nil {
			return fmt.Errorf("rank %d: gathering scores: %w", p.ranks.Rank, err)
		}
		flat = be.ToHost(t)
	}
	at = 0
	for i, b := range batches {
		out[i] = flat[at : at+len(b.LossRows)]
		at += len(b.LossRows)
	}
	return nil
}

// gatherPolicyStats makes every rank's view of a step's loss sums whole:
// host[i] and tokens[i] from the rank that ran micro-batch i, and each
// rank's device sums in rank order, so the figures are those of one
// process with a replica per rank.
func (p *Parallel) gatherPolicyStats(host []kernels.PolicyStats, tokens []int, sums [][]float64) ([][]float64, error) {
	const w = 5
	mine := make([]float64, 0, w*len(host)+4*len(sums))
	for i := range host {
		h := host[i]
		mine = append(mine, h.Surrogate, h.KL, h.Clipped, h.Entropy, float64(tokens[i]))
	}
	for _, s := range sums {
		mine = append(mine, s...)
	}
	all, err := p.exchange("policy-stats", mine)
	if err != nil {
		return nil, err
	}
	for i := range host {
		v := all[p.rankOf(i)]
		if len(v) != len(mine) {
			return nil, fmt.Errorf("rank %d: rank %d sent %d loss sums, want %d", p.ranks.Rank, p.rankOf(i), len(v), len(mine))
		}
		host[i] = kernels.PolicyStats{Surrogate: v[w*i], KL: v[w*i+1], Clipped: v[w*i+2], Entropy: v[w*i+3]}
		tokens[i] = int(v[w*i+4])
	}
	var out [][]float64
	for _, v := range all {
		rest := v[w*len(host):]
		for len(rest) >= 4 {
			out = append(out, rest[:4])
			rest = rest[4:]
		}
	}
	return out, nil
}
