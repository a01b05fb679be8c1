package fleet_test

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/agemem/agemem/env"
	"github.com/agemem/agemem/kernels/device"
	"github.com/agemem/agemem/llm"
	"github.com/agemem/agemem/llm/native"
	modelengine "github.com/agemem/agemem/model/engine"
	"github.com/agemem/agemem/model/qwen"
	"github.com/agemem/agemem/rl/fleet"
	"github.com/agemem/agemem/rl/rollout"
	"github.com/agemem/agemem/serve"
	"github.com/agemem/agemem/setup"
)

// BenchmarkRolloutThroughput plays the same batch of AgeMem rollouts (the
// tiny demo policy, 4 tasks x 4 rollouts, three short stages) on the
// in-process engine and on 1, 2 and 4 serve processes on this machine,
// driven with token ids as rl.engines drives them, and reports each
// one's rollout tokens a second (prompt and generated, as metrics.jsonl's
// rollout_tokens) beside the in-process engine's, measured in the same
// run. The engines share this machine's cores: more processes help only
// while cores are idle.
func BenchmarkRolloutThroughput(b *testing.B) {
	dir := b.TempDir()
	bin := filepath.Join(dir, "serve")
	if out, err := exec.Command("go", "build", "-o", bin, "../../cmd/serve").CombinedOutput(); err != nil {
		b.Fatalf("building serve: %v\n%s", err, out)
	}
	abs, _ := filepath.Abs(tiny)
	var urls []string
	for i := range 4 {
		urls = append(urls, startServe(b, bin, dir, abs, i))
	}
	be, _ := device.Open("cpu", nil)
	ck, err := native.Open(be, tiny, "", qwen.Options{})
	if err != nil {
		b.Fatal(err)
	}
	cfg := setup.Default()
	cfg.Agent.SystemPrompt, cfg.Agent.ResponseBudget, cfg.Agent.MaxSteps = "compact", 32, 1
	cfg.Episode.Stage1MaxTurns, cfg.Episode.Stage2MaxTurns = 3, 1
	var buf bytes.Buffer
	env.WriteHotpot(&buf, env.NewSynth(4).Generate(4))
	var tasks []env.Task
	env.StreamHotpot(&buf, func(t env.Task) error { tasks = append(tasks, t); return nil })
	e := setup.AgeMem(cfg, setup.Helpers{}, tasks, ck.Tokenizer)
	codec := native.NewCodec(ck.Tokenizer, ck.Template, ck.Model.MaxPositions, 0)
	f, err := fleet.New(fleet.Options{URLs: urls, Timeout: 5 * time.Minute}, nil)
	if err != nil {
		b.Fatal(err)
	}
	play := func(pols []llm.Model) float64 {
		start := time.Now()
		_, exps, err := rollout.RunOn(context.Background(), pols, e, []int{0, 1, 2, 3},
			rollout.Options{K: 4, Seed: 7, Sampling: &llm.Sampling{Temperature: 1, TopP: 1, MaxTokens: 32}})
		if err != nil {
			b.Fatal(err)
		}
		n := 0
		for _, x := range exps {
			n += len(x.PromptIDs) + len(x.ResponseIDs)
		}
		return float64(n) / time.Since(start).Seconds()
	}
	var in, remote [3]float64
	b.ResetTimer()
	for range b.N {
		local := ck.Start(native.Options{Sampling: llm.Sampling{MaxTokens: 32}, Engine: modelengine.Options{PrefixBudget: 16 * 4096}})
		in[0] += play([]llm.Model{local})
		local.Close()
		for k, n := range []int{1, 2, 4} {
			ms, _ := f.Models(urls[:n], "agemem", codec, llm.Sampling{MaxTokens: 32})
			remote[k] += play(ms)
		}
	}
	b.StopTimer()
	base := in[0] / float64(b.N)
	b.ReportMetric(base, "inproc_tok/s")
	for k, n := range []int{1, 2, 4} {
		v := remote[k] / float64(b.N)
		b.ReportMetric(v, fmt.Sprintf("engines%d_tok/s", n))
		b.ReportMetric(v/base, fmt.Sprintf("engines%d/inproc", n))
	}
}

// startServe starts serve process i over the policy and returns its API
// root once it is ready.
func startServe(b *testing.B, bin, dir, policy string, i int) string {
	ln, _ := net.Listen("tcp", "127.0.0.1:0")
	port := ln.Addr().(*net.TCPAddr).Port
	ln.Close()
	cfg := filepath.Join(dir, fmt.Sprintf("serve%d.yaml", i))
	os.WriteFile(cfg, []byte(fmt.Sprintf("agent: {system_prompt: compact, response_budget: 32, max_steps: 1}\nmodel: {device: cpu}\nmemory: {path: %s}\nserve: {addr: \"127.0.0.1:%d\", policy: %s, keys_env: \"\", log_format: text}\n",
		filepath.Join(dir, fmt.Sprintf("m%d.db", i)), port, policy)), 0o644)
	cmd := exec.Command(bin, "--config", cfg)
	cmd.Env = append(os.Environ(), serve.RuntimeAdaptersEnv+"=true")
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	for start := time.Now(); time.Since(start) < time.Minute; time.Sleep(100 * time.Millisecond) {
		if resp, err := http.Get(fmt.Sprintf("http://127.0.0.1:%d/readyz", port)); err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 {
				return fmt.Sprintf("http://127.0.0.1:%d/v1", port)
			}
		}
	}
	b.Fatalf("serve %d not ready", i)
	return ""
}
