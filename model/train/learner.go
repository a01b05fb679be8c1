package train

import (
	"fmt"
	"io"

	"github.com/agemem/agemem/kernels"
	"github.com/agemem/agemem/kernels/device"
	"github.com/agemem/agemem/model/tape"
)

// Learner is where a policy's gradients are computed and its updates
// applied: the CPU autodiff tape (Tape) or device replicas (Parallel).
// SFT and GRPO are written against it.
type Learner interface {
	// Accumulate runs each micro-batch forward, hands its learned tokens'
	// log-probabilities and entropies to loss, which returns dL/dlogp, and
	// accumulates the gradient. Micro-batches may run concurrently (on
	// different devices), so loss must be safe for that.
	Accumulate(batches []Batch, opts func(i int) TrainOptions, loss LossFunc) error
	// AccumulatePolicy is Accumulate with a policy loss (GRPO's Eq. 6)
	// over each micro-batch's inputs, computed where the log-probabilities
	// are when the device can (kernels.PolicyGradienter: a GPU step then
	// reads nothing back), else on the host. It returns the loss's sums
	// over the tokens.
	AccumulatePolicy(batches []Batch, opts func(i int) TrainOptions, in func(i int) PolicyInputs, loss PolicyLoss) (PolicyStats, error)
	// Score returns each micro-batch's learned-token log-probabilities
	// under w (the policy, or a frozen reference), without gradients.
	Score(w *Weights[float32], batches []Batch, o TrainOptions) ([][]float32, error)
	// Update clips, steps and clears the gradients (Optimizer.Update).
	Update() (gradNorm, lr float64, err error)
	// Save writes a checkpoint (Optimizer.Save).
	Save(dir string) error
	// SyncHost brings the host copy of the weights (what rollout engines,
	// evaluation and export read) up to date with the last update.
	SyncHost()
}

// EvalLoss is the mean negative log-likelihood per learned token of w
// over batches, without gradients or dropout, computed where l trains (on
// its devices, not the host: a held-out set costs a GPU milliseconds).
func EvalLoss(l Learner, w *Weights[float32], batches []Batch) (float64, error) {
	lps, err := l.Score(w, batches, TrainOptions{})
	if err != nil {
		return 0, err
	}
	var sum float64
	n := 0
	for _, lp := range lps {
		for _, v := range lp {
			sum -= float64(v)
		}
		n += len(lp)
	}
	return sum / float64(max(n, 1)), nil
}

// LossFunc gets micro-batch i's log-probabilities and returns the loss's
// gradient with respect to them.
type LossFunc func(i int, lp []float32) []float32

// PolicyInputs are a micro-batch's per-token inputs to GRPO's loss, in
// its learned-token order: log π_old (nil: π_θ itself, detached, so every
// ratio is 1), log π_ref (nil: no reference, no KL term: rl.beta 0), the
// advantage and the aggregation weight.
type PolicyInputs struct{ Old, Ref, Adv, Weight []float32 }

// PolicyLoss is the objective a policy-gradient step minimises, as
// rl/grpo defines it: Host computes it on the host (dL/dlogp into dlogp,
// and its sums); devices with a fused kernel (kernels.PolicyGradienter,
// held to Host in tests) run it with Clip and Beta where the
// log-probabilities are.
type PolicyLoss struct {
	Clip, Beta float64
	Host       func(dlogp, logp []float32, in PolicyInputs) kernels.PolicyStats
}

// PolicyStats are the loss's sums over the tokens (Σ w·ℓ_clip, Σ w·kl,
// clipped tokens, Σ entropy) and the token count.
type PolicyStats struct {
	kernels.PolicyStats
	Tokens int
}

func (s *PolicyStats) add(st kernels.PolicyStats, tokens int) {
	s.Surrogate += st.Surrogate
	s.KL += st.KL
	s.Clipped += st.Clipped
	s.Entropy += st.Entropy
	s.Tokens += tokens
}

// hostPolicy runs the loss on the host for one micro-batch, the entropy
// summed beside it.
func hostPolicy(loss PolicyLoss, d, lp, ent []float32, x PolicyInputs) kernels.PolicyStats {
	st := loss.Host(d, lp, x)
	for _, e := range ent {
		st.Entropy += float64(e)
	}
	return st
}

func (in PolicyInputs) check(i, n int) error {
	if (in.Old != nil && len(in.Old) != n) || (in.Ref != nil && len(in.Ref) != n) || len(in.Adv) != n || len(in.Weight) != n {
		return fmt.Errorf("micro-batch %d: policy inputs of %d, %d, %d and %d tokens for %d log-probabilities", i, len(in.Old), len(in.Ref), len(in.Adv), len(in.Weight), n)
	}
	return nil
}

