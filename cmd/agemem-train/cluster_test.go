package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/agemem/agemem/env"
)

// TestMain lets the test binary stand for agemem-train in the processes
// the loopback tests launch (AGEMEM_TEST_MAIN=1): a rank is the real CLI.
func TestMain(m *testing.M) {
	if os.Getenv("AGEMEM_TEST_MAIN") == "1" {
		main()
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// loopback is one machine standing for a cluster: a task file, a config
// every run shares, and the serve binary.
type loopback struct {
	t     *testing.T
	dir   string
	serve string
	tiny  string
}

func newLoopback(t *testing.T) *loopback {
	if testing.Short() {
		t.Skip("launches trainer ranks and serve engines as processes (a few minutes on 2 cores)")
	}
	lb := &loopback{t: t, dir: t.TempDir()}
	var buf bytes.Buffer
	env.WriteHotpot(&buf, env.NewSynth(3).Generate(8))
	if err := os.WriteFile(filepath.Join(lb.dir, "tasks.json"), buf.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	var err error
	if lb.tiny, err = filepath.Abs(filepath.Join("..", "..", "checkpoints", "tiny")); err != nil {
		t.Fatal(err)
	}
	lb.serve = filepath.Join(lb.dir, "serve")
	if out, err := exec.Command("go", "build", "-o", lb.serve, "../serve").CombinedOutput(); err != nil {
		t.Fatalf("building serve: %v\n%s", err, out)
	}
	return lb
}

// config is the tiny demo policy trained with LoRA for three steps of two
// tasks x three rollouts, micro-batches small enough that both ranks (or
// both devices) run some; out and the rest of the YAML are the run's.
func (lb *loopback) config(name, extra string) string {
	y := fmt.Sprintf(`seed: 1
data: {train: %s}
agent: {system_prompt: compact, response_budget: 24, max_steps: 1}
episode: {stage1_max_turns: 2, stage2_max_turns: 1}
lora: {enabled: true, r: 4, alpha: 8}
cluster: {heartbeat: 500ms, timeout: 3s}
%s
`, filepath.Join(lb.dir, "tasks.json"), extra)
	path := filepath.Join(lb.dir, name+".yaml")
	if err := os.WriteFile(path, []byte(y), 0o644); err != nil {
		lb.t.Fatal(err)
	}
	return path
}

func (lb *loopback) rl(out, more string) string {
	return fmt.Sprintf("rl: {init: %s, k: 3, batch_tasks: 2, steps: 3, save_every: 1, batch_tokens: 512, out: %s%s}", lb.tiny, filepath.Join(lb.dir, out), more)
}

func freePort(t *testing.T) int {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

// serveProc is a serve process with runtime adapters on; its log lines go
// to lines as they are written.
type serveProc struct {
	url   string
	cmd   *exec.Cmd
	mu    sync.Mutex
	lines []string
}

func (lb *loopback) startEngine(i int) *serveProc {
	t := lb.t
	port := freePort(t)
	cfg := filepath.Join(lb.dir, fmt.Sprintf("serve%d.yaml", i))
	os.WriteFile(cfg, []byte(fmt.Sprintf(`agent: {system_prompt: compact, response_budget: 24, max_steps: 1}
model: {device: cpu}
memory: {path: %s}
serve: {addr: "127.0.0.1:%d", policy: %s, keys_env: ""}
`, filepath.Join(lb.dir, fmt.Sprintf("serve%d.db", i)), port, lb.tiny)), 0o644)
	e := &serveProc{url: fmt.Sprintf("http://127.0.0.1:%d/v1", port)}
	e.cmd = exec.Command(lb.serve, "--config", cfg)
	e.cmd.Env = append(os.Environ(), "VLLM_ALLOW_RUNTIME_LORA_UPDATING=true")
	stderr, _ := e.cmd.StderrPipe()
	if err := e.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			e.mu.Lock()
			e.lines = append(e.lines, sc.Text())
			e.mu.Unlock()
		}
	}()
	t.Cleanup(func() { e.cmd.Process.Kill(); e.cmd.Wait() })
	for start := time.Now(); ; time.Sleep(100 * time.Millisecond) {
		if resp, err := http.Get(fmt.Sprintf("http://127.0.0.1:%d/readyz", port)); err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 {
				return e
			}
		}
		if time.Since(start) > time.Minute {
			t.Fatalf("serve %d not ready after a minute:\n%s", i, strings.Join(e.lines, "\n"))
		}
	}
}

// count is how many log lines hold s.
func (e *serveProc) count(s string) int {
	e.mu.Lock()
	defer e.mu.Unlock()
	n := 0
	for _, l := range e.lines {
		if strings.Contains(l, s) {
			n++
		}
	}
	return n
}

// rank is a trainer rank process.
type rank struct {
	cmd  *exec.Cmd
	log  bytes.Buffer
	done chan error
}

// launch starts size ranks of agemem-train train with torchrun's
// variables, as torchrun would.
func (lb *loopback) launch(size int, cfg string, args ...string) []*rank {
	port := freePort(lb.t)
	var rs []*rank
	for r := range size {
		k := &rank{done: make(chan error, 1)}
		k.cmd = exec.Command(os.Args[0], append([]string{"train", "--config", cfg}, args...)...)
		k.cmd.Env = append(os.Environ(), "AGEMEM_TEST_MAIN=1", fmt.Sprintf("RANK=%d", r), fmt.Sprintf("WORLD_SIZE=%d", size),
			fmt.Sprintf("LOCAL_RANK=%d", r), fmt.Sprintf("LOCAL_WORLD_SIZE=%d", size), "MASTER_ADDR=127.0.0.1", fmt.Sprintf("MASTER_PORT=%d", port))
		k.cmd.Stdout, k.cmd.Stderr = &k.log, &k.log
		if err := k.cmd.Start(); err != nil {
			lb.t.Fatal(err)
		}
		go func() { k.done <- k.cmd.Wait() }()
		lb.t.Cleanup(func() { k.cmd.Process.Kill() })
		rs = append(rs, k)
	}
	return rs
}

func (lb *loopback) wait(rs []*rank) {
	for i, k := range rs {
		select {
		case err := <-k.done:
			if err != nil {
				lb.t.Fatalf("rank %d: %v\n%s", i, err, k.log.String())
			}
		case <-time.After(10 * time.Minute):
			lb.t.Fatalf("rank %d still running after 10 minutes:\n%s", i, k.log.String())
		}
	}
}

func (lb *loopback) read(out, file string) []byte {
	b, err := os.ReadFile(filepath.Join(lb.dir, out, file))
	if err != nil {
		lb.t.Fatal(err)
	}
	return b
}

func metricsOf(t *testing.T, raw []byte) []map[string]any {
	var out []map[string]any
	for _, l := range strings.Split(strings.TrimSpace(string(raw)), "\n") {
		var m map[string]any
		if err := json.Unmarshal([]byte(l), &m); err != nil {
			t.Fatal(err)
		}
		out = append(out, m)
	}
	return out
}

// sameRun fails unless run got trained the weights of run want, bit for
// bit, through the same rollouts and losses.
func (lb *loopback) sameRun(want, got string) {
	t := lb.t
	for _, f := range []string{"policy/adapter_model.safetensors", "checkpoint-3/params.safetensors", "checkpoint-3/optimizer.safetensors"} {
		if !bytes.Equal(lb.read(want, f), lb.read(got, f)) {
			t.Fatalf("%s/%s differs from %s's", got, f, want)
		}
	}
	wm, gm := metricsOf(t, lb.read(want, "metrics.jsonl")), metricsOf(t, lb.read(got, "metrics.jsonl"))
	for i := range wm {
		for _, k := range []string{"reward", "loss", "kl", "grad_norm", "entropy", "experiences", "rollout_tokens"} {
			if wm[i][k] != gm[i][k] {
				t.Fatalf("step %d: %s %v in %s, %v in %s", i+1, k, gm[i][k], got, wm[i][k], want)
			}
		}
	}
}

// TestLoopbackRanksAndEngines: on one machine standing for a cluster, two
// trainer ranks (processes launched with torchrun's variables) and two
// serve engines train the tiny demo policy (LoRA) for three steps and
// reach the weights, AdamW moments, rollouts and losses of one process
// training on two devices, bit for bit: every call samples from its own
// seed, the engines' CPU forward is the trainer's whatever a row is
// batched with, and two ranks add gradients as two devices do (g0 + g1).
// Then engine 1 is killed in the middle of step 2: its unfinished
// episodes are played again on engine 0 (the metrics count them), engine
// 1 drops out of step 3, and the weights are still those of the run
// without the failure.
func TestLoopbackRanksAndEngines(t *testing.T) {
	lb := newLoopback(t)
	single := lb.config("single", "model: {device: cpu, devices: [cpu, cpu]}\n"+lb.rl("single", ""))
	if _, err := runCombined(t, "train", "--config", single); err != nil {
		t.Fatal(err)
	}
	e0, e1 := lb.startEngine(0), lb.startEngine(1)
	engines := fmt.Sprintf(", engines: [%s, %s]", e0.url, e1.url)
	multi := lb.config("multi", "model: {device: cpu, devices: [cpu]}\n"+lb.rl("multi", engines))
	start := time.Now()
	lb.wait(lb.launch(2, multi))
	t.Logf("2 ranks x 2 engines: 3 steps in %v", time.Since(start).Round(time.Second))
	lb.sameRun("single", "multi")
	if !bytes.Equal(lb.read("single", "rollouts.jsonl"), lb.read("multi", "rollouts.jsonl")) {
		t.Fatal("the ranks' rollouts.jsonl differs from one process's")
	}
	for i, m := range metricsOf(t, lb.read("multi", "metrics.jsonl")) {
		if m["engines"] != 2.0 || m["rollouts_rerun"] != 0.0 || !strings.HasPrefix(m["adapter"].(string), fmt.Sprintf("agemem-v%d-", i)) {
			t.Fatalf("step %d: %v engines, %v re-runs, adapter %v", i+1, m["engines"], m["rollouts_rerun"], m["adapter"])
		}
	}

	// Engine 1 dies after answering two calls of step 2.
	killed := lb.config("killed", "model: {device: cpu, devices: [cpu]}\n"+lb.rl("killed", engines))
	loads, calls := e1.count(`"adapter loaded"`), -1
	rs := lb.launch(2, killed)
	for deadline := time.Now().Add(5 * time.Minute); ; time.Sleep(50 * time.Millisecond) {
		if calls < 0 && e1.count(`"adapter loaded"`) >= loads+2 { // v0, then v1: step 2 begins
			calls = e1.count("/v1/completions")
		}
		if calls >= 0 && e1.count("/v1/completions") >= calls+2 {
			e1.cmd.Process.Kill()
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("step 2 never reached engine 1:\n%s", rs[0].log.String())
		}
	}
	lb.wait(rs)
	lb.sameRun("single", "killed")
	ms := metricsOf(t, lb.read("killed", "metrics.jsonl"))
	if ms[1]["rollouts_rerun"].(float64) < 1 || ms[2]["engines"] != 1.0 {
		t.Fatalf("after engine 1 died in step 2: %v re-runs in step 2, %v engines in step 3", ms[1]["rollouts_rerun"], ms[2]["engines"])
	}
	rolls := metricsOf(t, lb.read("killed", "rollouts.jsonl"))
	rerun := 0
	for _, r := range rolls {
		if r["reruns"] != nil {
			rerun++
		}
	}
	if len(rolls) != 3*2*3 || float64(rerun) != ms[1]["rollouts_rerun"].(float64) {
		t.Fatalf("%d rollouts logged (want 18, none lost or doubled), %d marked re-run", len(rolls), rerun)
	}
	t.Logf("engine 1 killed in step 2: %v episodes re-run on engine 0", ms[1]["rollouts_rerun"])
}

// TestLoopbackRankDiesAndResumes: two ranks decoding in process; rank 1
// is killed during step 2. Rank 0 stops within cluster.timeout (3 s, plus
// a heartbeat and the process's exit) with an error naming rank 1, and
// relaunching both with --resume from the last checkpoint finishes the run
// on the weights of a run never interrupted, bit for bit (the tasks,
// seeds and AdamW state come back from the checkpoint).
func TestLoopbackRankDiesAndResumes(t *testing.T) {
	lb := newLoopback(t)
	whole := lb.config("whole", "model: {device: cpu, devices: [cpu, cpu]}\n"+lb.rl("whole", ""))
	if _, err := runCombined(t, "train", "--config", whole); err != nil {
		t.Fatal(err)
	}
	cfg := lb.config("ranks", "model: {device: cpu, devices: [cpu]}\n"+lb.rl("ranks", ""))
	rs := lb.launch(2, cfg)
	metrics := filepath.Join(lb.dir, "ranks", "metrics.jsonl")
	for deadline := time.Now().Add(5 * time.Minute); ; time.Sleep(50 * time.Millisecond) {
		if raw, err := os.ReadFile(metrics); err == nil && bytes.Count(raw, []byte("\n")) >= 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("step 1 never ended:\n%s", rs[0].log.String())
		}
	}
	time.Sleep(500 * time.Millisecond) // into step 2's rollouts
	rs[1].cmd.Process.Kill()
	killed := time.Now()
	select {
	case err := <-rs[0].done:
		took := time.Since(killed)
		if err == nil {
			t.Fatal("rank 0 finished without rank 1")
		}
		if !strings.Contains(rs[0].log.String(), fmt.Sprintf("rank 1 (127.0.0.1, pid %d)", rs[1].cmd.Process.Pid)) {
			t.Fatalf("rank 0's error does not name rank 1:\n%s", rs[0].log.String())
		}
		if took > 3*time.Second+5*time.Second {
			t.Fatalf("rank 0 stopped %v after rank 1 died; cluster.timeout is 3s", took)
		}
		t.Logf("rank 0 stopped %v after rank 1 was killed: %s", took.Round(10*time.Millisecond), lastLine(rs[0].log.String()))
	case <-time.After(time.Minute):
		t.Fatalf("rank 0 still running a minute after rank 1 died:\n%s", rs[0].log.String())
	}
	lb.wait(lb.launch(2, cfg, "--resume", filepath.Join(lb.dir, "ranks", "checkpoint-1")))
	lb.sameRun("whole", "ranks")
	if n := len(metricsOf(t, lb.read("ranks", "rollouts.jsonl"))); n != 18 {
		t.Fatalf("%d rollouts logged over the interrupted and resumed runs, want 18", n)
	}
}

