package rl_test

import (
	"context"
	"io"
	"path/filepath"
	"strings"
	"testing"

	"github.com/agemem/agemem/kernels/cpu"
	"github.com/agemem/agemem/llm"
	"github.com/agemem/agemem/memtools/stm"
	"github.com/agemem/agemem/model/chat"
	"github.com/agemem/agemem/model/safetensors"
	"github.com/agemem/agemem/rl"
	"github.com/agemem/agemem/rl/rollout"
)

// shout is a toy environment of one call: the user asks for a shout, and
// the episode's result is the reply.
type shout struct{ tasks int }

func (s shout) Len() int { return s.tasks }

func (shout) Play(ctx context.Context, pol llm.Model, _ int, _ uint64) (string, error) {
	c, err := pol.Chat(ctx, llm.Request{Messages: []chat.Message{{Role: stm.User, Content: "Shout!"}}})
	return c.Message.Content, err
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

// gated is shout with the task in the result: on even tasks every reply
// scores the same "length", on odd ones the reply's length.
type gated struct{ tasks int }

type gatedReply struct {
	task  int
	reply string
}

func (g gated) Len() int { return g.tasks }

func (gated) Play(ctx context.Context, pol llm.Model, task int, _ uint64) (gatedReply, error) {
	c, err := pol.Chat(ctx, llm.Request{Messages: []chat.Message{{Role: stm.User, Content: "Shout!"}}})
	return gatedReply{task, c.Message.Content}, err
}

type gatedReward struct{}

func (gatedReward) Score(_ context.Context, r gatedReply) (rollout.Score, error) {
	n := 0.0
	if r.task%2 == 1 {
		n = float64(len(r.reply))
	}
	return rollout.Score{Total: 1 + n, Parts: map[string]float64{"length": n}, Info: map[string]any{"task": r.task}}, nil
}

// TestFilterGroupsKeepsOnlyGroupsThatVary: with rl.filter_groups a task
// whose rollouts all score the same on the named part never reaches the
// update, and more rounds are played until rl.batch_tasks groups vary.
func TestFilterGroupsKeepsOnlyGroupsThatVary(t *testing.T) {
	c := microSetup(t)
	rc := c.RL
	rc.K, rc.BatchTasks, rc.Steps, rc.SaveEvery, rc.Beta = 4, 2, 2, 0, 0
	rc.FilterGroups, rc.MaxRounds = "length", 4
	rc.Out = t.TempDir()
	o := rl.Options[gatedReply]{Config: rc, LoRA: c.LoRA, Optim: c.Optim, Device: cpu.New(),
		Dtype: safetensors.F32, Seed: 5, ResponseBudget: 6, Env: gated{tasks: 16}, Reward: gatedReward{}, Log: io.Discard}
	if _, err := rl.Train(context.Background(), o); err != nil {
		t.Fatal(err)
	}
	keptBy := map[[2]float64]bool{} // (step, round·1000+group) → kept
	for _, r := range records(t, filepath.Join(rc.Out, "rollouts.jsonl")) {
		odd := int(r["task"].(float64))%2 == 1
		k := r["kept"].(bool)
		if k && !odd {
			t.Fatalf("a group whose length never varies was kept: %v", r)
		}
		keptBy[[2]float64{r["step"].(float64), r["round"].(float64)*1000 + r["group"].(float64)}] = k
	}
	kept := map[float64]int{}
	for key, k := range keptBy {
		if k {
			kept[key[0]]++
		}
	}
	for i, m := range records(t, filepath.Join(rc.Out, "metrics.jsonl")) {
		step := float64(i + 1)
		if m["groups_kept"].(float64) != 2 || kept[step] != 2 {
			t.Fatalf("step %v kept %v groups (%d in rollouts.jsonl), want 2 of %v played", step, m["groups_kept"], kept[step], m["groups_played"])
		}
		// One call a rollout: the update saw the kept groups' calls alone.
		if m["experiences"].(float64) != 2*4 {
			t.Fatalf("step %v learned from %v calls, want 8", step, m["experiences"])
		}
	}

	o.Config.FilterGroups = "loudness"
	o.Config.Out = t.TempDir()
	if _, err := rl.Train(context.Background(), o); err == nil || !strings.Contains(err.Error(), `rl.filter_groups: the reward has no part "loudness" (it has reward, length)`) {
		t.Fatalf("an unknown part: %v", err)
	}
}
