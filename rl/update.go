package rl

import (
	"math/rand/v2"

	"github.com/agemem/agemem/kernels"
	"github.com/agemem/agemem/model/qwen"
	"github.com/agemem/agemem/model/train"
	"github.com/agemem/agemem/rl/grpo"
	"github.com/agemem/agemem/rl/rollout"
)

// hostLoss is the policy loss training runs: rl/grpo's Eq. 6.
func hostLoss(rc Config) train.PolicyLoss {
	c := grpo.Config{Clip: rc.Clip, Beta: rc.Beta}
	return train.PolicyLoss{Clip: rc.Clip, Beta: rc.Beta, Host: func(d, lp []float32, x train.PolicyInputs) kernels.PolicyStats {
		st := c.Accumulate(d, lp, x.Old, x.Ref, x.Adv, x.Weight)
		return kernels.PolicyStats{Surrogate: st.Surrogate, KL: st.KL, Clipped: float64(st.Clipped)}
	}}
}

// rolloutEngines are the models rollouts decode with: on every training
// GPU at once, each over that replica's own weights (Replica.Engine: the
// base is shared with the trainer, not copied, and is always current);
// without GPUs one engine on be from the host weights w.
func rolloutEngines(be kernels.Backend, l train.Learner, w *train.Weights[float32]) ([]*qwen.Model, error) {
	if par, ok := l.(*train.Parallel); ok {
		var ms []*qwen.Model
		for _, r := range par.Replicas {
			if r.Backend().Name() == "cuda" {
				ms = append(ms, r.Engine())
			}
		}
		if len(ms) > 0 {
			return ms, nil
		}
	}
	m, err := w.Engine(be)
	if err != nil {
		return nil, err
	}
	return []*qwen.Model{m}, nil
}

// update runs rl.epochs passes over the step's experiences in
// rl.minibatches optimiser steps each.
func update(tr *train.Optimizer, l train.Learner, ref *train.Policy, exps []rollout.Experience, adv []float64, rc Config, obj train.PolicyLoss, st *StepStats) error {
	if len(exps) == 0 {
		return nil
	}
	w := tr.Model.W
	chs := chains(exps)
	seqs := make([]train.Sequence, len(chs))
	for i, c := range chs {
		seqs[i] = c.seq
	}
	// π_old, the policy that sampled, recomputed by the training forward so
	// the first ratio is exactly 1 (with one epoch of one minibatch it is
	// the current log-probability itself, detached); π_ref per token.
	var old [][]float64
	var err error
	if rc.Epochs*rc.Minibatches > 1 {
		if old, err = score(l, w, seqs, rc.BatchTokens, train.TrainOptions{Temperature: rc.Temperature}); err != nil {
			return err
		}
	}
	var refLp [][]float64
	if ref != nil {
		if refLp, err = score(l, ref.W, seqs, rc.BatchTokens, train.TrainOptions{NoAdapter: true, Temperature: rc.Temperature}); err != nil {
			return err
		}
	}
	rng := rand.New(rand.NewPCG(uint64(tr.Step), 0x67727077))
	var kl, loss, ent float64
	var clipped, tokens, updates int
	for range rc.Epochs {
		order := rng.Perm(len(chs))
		per := (len(order) + rc.Minibatches - 1) / rc.Minibatches
		for lo := 0; lo < len(order); lo += per {
			mb := order[lo:min(lo+per, len(order))]
			groups := microBatches(mb, seqs, rc.BatchTokens)
			var seqOf []int // the experience of every learned token, in micro-batch order
			offs := make([]int, len(groups))
			batches := make([]train.Batch, len(groups))
			for gi, g := range groups {
				offs[gi] = len(seqOf)
				var sub []train.Sequence
				for _, c := range g {
					sub = append(sub, seqs[c])
					for _, t := range chs[c].tokens {
						seqOf = append(seqOf, t.exp)
					}
				}
				batches[gi] = train.Pack(sub)
			}
			weights, err := grpo.TokenWeights(rc.Aggregation, seqOf)
			if err != nil {
				return err
			}
			ps, err := l.AccumulatePolicy(batches, func(gi int) train.TrainOptions {
				return train.TrainOptions{Recompute: rc.Recompute, Dropout: true, Seed: uint64(tr.Step)<<16 ^ uint64(offs[gi]), Temperature: rc.Temperature}
			}, func(gi int) train.PolicyInputs {
				group, b := groups[gi], batches[gi]
				n := len(b.Seq)
				x := train.PolicyInputs{Adv: make([]float32, n), Weight: make([]float32, n)}
				if old != nil {
					x.Old = make([]float32, n)
				}
				if refLp != nil {
					x.Ref = make([]float32, n)
				}
				pos := map[int]int{}
				for k, s := range b.Seq {
					c := group[s]
					j := pos[c]
					pos[c]++
					x.Adv[k] = float32(adv[chs[c].tokens[j].exp])
					if refLp != nil {
						x.Ref[k] = float32(refLp[c][j])
					}
					x.Weight[k] = float32(weights[offs[gi]+k])
					if old != nil {
						x.Old[k] = float32(old[c][j])
					}
				}
				return x
			}, obj)
			if err != nil {
				return err
			}
			loss += ps.Surrogate + rc.Beta*ps.KL
			kl += ps.KL
			clipped += int(ps.Clipped)
			tokens += ps.Tokens
			ent += ps.Entropy
			norm, _, err := l.Update()
			if err != nil {
				return err
			}
			st.GradNorm = norm
			updates++
		}
	}
	st.Loss = loss / float64(updates)
	st.KL = kl / float64(updates)
	st.ClipFrac = float64(clipped) / float64(max(tokens, 1))
	st.Entropy = ent / float64(max(tokens, 1))
	return nil
}

