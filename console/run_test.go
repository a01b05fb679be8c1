package console_test

import (
	"bytes"
	"context"
	"io"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"github.com/agemem/agemem/env"
	"github.com/agemem/agemem/eval"
	"github.com/agemem/agemem/rl"
	"github.com/agemem/agemem/setup"
)

// demoRuns is a runs folder as make demo leaves it, small: checkpoints/tiny
// (the shipped SFT policy make demo trains) trained for a few GRPO steps in
// runs/tiny/rl through the command's own path (setup.GRPO, rl.Train), and
// an evaluation report in runs/tiny/eval.json written by eval. Built once
// per test binary (seconds on a CPU).
var demoRuns = sync.OnceValues(func() (string, error) {
	dir, err := os.MkdirTemp("", "agemem-console-runs-")
	if err != nil {
		return "", err
	}
	tmpRoot = dir
	var buf bytes.Buffer
	env.WriteHotpot(&buf, env.NewSynth(1).Generate(16))
	data := filepath.Join(dir, "synth.json")
	if err := os.WriteFile(data, buf.Bytes(), 0o644); err != nil {
		return "", err
	}
	c := setup.Default()
	c.Data.Train, c.Data.Eval = data, data
	c.Model.Path, c.RL.Init = "../checkpoints/tiny", "../checkpoints/tiny"
	c.Agent.SystemPrompt, c.Agent.ResponseBudget = "compact", 256
	c.Episode.Stage1MaxTurns, c.Episode.Stage2MaxTurns = 3, 2
	c.RL.BatchTasks, c.RL.SaveEvery, c.RL.Beta = 2, 0, 0
	// Two runs, to compare: rollouts at temperature 0.7 and at 1.0.
	// (The second smaller: the tests' time is mostly these runs.)
	for _, r := range []struct {
		name     string
		temp     float64
		steps, k int
	}{{"rl", 0.7, 3, 4}, {"rl-t1.0", 1.0, 2, 2}} {
		c.RL.Out, c.RL.Temperature = filepath.Join(dir, "runs", "tiny", r.name), r.temp
		c.RL.Steps, c.RL.K = r.steps, r.k
		o, err := setup.GRPO(context.Background(), c, io.Discard)
		if err != nil {
			return "", err
		}
		if _, err := rl.Train(context.Background(), o); err != nil {
			return "", err
		}
	}
	tasks, err := env.LoadScored(data)
	if err != nil {
		return "", err
	}
	rows, err := eval.Run(context.Background(), eval.Options{Config: c, Tasks: tasks[:6],
		Methods: []eval.Method{{Name: "No-Memory", Scripted: "no-memory"}, {Name: "oracle", Scripted: "oracle"}}})
	if err != nil {
		return "", err
	}
	if err := eval.WriteJSON(filepath.Join(dir, "runs", "tiny", "eval.json"), rows); err != nil {
		return "", err
	}
	return filepath.Join(dir, "runs"), nil
})

func runsDir(t testing.TB) string {
	t.Helper()
	dir, err := demoRuns()
	if err != nil {
		t.Fatalf("a small GRPO run: %v", err)
	}
	return dir
}

// tmpRoot is the folder demoRuns made, removed when the tests end.
var tmpRoot string

func TestMain(m *testing.M) {
	code := m.Run()
	if tmpRoot != "" {
		os.RemoveAll(tmpRoot)
	}
	os.Exit(code)
}