func lastLine(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return lines[len(lines)-1]
}

// TestDryRunPrintsTheClusterPlan: --dry-run under torchrun's variables
// names the ranks, this rank's device, the control endpoint, the engines
// and whose each is, and the memory of one rank's device without the
// engine's share; a bad launch variable is an error naming it.
func TestDryRunPrintsTheClusterPlan(t *testing.T) {
	for k, v := range map[string]string{"RANK": "1", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2", "MASTER_ADDR": "node0", "MASTER_PORT": "29500"} {
		t.Setenv(k, v)
	}
	tiny, _ := filepath.Abs(filepath.Join("..", "..", "checkpoints", "tiny"))
	out, err := run(t, "train", "--dry-run", "--set", "rl.init="+tiny, "--set", "lora.enabled=true", "--set", "model.devices=[cuda]",
		"--set", "rl.engines=[http://gpu1:8000/v1,http://gpu2:8000/v1]")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"cluster: 4 ranks (torchrun variables), 2 per machine; this is rank 1 (local rank 1) on cuda:1",
		"control endpoint: http://node0:29500/rpc", "NCCL across the ranks", "rank r plays groups r, r+4",
		"engines: 2, adapters served over HTTP by rank 0", "http://gpu2:8000/v1  (shared: ranks r with r mod 2 = 1)", "memory per device (cuda:1)", "total (approximate)"} {
		if !strings.Contains(out, want) {
			t.Errorf("the plan lacks %q:\n%s", want, out)
		}
	}
	t.Setenv("RANK", "7")
	if _, err := run(t, "train", "--dry-run", "--set", "rl.init="+tiny); err == nil || !strings.Contains(err.Error(), "$RANK is 7") {
		t.Fatalf("a rank beyond the world: %v", err)
	}
	t.Setenv("RANK", "1")
	if _, err := run(t, "train", "--dry-run", "--set", "rl.init="+tiny, "--set", "rl.engines=[http://gpu1:8000/v1]"); err == nil || !strings.Contains(err.Error(), "lora.enabled") {
		t.Fatalf("engines without LoRA: %v", err)
	}
}
