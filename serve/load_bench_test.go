package serve

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/agemem/agemem/env"
	"github.com/agemem/agemem/kernels/cpu"
	"github.com/agemem/agemem/llm/native"
	"github.com/agemem/agemem/memtools"
	"github.com/agemem/agemem/memtools/ltm"
	"github.com/agemem/agemem/model/engine"
	"github.com/agemem/agemem/model/qwen"
)

// BenchmarkServeLoad is the load test: 32 clients on loopback for
// AGEMEM_LOAD_SECONDS (default 30) against the tiny policy `make demo`
// trains (AGEMEM_SERVE_POLICY overrides the directory), once with
// continuous batching (serve.max_batch 32) and once without (1), printed
// side by side, then batching with the KV caches in a paged pool of
// serve.kv_budget 8,448 positions (one request's limit: prompt 8,192 plus
// 256 tokens), whose peak is printed beside what the unbounded run's
// caches would have held. Every answer but 200 and the model's own 422 (a
// response format it broke) is an error.
func BenchmarkServeLoad(b *testing.B) {
	dir := os.Getenv("AGEMEM_SERVE_POLICY")
	if dir == "" {
		dir = "../runs/tiny/rl/policy"
	}
	if _, err := os.Stat(filepath.Join(dir, "config.json")); err != nil {
		b.Skipf("no policy at %s: run `make demo` first (or set AGEMEM_SERVE_POLICY)", dir)
	}
	secs := 30
	if s := os.Getenv("AGEMEM_LOAD_SECONDS"); s != "" {
		secs, _ = strconv.Atoi(s)
	}
	var buf bytes.Buffer
	env.WriteHotpot(&buf, env.NewSynth(7).Generate(50))
	var prompts []string
	env.StreamHotpot(&buf, func(t env.Task) error {
		prompts = append(prompts, t.SupportingFacts...)
		prompts = append(prompts, t.Question)
		return nil
	})
	// configs/tiny.yaml's agent section.
	cfg := defaults()
	cfg.Agent.ResponseBudget, cfg.Agent.SystemPrompt = 256, memtools.PromptCompact
	cfg.Serve.KeysEnv = ""
	cfg.Serve.MaxConcurrent = 32
	var kv engine.KVStats
	run := func(maxBatch, kvBudget int) LoadReport {
		c := cfg
		c.Serve.MaxBatch, c.Serve.KVBudget = maxBatch, kvBudget
		c.Memory.Path = filepath.Join(b.TempDir(), "m.db")
		p, err := native.Open(cpu.New(), dir, "", qwen.Options{})
		if err != nil {
			b.Fatal(err)
		}
		db, err := ltm.OpenSQLite(c.Memory.Path, ltm.SQLiteOptions{})
		if err != nil {
			b.Fatal(err)
		}
		defer db.Close()
		s, err := New(with(c.options(), func(o *Options) { o.Native, o.Store = p, db }))
		if err != nil {
			b.Fatal(err)
		}
		defer s.Close()
		ts := newHTTPTest(s)
		defer ts.Close()
		rep, err := LoadTest(context.Background(), LoadOptions{URL: ts.URL, Clients: 32, Duration: time.Duration(secs) * time.Second, Prompts: prompts})
		if err != nil {
			b.Fatal(err)
		}
		kv = s.kv()
		return rep
	}
	for range b.N {
		// The pooled run first: a cold start would count against it.
		paged := run(32, 8448)
		pagedKV := kv
		batched := run(32, 0)
		single := run(1, 0)
		kv = pagedKV
		fmt.Printf("serve load, batching (max_batch 32):  %s\n", batched)
		fmt.Printf("serve load, no batching (max_batch 1): %s\n", single)
		fmt.Printf("serve load: batching / no batching = %.2fx requests/s, %.2fx tokens/s\n",
			batched.RPS()/single.RPS(), batched.TokensPerSecond()/single.TokensPerSecond())
		fmt.Printf("serve load, kv_budget 8448: %s\n", paged)
		fmt.Printf("serve load: kv_budget 8448 / unbounded = %.2fx requests/s; KV peak %d positions of the pool's %d, %d preempted\n",
			paged.RPS()/batched.RPS(), kv.Peak*engine.KVBlock, kv.Blocks*engine.KVBlock, kv.Preempted)
		b.ReportMetric(paged.RPS(), "req/s-kv-budget")
		b.ReportMetric(float64(kv.Peak*engine.KVBlock), "kv-peak-positions")
		b.ReportMetric(batched.RPS(), "req/s")
		b.ReportMetric(single.RPS(), "req/s-unbatched")
		b.ReportMetric(batched.TokensPerSecond(), "tok/s")
		b.ReportMetric(float64(batched.P99.Milliseconds()), "p99-ms")
		// 422 is the model's own answer (a response format it broke), not
		// the server's failure.
		for name, r := range map[string]LoadReport{"batched": batched, "unbatched": single, "kv budget": paged} {
			for code, n := range r.Errors {
				if code != "422" {
					b.Errorf("%s: %d answers %s", name, n, code)
				}
			}
		}
	}
}
