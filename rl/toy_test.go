package rl_test

import (
	"context"
	"io"
	"strings"
	"testing"

	"github.com/agemem/agemem/kernels/cpu"
	"github.com/agemem/agemem/memtools"
	"github.com/agemem/agemem/memtools/stm"
	"github.com/agemem/agemem/model/safetensors"
	"github.com/agemem/agemem/rl"
	"github.com/agemem/agemem/rl/rollout"
)

// shout is a toy environment of one call: the user asks for a shout, and
// the episode's result is the reply.
type shout struct{ tasks int }

func (s shout) Len() int { return s.tasks }

func (shout) Play(ctx context.Context, pol memtools.Policy, _ int, _ uint64) (string, error) {
	c, err := pol.Complete(ctx, []stm.Message{{Role: stm.User, Content: "Shout!"}})
	return c.Text, err
}

// exclamations rewards each '!' of the reply.
type exclamations struct{}

func (exclamations) Score(_ context.Context, reply string) (rollout.Score, error) {
	n := float64(strings.Count(reply, "!"))
	return rollout.Score{Total: n, Parts: map[string]float64{"exclamations": n}}, nil
}

// TestGRPOTrainsAnyEnvironment: the same trainer that runs AgeMem trains a
// random micro policy in a toy environment it knows nothing about, and the
// mean reward rises.
func TestGRPOTrainsAnyEnvironment(t *testing.T) {
	if testing.Short() {
		t.Skip("trains for a few seconds")
	}
	c := microSetup(t)
	rc := c.RL
	rc.K, rc.BatchTasks, rc.Steps, rc.LR, rc.SaveEvery, rc.Beta = 8, 2, 12, 2e-2, 0, 0
	res, err := rl.Train(context.Background(), rl.Options[string]{Config: rc, LoRA: c.LoRA, Optim: c.Optim, Device: cpu.New(),
		Dtype: safetensors.F32, Seed: 3, ResponseBudget: 6, Env: shout{tasks: 4}, Reward: exclamations{}, Log: io.Discard})
	if err != nil {
		t.Fatal(err)
	}
	var rw []float64
	for _, s := range res.Steps {
		rw = append(rw, s.Parts["exclamations"])
	}
	first, last := (rw[0]+rw[1]+rw[2])/3, (rw[len(rw)-3]+rw[len(rw)-2]+rw[len(rw)-1])/3
	t.Logf("exclamation marks per reply by step: %.2f", rw)
	if last < first+0.5 {
		t.Fatalf("the reward did not rise: first steps %.2f, last %.2f", first, last)
	}
}
