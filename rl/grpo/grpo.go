// Package grpo is step-wise GRPO (AgeMem §3.4) as pure functions of
// rewards and per-token log-probabilities, each with its formula: group
// advantages, their broadcast to every step of a trajectory, the clipped
// surrogate, the k3 KL estimator, aggregation, and Loss, which composes
// them into the loss and its gradient with respect to the policy's token
// log-probabilities (what the autodiff tape takes from there). No model or
// rollout code here.
package grpo

import (
	"fmt"
	"math"
)

// Config holds the objective's constants.
type Config struct {
	Clip float64 // ε of the PPO clip: ratios outside [1−ε, 1+ε] stop pushing (0.2)
	Beta float64 // β, the weight of KL(π_θ ‖ π_ref) (0.1, Eq. 6)
}

// How group advantages are scaled (TRL's scale_rewards).
const (
	ScaleGroup = "group" // by the group's standard deviation, Eq. 5 (the paper)
	ScaleBatch = "batch" // by the standard deviation of every reward of the step
	ScaleNone  = "none"  // not at all: r − μ_G (Dr. GRPO)
)

// GroupAdvantages centres terminal rewards within groups of groupSize
// consecutive trajectories (the K rollouts of one task) and scales them,
// with scale ScaleGroup by Eq. 5:
//
//	A_k = (r_k − μ_G) / (σ_G + ε)
//
// with σ_G the unbiased standard deviation (n−1); with ScaleBatch σ is the
// unbiased standard deviation of all the rewards instead, so a group whose
// rewards barely differ (the same answer, contexts a few tokens apart)
// keeps small advantages rather than having that noise stretched to ±1;
// with ScaleNone A_k = r_k − μ_G. A group of one, or one whose rewards are
// all equal, carries no preference and yields zeros.
func GroupAdvantages(rewards []float64, groupSize int, eps float64, scale string) ([]float64, error) {
	if groupSize < 1 || len(rewards)%groupSize != 0 {
		return nil, fmt.Errorf("grpo: %d rewards do not split into groups of %d", len(rewards), groupSize)
	}
	if scale != ScaleGroup && scale != ScaleBatch && scale != ScaleNone {
		return nil, fmt.Errorf("grpo: reward scaling %q is not group, batch or none", scale)
	}
	adv := make([]float64, len(rewards))
	if groupSize == 1 {
		return adv, nil
	}
	_, batchStd := meanStd(rewards)
	for g := 0; g < len(rewards); g += groupSize {
		r := rewards[g : g+groupSize]
		mean, sd := meanStd(r)
		if sd == 0 {
			continue
		}
		div := 1.0
		switch scale {
		case ScaleGroup:
			div = sd + eps
		case ScaleBatch:
			div = batchStd + eps
		}
		for i, v := range r {
			adv[g+i] = (v - mean) / div
		}
	}
	return adv, nil
}

// meanStd is the mean and the unbiased (n−1) standard deviation of r.
func meanStd(r []float64) (mean, std float64) {
	for _, v := range r {
		mean += v
	}
	mean /= float64(len(r))
	var ss float64
	for _, v := range r {
		ss += (v - mean) * (v - mean)
	}
	return mean, math.Sqrt(ss / float64(len(r)-1))
}

// Varied reports, for each group of groupSize consecutive trajectories,
// whether metric differs within it (DAPO's dynamic sampling keeps only
// those groups: where every rollout of a task scored the same on what the
// run cares about, its advantages are the other parts' noise stretched to
// ±1 by Eq. 5, or zeros). Values within 1e-9 count as equal.
func Varied(metric []float64, groupSize int) ([]bool, error) {
	if groupSize < 1 || len(metric)%groupSize != 0 {
		return nil, fmt.Errorf("grpo: %d values do not split into groups of %d", len(metric), groupSize)
	}
	out := make([]bool, len(metric)/groupSize)
	for g := range out {
		r := metric[g*groupSize : (g+1)*groupSize]
		lo, hi := r[0], r[0]
		for _, v := range r {
			lo, hi = math.Min(lo, v), math.Max(hi, v)
		}
		out[g] = hi-lo > 1e-9
	}
	return out, nil
}

// Broadcast gives every step the advantage of its trajectory:
// A_t = A_T for all t of τ (step-wise GRPO's long-range credit).
// trajectoryOf[e] is the trajectory of experience e.
func Broadcast(adv []float64, trajectoryOf []int) []float64 {
	out := make([]float64, len(trajectoryOf))
	for e, k := range trajectoryOf {
		out[e] = adv[k]
	}
	return out
}

