package rl

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/agemem/agemem/model/lora"
	"github.com/agemem/agemem/model/optim"
	"github.com/agemem/agemem/model/qwen"
	"github.com/agemem/agemem/model/safetensors"
	"github.com/agemem/agemem/model/train"
	"github.com/agemem/agemem/rl/rollout"
)

// TestUpdateMovesLogProbsWithTheAdvantage: after GRPO updates on fixed
// experiences, responses with a positive advantage became more likely and
// those with a negative one less likely, for full fine-tuning and LoRA,
// with both aggregations, several minibatches and micro-batches, and with
// LoRA over a base held as Q8_0 blocks (model.train_dtype: q8_0).
func TestUpdateMovesLogProbsWithTheAdvantage(t *testing.T) {
	dir := t.TempDir()
	if err := qwen.InitRandom(dir, qwen.Presets["tiny-qwen3"], safetensors.F32, 2); err != nil {
		t.Fatal(err)
	}
	r := rand.New(rand.NewPCG(1, 1))
	prompt := []int{1, 2, 3, 4, 5, 6}
	var exps []rollout.Experience
	for i := range 8 {
		resp := make([]int, 3+i%3)
		for j := range resp {
			resp[j] = 10 + r.IntN(400)
		}
		exps = append(exps, rollout.Experience{Rollout: i, PromptIDs: append(prompt, 7+i), ResponseIDs: resp})
	}
	adv := []float64{1, -1, 1, -1, 1, -1, 1, -1}
	for _, c := range []struct {
		name       string
		lora       bool
		agg        string
		mb, epochs int
		devices    []string
		q8         bool
	}{{"full, token-mean, one epoch of one minibatch", false, "token-mean", 1, 1, nil, false},
		{"lora, seq-mean, 2 epochs of 2 minibatches", true, "seq-mean-token-mean", 2, 2, nil, false},
		{"full, 2 simulated devices, 2 minibatches", false, "token-mean", 2, 1, []string{"cpu", "cpu"}, false},
		{"lora, 3 simulated devices", true, "token-mean", 1, 1, []string{"cpu", "cpu", "cpu"}, false},
		{"lora, 2 simulated devices, Q8_0 base", true, "token-mean", 1, 1, []string{"cpu", "cpu"}, true}} {
		t.Run(c.name, func(t *testing.T) {
			l := lora.DefaultOptions(qwen.LoRATargets)
			l.Enabled = c.lora
			p, err := train.Open(dir, l, 1)
			if err != nil {
				t.Fatal(err)
			}
			ref := p // under LoRA the reference is the base without the adapter
			if !c.lora {
				if ref, err = train.Open(dir, lora.Options{}, 0); err != nil {
					t.Fatal(err)
				}
			}
			rc := DefaultConfig()
			rc.Aggregation, rc.Minibatches, rc.Epochs, rc.BatchTokens = c.agg, c.mb, c.epochs, 24
			lr := 1e-3
			if c.lora {
				lr = 1e-2
			}
			tr := train.NewOptimizer(p, optim.DefaultConfig(), lr, optim.Schedule{}, 1, "")
			var seqs []train.Sequence
			for _, c := range chains(exps) {
				seqs = append(seqs, c.seq)
			}
			learner, err := train.NewLearner(tr, train.LearnerOptions{Devices: c.devices, BaseQ8: c.q8}, nil)
			if err != nil {
				t.Fatal(err)
			}
			before := mustScore(t, p.W, seqs)
			var st StepStats
			for range 3 {
				if err := update(tr, learner, ref, exps, adv, rc, hostLoss(rc), &st); err != nil {
					t.Fatal(err)
				}
			}
			learner.SyncHost()
			after := mustScore(t, p.W, seqs)
			for i := range exps {
				var d float64
				for j := range before[i] {
					d += after[i][j] - before[i][j]
				}
				if d*adv[i] <= 0 {
					t.Fatalf("experience %d (advantage %+g): log-probability moved by %+g", i, adv[i], d)
				}
			}
			if st.KL <= 0 || st.Entropy <= 0 || tr.Step != 3*c.epochs*c.mb {
				t.Fatalf("stats %+v after %d optimiser steps", st, tr.Step)
			}
		})
	}
}