// Tape is the Learner on the CPU autodiff tape, one micro-batch at a time.
type Tape struct{ T *Optimizer }

// Accumulate implements Learner.
func (l Tape) Accumulate(batches []Batch, opts func(i int) TrainOptions, loss LossFunc) error {
	for i, b := range batches {
		tp := tape.New[float32]()
		lp := l.T.Model.W.LogProbs(tp, b, opts(i))
		d := loss(i, lp.Val)
		if len(d) != len(lp.Val) {
			return fmt.Errorf("micro-batch %d: %d gradients for %d log-probabilities", i, len(d), len(lp.Val))
		}
		tp.Backward(lp, d)
	}
	return nil
}

// AccumulatePolicy implements Learner.
func (l Tape) AccumulatePolicy(batches []Batch, opts func(i int) TrainOptions, in func(i int) PolicyInputs, loss PolicyLoss) (PolicyStats, error) {
	var st PolicyStats
	for i, b := range batches {
		tp := tape.New[float32]()
		lp, ent := l.T.Model.W.LogProbsEntropy(tp, b, opts(i))
		x := in(i)
		if err := x.check(i, len(lp.Val)); err != nil {
			return st, err
		}
		e := make([]float32, len(ent))
		for j, v := range ent {
			e[j] = float32(v)
		}
		d := make([]float32, len(lp.Val))
		st.add(hostPolicy(loss, d, lp.Val, e, x), len(d))
		tp.Backward(lp, d)
	}
	return st, nil
}

// Score implements Learner.
func (Tape) Score(w *Weights[float32], batches []Batch, o TrainOptions) ([][]float32, error) {
	out := make([][]float32, len(batches))
	for i, b := range batches {
		tp := tape.New[float32]()
		out[i] = append([]float32(nil), w.LogProbs(tp, b, o).Val...)
		tp.Release()
	}
	return out, nil
}

// Update implements Learner.
func (l Tape) Update() (float64, float64, error) { return l.T.Update() }

// Save implements Learner.
func (l Tape) Save(dir string) error { return l.T.Save(dir) }

// SyncHost implements Learner: the tape trains the host copy itself.
func (Tape) SyncHost() {}

// LearnerOptions say where training steps run.
type LearnerOptions struct {
	// Devices train data-parallel (model.devices); none: the CPU tape.
	Devices []string
	// BF16 runs GPU matmuls on tensor cores and holds the frozen base in
	// bf16 (model.train_dtype: bf16).
	BF16 bool
	// BaseQ8 is BF16 with the frozen projections held as Q8_0 blocks
	// (model.train_dtype: q8_0, BaseQ8).
	BaseQ8 bool
	// ZeroStage splits the training state across the devices
	// (model.zero_stage): 1 keeps each parameter's AdamW moments on one
	// device only, which updates it and sends it to the others; 2 also
	// sums each gradient onto that device alone as the backward produces
	// it, and under BF16 keeps the float32 master there, every device
	// computing with a bf16 working copy.
	ZeroStage int
	// OffloadReference keeps a frozen reference policy (full fine-tuning
	// at rl.beta > 0) in host memory, its layers uploaded one at a time
	// for its forward (model.offload_reference; verl's ref param offload).
	OffloadReference bool
	// Ranks, when set with a Size over 1, makes this process one rank of
	// a run across processes, training on Devices' one device (ranks.go).
	Ranks *Ranks
}

// NewLearner returns the Learner o asks for: the tape when there are no
// devices, else data-parallel replicas on them.
func NewLearner(t *Optimizer, o LearnerOptions, log io.Writer) (Learner, error) {
	if len(o.Devices) == 0 {
		return Tape{t}, nil
	}
	bes, reduce, err := device.OpenTrainers(o.Devices, o.BF16 || o.BaseQ8, log)
	if err != nil {
		return nil, err
	}
	if o.Ranks != nil && o.Ranks.Size > 1 {
		p, err := newRankLearner(t, bes, o)
		if err == nil && log != nil {
			fmt.Fprintf(log, "rank %d of %d: training on %s, gradients all-reduced through %s\n", o.Ranks.Rank, o.Ranks.Size, o.Devices[0], p.Reduce.Name())
		}
		return p, err
	}
	return NewParallel(t, bes, reduce, o, log)
}

// base is how o's replicas hold their frozen weights.
func (o LearnerOptions) base() Base {
	switch {
	case o.BaseQ8:
		return BaseQ8
	case o.BF16:
		return BaseBF16
	}
	return BaseF32
}