// chain is one training sequence holding consecutive policy calls of a
// rollout: while the context only grows, call j+1's prompt begins with call
// j's prompt and response, so one sequence carries them all and each
// response is learned where it stands. Filter, Summary and the Stage 2
// reset rewrite the context and start a new chain. The loss is the same as
// training each call on its own sequence, for a fraction of the tokens.
type chain struct {
	seq    train.Sequence
	tokens []chainToken // the learned tokens, in order
}

type chainToken struct{ exp, pos int }

func chains(exps []rollout.Experience) []chain {
	var out []chain
	last := map[int]int{} // rollout -> index of its open chain
	for i, e := range exps {
		full := append(append([]int(nil), e.PromptIDs...), e.ResponseIDs...)
		if ci, ok := last[e.Rollout]; ok && hasPrefix(e.PromptIDs, out[ci].seq.IDs) {
			c := &out[ci]
			n := len(c.seq.IDs)
			c.seq.IDs = append(c.seq.IDs, full[n:]...)
			for j := n; j < len(full); j++ {
				c.seq.Loss = append(c.seq.Loss, j >= len(e.PromptIDs))
			}
			for j := range e.ResponseIDs {
				c.tokens = append(c.tokens, chainToken{i, j})
			}
			continue
		}
		c := chain{seq: train.Sequence{IDs: full, Loss: make([]bool, len(full))}}
		for j := len(e.PromptIDs); j < len(full); j++ {
			c.seq.Loss[j] = true
			c.tokens = append(c.tokens, chainToken{i, j - len(e.PromptIDs)})
		}
		last[e.Rollout] = len(out)
		out = append(out, c)
	}
	return out
}

func hasPrefix(s, prefix []int) bool {
	if len(prefix) > len(s) {
		return false
	}
	for i, v := range prefix {
		if s[i] != v {
			return false
		}
	}
	return true
}

// microBatches groups sequence indices into packs of at most batchTokens.
func microBatches(idx []int, seqs []train.Sequence, batchTokens int) [][]int {
	var out [][]int
	var cur []int
	size := 0
	for _, i := range idx {
		n := len(seqs[i].IDs)
		if len(cur) > 0 && size+n > batchTokens {
			out = append(out, cur)
			cur, size = nil, 0
		}
		cur = append(cur, i)
		size += n
	}
	if len(cur) > 0 {
		out = append(out, cur)
	}
	return out
}

// score returns each sequence's learned-token log-probabilities under w,
// without gradients.
func score(l train.Learner, w *train.Weights[float32], seqs []train.Sequence, batchTokens int, o train.TrainOptions) ([][]float64, error) {
	idx := make([]int, len(seqs))
	for i := range idx {
		idx[i] = i
	}
	groups := microBatches(idx, seqs, batchTokens)
	batches := make([]train.Batch, len(groups))
	for gi, group := range groups {
		var sub []train.Sequence
		for _, i := range group {
			sub = append(sub, seqs[i])
		}
		batches[gi] = train.Pack(sub)
	}
	lps, err := l.Score(w, batches, o)
	if err != nil {
		return nil, err
	}
	out := make([][]float64, len(seqs))
	for gi, group := range groups {
		for k, s := range batches[gi].Seq {
			out[group[s]] = append(out[group[s]], float64(lps[gi][k]))
		}
	}
	return out, nil
}

// tasksFor picks step's n tasks of the environment's total: a seeded
// shuffle of the task list, walked in order and reshuffled each pass, so
// a resumed run sees the same tasks.
func tasksFor(total, step, n int, seed uint64) []int {
	per := total / n
	epoch, at := step/per, (step%per)*n
	order := rand.New(rand.NewPCG(seed, uint64(epoch))).Perm(total)
	return order[at : at+n]
}