// ClippedSurrogate is PPO's per-token objective, as a loss to minimise:
//
//	ρ = exp(logp − oldLogp),  ℓ = −min(ρ·A, clip(ρ, 1−ε, 1+ε)·A)
//
// It returns ℓ, dℓ/dlogp (−ρ·A where the unclipped term is the minimum,
// else 0: the clipped term does not depend on θ) and whether the token was
// clipped.
func ClippedSurrogate(logp, oldLogp, adv, clip float64) (loss, grad float64, clipped bool) {
	rho := math.Exp(logp - oldLogp)
	unclipped := rho * adv
	c := math.Min(math.Max(rho, 1-clip), 1+clip) * adv
	if c < unclipped {
		return -c, 0, true
	}
	return -unclipped, -unclipped, false
}

// KLk3 is Schulman's k3 estimator of KL(π_θ ‖ π_ref) at a sampled token,
// unbiased and always ≥ 0:
//
//	kl = exp(refLogp − logp) − (refLogp − logp) − 1
//
// with d kl / d logp = 1 − exp(refLogp − logp).
func KLk3(logp, refLogp float64) (kl, grad float64) {
	d := refLogp - logp
	e := math.Exp(d)
	return e - d - 1, 1 - e
}

// Token is one learned token of an experience.
type Token struct {
	Seq     int     // the experience (response) it belongs to
	Logp    float64 // log π_θ
	OldLogp float64 // log π_old, from the rollout
	RefLogp float64 // log π_ref
	Adv     float64 // its trajectory's advantage
}

// Stats describe one Loss evaluation.
type Stats struct {
	Loss, Surrogate, KL float64 // aggregated with the token weights
	Clipped, Tokens     int     // tokens whose ratio was clipped, of all
}

// TokenWeights are the aggregation weights of a minibatch's tokens, given
// the response each belongs to: 1/N for "token-mean" (every learned token
// weighs the same, DAPO / verl's default), 1/(n_seq·|seqs|) for
// "seq-mean-token-mean" (each response weighs the same, the original GRPO).
// They are computed over the whole minibatch, so micro-batches of it can be
// differentiated one at a time.
func TokenWeights(aggregation string, seqOf []int) ([]float64, error) {
	w := make([]float64, len(seqOf))
	switch aggregation {
	case "token-mean", "":
		for i := range w {
			w[i] = 1 / float64(len(seqOf))
		}
	case "seq-mean-token-mean":
		count := map[int]int{}
		for _, s := range seqOf {
			count[s]++
		}
		for i, s := range seqOf {
			w[i] = 1 / float64(count[s]*len(count))
		}
	default:
		return nil, fmt.Errorf("grpo: aggregation %q is not token-mean or seq-mean-token-mean", aggregation)
	}
	return w, nil
}

// Loss composes the objective of Eq. 6 over tokens with aggregation weights
// (TokenWeights),
//
//	L = Σ_t w_t [ ℓ_clip(t) + β·kl_k3(t) ]
//
// and returns dL/dlogp for each token. Stats sum over the given tokens, so
// the Stats of a minibatch's micro-batches add up.
func Loss(c Config, toks []Token, weights []float64) (Stats, []float64) {
	var st Stats
	grad := make([]float64, len(toks))
	clipped := 0
	for i, t := range toks {
		l, g, cl := ClippedSurrogate(t.Logp, t.OldLogp, t.Adv, c.Clip)
		kl, gk := KLk3(t.Logp, t.RefLogp)
		if cl {
			clipped++
		}
		st.Surrogate += weights[i] * l
		st.KL += weights[i] * kl
		grad[i] = weights[i] * (g + c.Beta*gk)
	}
	st.Loss = st.Surrogate + c.Beta*st.KL
	st.Clipped = clipped
	st.Tokens = len(toks)
	return st, grad
}

// Accumulate is Loss over a micro-batch as a trainer holds it: float32
// log-probabilities in learned-token order, old nil for π_old = π_θ
// detached (every ratio 1), ref nil for no reference (rl.beta 0: every kl
// is 0). It writes dL/dlogp into dlogp and returns the
// sums. This is the loss training runs on the host; the CUDA kernel is
// held to it.
func (c Config) Accumulate(dlogp, logp, old, ref, adv, w []float32) Stats {
	toks := make([]Token, len(logp))
	weights := make([]float64, len(logp))
	for i, l := range logp {
		toks[i] = Token{Logp: float64(l), OldLogp: float64(l), RefLogp: float64(l), Adv: float64(adv[i])}
		if old != nil {
			toks[i].OldLogp = float64(old[i])
		}
		if ref != nil {
			toks[i].RefLogp = float64(ref[i])
		}
		weights[i] = float64(w[i])
	}
	st, grad := Loss(c, toks, weights)
	for i, g := range grad {
		dlogp[i] = float32(g)
	}
	return st
}