// TestUpdateWithoutReference: at rl.beta 0 the update holds and scores no
// reference policy, and takes the very step it takes with one (β·kl is 0
// either way), on the tape and over simulated devices; the KL it logs is 0.
func TestUpdateWithoutReference(t *testing.T) {
	dir, other := t.TempDir(), t.TempDir() // the reference differs from the policy, so its KL is not 0
	for i, d := range []string{dir, other} {
		if err := qwen.InitRandom(d, qwen.Presets["tiny-qwen3"], safetensors.F32, uint64(3+i)); err != nil {
			t.Fatal(err)
		}
	}
	exps := []rollout.Experience{{Rollout: 0, PromptIDs: []int{1, 2, 3}, ResponseIDs: []int{40, 41, 42}},
		{Rollout: 1, PromptIDs: []int{1, 2, 4}, ResponseIDs: []int{50, 51}}}
	adv := []float64{1, -1}
	rc := DefaultConfig()
	rc.Beta = 0
	for _, devices := range [][]string{nil, {"cpu", "cpu"}} {
		step := func(withRef bool) (*train.Weights[float32], StepStats) {
			p, err := train.Open(dir, lora.Options{}, 1)
			if err != nil {
				t.Fatal(err)
			}
			var ref *train.Policy
			if withRef {
				if ref, err = train.Open(other, lora.Options{}, 0); err != nil {
					t.Fatal(err)
				}
			}
			tr := train.NewOptimizer(p, optim.DefaultConfig(), 1e-3, optim.Schedule{}, 1, "")
			learner, err := train.NewLearner(tr, train.LearnerOptions{Devices: devices}, nil)
			if err != nil {
				t.Fatal(err)
			}
			var st StepStats
			if err := update(tr, learner, ref, exps, adv, rc, hostLoss(rc), &st); err != nil {
				t.Fatal(err)
			}
			learner.SyncHost()
			return p.W, st
		}
		with, stWith := step(true)
		without, st := step(false)
		if st.KL != 0 || stWith.KL <= 0 {
			t.Fatalf("devices %v: KL %v without a reference, %v with one", devices, st.KL, stWith.KL)
		}
		start, err := train.Open(dir, lora.Options{}, 1)
		if err != nil {
			t.Fatal(err)
		}
		moved := false
		for i, nv := range without.Named {
			a, b := nv.V.Val, with.Named[i].V.Val
			for j := range a {
				if a[j] != b[j] {
					t.Fatalf("devices %v, %s[%d]: %v without a reference, %v with one", devices, nv.Name, j, a[j], b[j])
				}
				moved = moved || a[j] != start.W.Named[i].V.Val[j]
			}
		}
		if !moved {
			t.Fatalf("devices %v: the update moved nothing", devices)
		}
	}
}

func TestTasksForIsASeededWalk(t *testing.T) {
	seen := map[int]bool{}
	for step := range 5 { // one pass: 5 steps of 2 of 10 tasks
		for _, tk := range tasksFor(10, step, 2, 7) {
			if seen[tk] {
				t.Fatalf("task %d twice within a pass", tk)
			}
			seen[tk] = true
		}
	}
	a, b := tasksFor(10, 6, 2, 7), tasksFor(10, 6, 2, 7)
	if a[0] != b[0] || a[1] != b[1] {
		t.Fatal("the same step picked different tasks")
	}
}

