package rl_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/agemem/agemem/env"
	"github.com/agemem/agemem/memtools"
	"github.com/agemem/agemem/memtools/stm"
	"github.com/agemem/agemem/model/sft"
	"github.com/agemem/agemem/roles"
)

// coin is a scripted policy for SFT data: it acknowledges Stage 1 facts
// and, for the question, answers in the AgeMem format half of the time
// and breaks the format (no <answer>) the other half.
type coin struct{ r *rand.Rand }

func (c coin) Complete(_ context.Context, msgs []stm.Message) (memtools.Completion, error) {
	last := msgs[len(msgs)-1].Content
	switch {
	case !strings.HasPrefix(last, "Question:"):
		return memtools.Completion{Text: "<think>Noted.</think>\n<answer>Noted.</answer>"}, nil
	case c.r.IntN(2) == 0:
		return memtools.Completion{Text: "<think>I can answer.</think>\n<answer>yes</answer>"}, nil
	}
	return memtools.Completion{Text: "I am not sure."}, nil
}

// TestGRPORaisesTheMeanReward is the CI-sized integration test: a micro
// policy fine-tuned to answer the question in the AgeMem format only half
// the time (the rest breaks the format, which costs P_no-answer and
// P_rounds) is trained with step-wise GRPO through Run on real three-stage
// rollouts, and on a fixed seed the mean reward of the last steps is well
// above that of the first.
func TestGRPORaisesTheMeanReward(t *testing.T) {
	if testing.Short() {
		t.Skip("trains for about 20 s")
	}
	c := microSetup(t)
	c.Agent.MaxSteps, c.Agent.ResponseBudget = 1, 24
	c.Episode.Stage1MaxTurns, c.Episode.Stage2MaxTurns = 1, 0
	// SFT data from the scripted coin on the same tasks.
	var tasks []env.Task
	if err := env.StreamHotpotFile(c.Data.Train, func(tk env.Task) error { tasks = append(tasks, tk); return nil }); err != nil {
		t.Fatal(err)
	}
	data := filepath.Join(t.TempDir(), "sft.jsonl")
	var buf bytes.Buffer
	r := rand.New(rand.NewPCG(1, 2))
	for rep := range 8 {
		for i, tk := range tasks {
			res, err := env.RunEpisode(context.Background(), coin{r}, roles.Runtime(c, roles.Helpers{}, nil)(uint64(rep*100+i)), tk, c.EpisodeConfig())
			if err != nil {
				t.Fatal(err)
			}
			for _, rec := range env.SFTRecords(res) {
				raw, _ := json.Marshal(map[string]any{"messages": rec.Messages})
				buf.Write(append(raw, '\n'))
			}
		}
	}
	os.WriteFile(data, buf.Bytes(), 0o644)
	c.Model.Path = c.RL.Init
	c.SFT.Data, c.SFT.Out = data, filepath.Join(t.TempDir(), "sft")
	c.SFT.Steps, c.SFT.BatchTokens, c.SFT.EvalFraction, c.SFT.EvalEvery, c.SFT.SaveEvery = 60, 2048, 0.1, 0, 0
	so := roles.SFT(c)
	so.Log = io.Discard
	sres, err := sft.Run(context.Background(), so)
	if err != nil {
		t.Fatal(err)
	}
	c.RL.Init = sres.Policy
	c.RL.K, c.RL.BatchTasks, c.RL.Steps, c.RL.LR, c.RL.SaveEvery = 8, 3, 8, 3e-3, 0
	res, err := run(c, "")
	if err != nil {
		t.Fatal(err)
	}
	var rw []float64
	for _, s := range res.Steps {
		rw = append(rw, s.Reward)
	}
	first, last := (rw[0]+rw[1])/2, (rw[len(rw)-2]+rw[len(rw)-1])/2
	t.Logf("mean reward per step: %.3f", rw)
	if last < first+0.1 {
		t.Fatalf("mean reward did not rise: first two steps %.3f, last two %.3f (%v)", first, last, rw)
	}
}
