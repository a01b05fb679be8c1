package rl_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/agemem/agemem/env"
	"github.com/agemem/agemem/memtools"
	"github.com/agemem/agemem/model/chat"
	"github.com/agemem/agemem/model/qwen"
	"github.com/agemem/agemem/model/safetensors"
	"github.com/agemem/agemem/model/tokenizer"
	"github.com/agemem/agemem/rl"
	"github.com/agemem/agemem/setup"
)

// microSetup writes synthetic tasks, a small tokenizer learned on them and
// a random micro Qwen3, and returns a config that trains it for two steps.
func microSetup(t testing.TB) setup.Config {
	dir := t.TempDir()
	var buf bytes.Buffer
	env.WriteHotpot(&buf, env.NewSynth(3).Generate(6))
	data := filepath.Join(dir, "tasks.json")
	if err := os.WriteFile(data, buf.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	prompt, _ := memtools.SystemPromptFor("compact")
	raw, err := tokenizer.Train([]string{buf.String(), prompt}, tokenizer.TrainOptions{VocabSize: 400, Special: tokenizer.ChatML, Added: tokenizer.AgeMemTags})
	if err != nil {
		t.Fatal(err)
	}
	model := filepath.Join(dir, "model")
	os.MkdirAll(model, 0o755)
	os.WriteFile(filepath.Join(model, "tokenizer.json"), raw, 0o644)
	tok, _ := tokenizer.Parse(raw)
	tokenizer.WriteConfig(model, tok, chat.Qwen25Text, 4096)
	mc := qwen.Config{ModelType: "qwen3", HiddenSize: 32, Layers: 1, Heads: 2, KVHeads: 1, HeadDim: 16, Intermediate: 48,
		RMSNormEps: 1e-6, RopeTheta: 1e4, TieEmbeddings: true, VocabSize: tok.VocabSize(), MaxPositions: 4096}
	if err := qwen.InitRandom(model, mc, safetensors.F32, 1); err != nil {
		t.Fatal(err)
	}
	c := setup.Default()
	c.Data.Train = data
	c.Agent.SystemPrompt, c.Agent.ResponseBudget, c.Agent.MaxSteps = "compact", 12, 1
	c.Episode.Stage1MaxTurns, c.Episode.Stage2MaxTurns = 2, 1
	c.RL.Init, c.RL.K, c.RL.BatchTasks, c.RL.Steps, c.RL.SaveEvery = model, 3, 2, 2, 1
	c.RL.Out = filepath.Join(dir, "rl")
	return c
}

// run trains c's rl.init as agemem-train train does.
func run(c setup.Config, resume string) (rl.Result, error) {
	o, err := setup.GRPO(context.Background(), c, io.Discard)
	if err != nil {
		return rl.Result{}, err
	}
	o.Resume = resume
	return rl.Train(context.Background(), o)
}

func records(t *testing.T, path string) []map[string]any {
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var out []map[string]any
	for _, line := range strings.Split(strings.TrimSpace(string(raw)), "\n") {
		var r map[string]any
		if err := json.Unmarshal([]byte(line), &r); err != nil {
			t.Fatal(err)
		}
		out = append(out, r)
	}
	return out
}

// TestRunEndToEnd trains a micro policy for two GRPO steps through Run:
// every metric the issue lists is logged, curves, checkpoints and the
// policy are written, and resuming from step 1 reproduces step 2 exactly.
func TestRunEndToEnd(t *testing.T) {
	c := microSetup(t)
	res, err := run(c, "")
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Steps) != 2 {
		t.Fatalf("%d steps", len(res.Steps))
	}
	recs := records(t, filepath.Join(c.RL.Out, "metrics.jsonl"))
	for _, key := range []string{"reward", "r_task", "r_context", "r_memory", "p_penalty", "r_compression", "r_preventive",
		"r_preservation", "r_storage", "r_maintenance", "r_relevance", "kl", "clip_frac", "entropy", "prompt_tokens", "step_seconds", "experiences"} {
		if _, ok := recs[0][key]; !ok {
			t.Errorf("metrics.jsonl lacks %s", key)
		}
	}
	rolls := records(t, filepath.Join(c.RL.Out, "rollouts.jsonl"))
	if len(rolls) != c.RL.Steps*c.RL.K*c.RL.BatchTasks {
		t.Fatalf("%d per-rollout records, want %d", len(rolls), c.RL.Steps*c.RL.K*c.RL.BatchTasks)
	}
	for _, key := range []string{"task_id", "reward", "r_task", "r_storage", "r_relevance", "p_penalty", "tool_calls"} {
		if _, ok := rolls[0][key]; !ok {
			t.Errorf("rollouts.jsonl lacks %s", key)
		}
	}
	for _, f := range []string{"reward.png", "kl.png", "checkpoint-1/trainer_state.json", "checkpoint-2/params.safetensors", "policy/model.safetensors", "policy/tokenizer.json"} {
		if _, err := os.Stat(filepath.Join(c.RL.Out, f)); err != nil {
			t.Error(err)
		}
	}
	// Resume from step 1 into a fresh output: step 2 is the same.
	c2 := c
	c2.RL.Out = c.RL.Out + "-resumed"
	os.MkdirAll(c2.RL.Out, 0o755)
	res2, err := run(c2, filepath.Join(c.RL.Out, "checkpoint-1"))
	if err != nil {
		t.Fatal(err)
	}
	if len(res2.Steps) != 1 || res2.Steps[0].Reward != res.Steps[1].Reward || res2.Steps[0].Loss != res.Steps[1].Loss {
		t.Fatalf("resumed step 2: %+v, uninterrupted %+v", res2.Steps, res.Steps[1])
	}
}