// TestChainsScoreLikeSeparateCalls: consecutive calls of a rollout whose
// context only grew share one sequence, and every response token gets the
// log-probability it has in its own call's sequence.
func TestChainsScoreLikeSeparateCalls(t *testing.T) {
	dir := t.TempDir()
	if err := qwen.InitRandom(dir, qwen.Presets["tiny-qwen2"], safetensors.F32, 3); err != nil {
		t.Fatal(err)
	}
	p, err := train.Open(dir, lora.Options{}, 0)
	if err != nil {
		t.Fatal(err)
	}
	e1 := rollout.Experience{Rollout: 0, PromptIDs: []int{1, 2, 3}, ResponseIDs: []int{40, 41}}
	e2 := rollout.Experience{Rollout: 0, PromptIDs: []int{1, 2, 3, 40, 41, 9, 9}, ResponseIDs: []int{42}}
	e3 := rollout.Experience{Rollout: 1, PromptIDs: []int{1, 2, 3}, ResponseIDs: []int{43, 44}}        // another rollout
	e4 := rollout.Experience{Rollout: 0, PromptIDs: []int{1, 2, 3, 9}, ResponseIDs: []int{45, 46, 47}} // context rewritten
	e5 := rollout.Experience{Rollout: 0, PromptIDs: []int{1, 2, 3, 9, 45, 46, 47, 8}, ResponseIDs: []int{48}}
	exps := []rollout.Experience{e1, e2, e3, e4, e5}
	chs := chains(exps)
	if len(chs) != 3 {
		t.Fatalf("%d chains, want 3 (e1+e2, e3, e4+e5)", len(chs))
	}
	var seqs []train.Sequence
	for _, c := range chs {
		seqs = append(seqs, c.seq)
	}
	merged := mustScore(t, p.W, seqs)
	for ci, c := range chs {
		for n, tk := range c.tokens {
			alone := chains(exps[tk.exp : tk.exp+1])
			want := mustScore(t, p.W, []train.Sequence{alone[0].seq})[0][tk.pos]
			if d := merged[ci][n] - want; d > 1e-5 || d < -1e-5 {
				t.Fatalf("experience %d token %d: %g in the chain, %g alone", tk.exp, tk.pos, merged[ci][n], want)
			}
		}
	}
}

// mustScore scores on the tape (the host weights, which device training
// keeps in step).
func mustScore(t *testing.T, w *train.Weights[float32], seqs []train.Sequence) [][]float64 {
	t.Helper()
	out, err := score(train.Tape{}, w, seqs, 1<<20, train.TrainOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// TestCallShapingReachesOnlyItsCall: a call's shaping (Score.Calls) is
// added to that call's advantage alone, after the group's normalisation,
// which it does not enter. Hand-worked with rl.scale_rewards none (the
// reward less its group's mean): rewards 1 and 3 give -1 and +1, and a
// shaping of -0.5 on rollout 0's second call and 2 on rollout 2's third
// leaves every other call at its rollout's advantage.
func TestCallShapingReachesOnlyItsCall(t *testing.T) {
	pl := &played{
		rewards: []float64{1, 3, 5, 5},
		calls:   [][]float64{{0, -0.5}, nil, {0, 0, 2}, {}},
		exps: []rollout.Experience{{Rollout: 0, Call: 0}, {Rollout: 0, Call: 1}, {Rollout: 1, Call: 0},
			{Rollout: 2, Call: 0}, {Rollout: 2, Call: 1}, {Rollout: 2, Call: 2}, {Rollout: 3, Call: 0}, {Rollout: 3, Call: 1}},
	}
	rc := DefaultConfig()
	rc.K, rc.ScaleRewards = 2, "none"
	got, err := pl.advantages(rc)
	if err != nil {
		t.Fatal(err)
	}
	// Group 0 (rewards 1, 3): -1 and +1; group 1 (5, 5): 0 and 0.
	want := []float64{-1, -1.5, 1, 0, 0, 2, 0, 0}
	for i := range want {
		if math.Abs(got[i]-want[i]) > 1e-12 {
			t.Fatalf("advantages %v, want %v", got, want)
		}
	}
}
