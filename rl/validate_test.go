package rl_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/agemem/agemem/rl"
	"github.com/agemem/agemem/setup"
)

// TestKeepBest: with validation every step, the run logs val_j before the
// first step and after each, and rl.keep_best installs as out/policy the
// weights of the best trained step (ties: the earlier; never the
// starting policy, however it scored), leaving no staging folders; without
// keep_best the policy is the last step's and best.json still names the
// best. A keep_best run without validation tasks is refused.
func TestKeepBest(t *testing.T) {
	scores := []float64{0.9, 0.2, 0.6, 0.6, 0.1} // steps 0..4
	for _, keep := range []bool{true, false} {
		c := microSetup(t)
		c.RL.Steps, c.RL.SaveEvery, c.RL.ValEvery, c.RL.KeepBest = 4, 0, 1, keep
		o, err := setup.GRPO(context.Background(), c, &bytes.Buffer{})
		if err != nil {
			t.Fatal(err)
		}
		var log bytes.Buffer
		o.Log = &log
		var seen [][32]byte // the weights each validation played, by step
		o.Validate = func(_ context.Context, policy string) (float64, float64, error) {
			b, err := os.ReadFile(filepath.Join(policy, "model.safetensors"))
			if err != nil {
				return 0, 0, err
			}
			seen = append(seen, sha256.Sum256(b))
			return scores[len(seen)-1], 0.01, nil
		}
		res, err := rl.Train(context.Background(), o)
		if err != nil {
			t.Fatal(err)
		}
		if len(seen) != 5 {
			t.Fatalf("keep_best %v: %d validations, want 5 (before step 1 and after steps 1-4)", keep, len(seen))
		}
		if seen[1] == seen[2] || seen[0] == seen[1] {
			t.Fatal("the validated weights did not change with the steps: the test compares nothing")
		}
		if res.Best.Step != 2 || res.Best.J != 0.6 {
			t.Errorf("keep_best %v: best %+v, want step 2 (J 0.6; step 3's tie and step 0's 0.9 do not count)", keep, res.Best)
		}
		b, err := os.ReadFile(filepath.Join(c.RL.Out, "policy", "model.safetensors"))
		if err != nil {
			t.Fatal(err)
		}
		want, name := seen[4], "the last step's"
		if keep {
			want, name = seen[2], "step 2's"
		}
		if sha256.Sum256(b) != want {
			t.Errorf("keep_best %v: out/policy is not %s weights", keep, name)
		}
		var vals []float64
		for _, r := range records(t, filepath.Join(c.RL.Out, "metrics.jsonl")) {
			if v, ok := r["val_j"].(float64); ok {
				vals = append(vals, v)
			}
		}
		if len(vals) != 5 || vals[0] != 0.9 || vals[4] != 0.1 {
			t.Errorf("keep_best %v: metrics.jsonl val_j %v, want %v", keep, vals, scores)
		}
		for _, f := range []string{"best.json", "validation.png", "policy/tokenizer.json"} {
			if _, err := os.Stat(filepath.Join(c.RL.Out, f)); err != nil {
				t.Error(err)
			}
		}
		for _, f := range []string{"best-policy", "val-policy"} {
			if _, err := os.Stat(filepath.Join(c.RL.Out, f)); err == nil {
				t.Errorf("keep_best %v: %s left behind", keep, f)
			}
		}
		if keep && !strings.Contains(log.String(), "the weights after step 2") {
			t.Errorf("the log does not say which step's weights the policy holds:\n%s", log.String())
		}
	}

	c := microSetup(t)
	c.RL.KeepBest = true
	if err := c.Validate(); err == nil || !strings.Contains(err.Error(), "rl.keep_best") || !strings.Contains(err.Error(), "data.val") {
		t.Errorf("keep_best without data.val: %v", err)
	}
	if _, err := run(c, ""); err == nil || !strings.Contains(err.Error(), "data.val") {
		t.Errorf("rl.Train with keep_best and no validation: %v", err)
	}
}

// TestConfigRefusesGroupsThatCannotLearn: a group of one rollout, or
// greedy rollouts (a task's K then play alike), gives GRPO only zero
// advantages, so a run would spend its hours learning nothing: both are
// refused by key.
func TestConfigRefusesGroupsThatCannotLearn(t *testing.T) {
	for _, c := range []struct {
		set  func(*rl.Config)
		want string
	}{
		{func(c *rl.Config) { c.K = 1 }, "k: 1 is below the minimum 2"},
		{func(c *rl.Config) { c.Temperature = 0 }, "temperature: 0 must be positive"},
	} {
		cfg := rl.DefaultConfig()
		c.set(&cfg)
		if err := cfg.Validate(); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%v, want %q", err, c.want)
		}
	}
	if err := rl.DefaultConfig().Validate(); err != nil {
		t.Fatal(err)
	}
}