func TestRunNamesBadInputs(t *testing.T) {
	c := microSetup(t)
	c.RL.BatchTasks = 50
	if _, err := run(c, ""); err == nil || !strings.Contains(err.Error(), "rl.batch_tasks") {
		t.Fatalf("too few tasks: %v", err)
	}
	c = microSetup(t)
	c.RL.Init = t.TempDir()
	if _, err := run(c, ""); err == nil || !strings.Contains(err.Error(), "tokenizer.json") {
		t.Fatalf("missing policy: %v", err)
	}
}

// TestRunIsReproducible: two runs with the same seed write the same
// rollouts and rewards, bit for bit: rollouts decode in batches formed as
// their calls arrive, and a row's arithmetic does not depend on its batch.
// The second run decodes under a KV budget of a few rollouts (paged
// caches; rollouts wait and are recomputed) and still samples the same.
func TestRunIsReproducible(t *testing.T) {
	c := microSetup(t)
	c.RL.K, c.RL.Steps, c.Agent.ResponseBudget, c.Agent.MaxSteps = 4, 2, 24, 2
	var outs [2]string
	for i := range outs {
		ci := c
		ci.RL.Out = filepath.Join(t.TempDir(), "rl")
		if i == 1 {
			ci.RL.KVBudget = 600
		}
		res, err := run(ci, "")
		if err != nil {
			t.Fatal(err)
		}
		if i == 1 {
			st := res.Steps[0]
			t.Logf("under kv_budget %d: peak %d positions, %d recomputed", ci.RL.KVBudget, st.KVPeak, st.Recomputed)
			if pool := max(ci.RL.KVBudget, ci.Agent.ContextBudget+ci.Agent.ResponseBudget) + 16; st.KVPeak == 0 || st.KVPeak > pool || st.Recomputed == 0 {
				t.Fatalf("the paged pool's peak is %d positions under a budget of %d, %d recomputed (the test means to reach recomputation)", st.KVPeak, ci.RL.KVBudget, st.Recomputed)
			}
		}
		raw, err := os.ReadFile(filepath.Join(ci.RL.Out, "rollouts.jsonl"))
		if err != nil {
			t.Fatal(err)
		}
		outs[i] = string(raw)
	}
	if outs[0] != outs[1] {
		a, b := strings.Split(outs[0], "\n"), strings.Split(outs[1], "\n")
		for i := range min(len(a), len(b)) {
			if a[i] != b[i] {
				t.Fatalf("rollout %d differs between two runs with one seed:\n%s\n%s", i, a[i], b[i])
			}
		}
		t.Fatalf("runs differ in length: %d, %d rollouts", len(a), len(b))
	}
}

// TestRolloutProgress: a step's rollouts are reported as they end (off a
// terminal, a line at each quarter), so a long rollout phase is not silent.
func TestRolloutProgress(t *testing.T) {
	c := microSetup(t)
	c.RL.Steps = 1
	var log bytes.Buffer
	o, err := setup.GRPO(context.Background(), c, &log)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := rl.Train(context.Background(), o); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"step 1: rollouts 2/6 done", "step 1: rollouts 3/6 done", "step 1: rollouts 5/6 done", "step 1: rollouts 6/6 done"} {
		if !strings.Contains(log.String(), want) {
			t.Errorf("log lacks %q:\n%s", want, log.String())
		}
	}
	if strings.Contains(log.String(), "rollouts 4/6") {
		t.Errorf("off a terminal only quarters are reported:\n%s", log.String())
	}
}
