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
	"github.com/agemem/agemem/eval"
	"github.com/agemem/agemem/llm"
	"github.com/agemem/agemem/model/qwen"
	"github.com/agemem/agemem/model/safetensors"
	"github.com/agemem/agemem/model/sft"
	"github.com/agemem/agemem/setup"
)

// coin is a scripted policy for SFT data: it acknowledges Stage 1 facts
// and, for the question, answers "yes" in the AgeMem format with
// probability p and breaks the format (no <answer>) otherwise.
type coin struct {
	r *rand.Rand
	p float64
}

func (c coin) Chat(_ context.Context, req llm.Request) (llm.Response, error) {
	last := req.Messages[len(req.Messages)-1].Content
	switch {
	case !strings.HasPrefix(last, "Question:"):
		return llm.Reply("<think>Noted.</think>\n<answer>Noted.</answer>"), nil
	case c.r.Float64() < c.p:
		return llm.Reply("<think>I can answer.</think>\n<answer>yes</answer>"), nil
	}
	return llm.Reply("I am not sure."), nil
}

// TestGRPORaisesTheMeanReward is the CI-sized integration test: a micro
// policy fine-tuned to answer the question in the AgeMem format only half
// the time (the rest breaks the format, which costs P_no-answer and
// P_rounds) is trained with step-wise GRPO through Run on real three-stage
// rollouts, and on a fixed seed the mean reward of the last steps is well
// above that of the first. (The seed is 3 since each call draws from its
// own seed, rl/rollout.CallSeed: over seeds 1-7 the last two steps rose
// by -0.03, 0.18, 0.28, 0.08, 0.20, 0.19, 0.39 over the first two; with
// the earlier per-batch draws by 0.53, 0.16, 0.35, 0.20, 0.33, 0.17,
// 0.32, within the spread of seeds.)
func TestGRPORaisesTheMeanReward(t *testing.T) {
	if testing.Short() {
		t.Skip("trains for about 20 s")
	}
	c := microSetup(t)
	coinEpisodes(&c)
	c.RL.Init = sftCoin(t, c, 0.5)
	c.RL.K, c.RL.BatchTasks, c.RL.Steps, c.RL.LR, c.RL.SaveEvery = 8, 3, 8, 3e-3, 0
	c.Seed = 3
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

// sftCoin fine-tunes c's rl.init on the coin's episodes of c's tasks
// (answering with probability p) and returns the policy.
func sftCoin(t *testing.T, c setup.Config, p float64) string {
	t.Helper()
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
			res, err := env.RunEpisode(context.Background(), coin{r, p}, setup.Runtime(c, setup.Helpers{}, nil)(uint64(rep*100+i)), tk, c.EpisodeConfig())
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
	so := setup.SFT(c)
	so.Log = io.Discard
	sres, err := sft.Run(context.Background(), so)
	if err != nil {
		t.Fatal(err)
	}
	return sres.Policy
}

// coinEpisodes shapes c's episodes as the coin plays them: one fact turn,
// no distractors, one call a turn.
func coinEpisodes(c *setup.Config) {
	c.Agent.MaxSteps, c.Agent.ResponseBudget = 1, 24
	c.Episode.Stage1MaxTurns, c.Episode.Stage2MaxTurns = 1, 0
}

// yesTasks writes the same-country questions whose answer is "yes" among
// n generated with seed, as a task file, and returns it with the tasks.
func yesTasks(t *testing.T, seed uint64, n int) (string, []env.Task) {
	t.Helper()
	var recs []env.HotpotRecord
	for _, r := range env.NewSynth(seed).Generate(n) {
		if r.Answer == "yes" {
			recs = append(recs, r)
		}
	}
	var buf bytes.Buffer
	env.WriteHotpot(&buf, recs)
	path := filepath.Join(t.TempDir(), "yes.json")
	os.WriteFile(path, buf.Bytes(), 0o644)
	var tasks []env.Task
	env.StreamHotpot(bytes.NewReader(buf.Bytes()), func(tk env.Task) error { tasks = append(tasks, tk); return nil })
	return path, tasks
}

// TestGRPORaisesHeldOutJ: GRPO's gain shows on tasks it never trained on,
// measured by eval on the training runtime. A micro policy fine-tuned on
// episodes that answer (correctly: every question's answer is "yes") only
// 30% of the time and break the format otherwise answers few held-out
// questions greedily; after GRPO on the training tasks it answers them,
// and held-out J (F1 of the answer, the judge training uses) rises. What
// it learns is the format, not facts: the copying the AgeMem task needs is
// beyond a model of this size (README, "Demo results").
func TestGRPORaisesHeldOutJ(t *testing.T) {
	if testing.Short() {
		t.Skip("trains for about 20 s")
	}
	c := microSetup(t)
	coinEpisodes(&c)
	var train []env.Task
	c.Data.Train, train = yesTasks(t, 3, 240)
	_, held := yesTasks(t, 11, 300)
	if len(train) < 4 || len(held) < 4 {
		t.Fatalf("%d training and %d held-out tasks", len(train), len(held))
	}
	// Two layers: one cannot tell the question turn from a fact turn.
	mc, err := qwen.LoadConfig(c.RL.Init)
	if err != nil {
		t.Fatal(err)
	}
	mc.HiddenSize, mc.Layers, mc.Intermediate = 64, 2, 128
	if err := qwen.InitRandom(c.RL.Init, mc, safetensors.F32, 1); err != nil {
		t.Fatal(err)
	}
	sftPolicy := sftCoin(t, c, 0.3)
	c.RL.Init = sftPolicy
	c.RL.K, c.RL.BatchTasks, c.RL.Steps, c.RL.LR, c.RL.SaveEvery = 8, 3, 10, 3e-3, 0
	res, err := run(c, "")
	if err != nil {
		t.Fatal(err)
	}
	rows, err := eval.Run(context.Background(), eval.Options{Config: c, Tasks: held, Methods: []eval.Method{
		{Name: "AgeMem-noRL", Dir: sftPolicy}, {Name: "AgeMem", Dir: res.Policy}}})
	if err != nil {
		t.Fatal(err)
	}
	before, after := rows[0].J, rows[1].J
	var rw []float64
	for _, s := range res.Steps {
		rw = append(rw, s.Reward)
	}
	t.Logf("mean reward per step %.3f; held-out J on %d tasks: SFT %v (answered %.2f, format errors %.2f), GRPO %v (answered %.2f, format errors %.2f)",
		rw, len(held), before, rows[0].Answered, rows[0].FormatErrors, after, rows[1].Answered, rows[1].FormatErrors)
	if after.Mean < before.Mean+0.3 {
		t.Fatalf("held-out J did not rise: SFT %v, after GRPO %v", before, after)
	}
}
