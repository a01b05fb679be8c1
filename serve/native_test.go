package serve

import (
	"context"
	"encoding/json"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/agemem/agemem/internal/qwentest"
	"github.com/agemem/agemem/llm"
	"github.com/agemem/agemem/llm/native"
	"github.com/agemem/agemem/memtools"
	"github.com/agemem/agemem/memtools/ltm"
	"github.com/agemem/agemem/memtools/stm"
	"github.com/agemem/agemem/model/chat"
	"github.com/agemem/agemem/model/engine"
	"github.com/agemem/agemem/model/safetensors"
)

// randomPolicy is a random tiny Qwen3 with the real Qwen3 tokenizer.
func randomPolicy(t testing.TB) *native.Checkpoint {
	t.Helper()
	tok := qwentest.Tokenizer(t)
	return &native.Checkpoint{Model: qwentest.Model(t, tok, safetensors.F32), Tokenizer: tok, Template: chat.Qwen3}
}

// The native backend over HTTP: concurrent requests share decoding steps,
// each request's first policy call is exactly what the policy produces
// alone (greedy: sampling from a random model's flat distribution turns
// on rounding), and a model that writes no valid response gets
// 422 while the server keeps serving. With serve.kv_budget the same holds
// with every live sequence's keys and values in a pool of 1,024
// positions (one request's limit: the others wait or are preempted).
func TestNativeBackendBatchesAndMatchesThePolicy(t *testing.T) {
	for _, budget := range []int{0, 1024} {
		t.Run("kv_budget="+strconv.Itoa(budget), func(t *testing.T) { testNativeBackend(t, budget) })
	}
}

// A KV budget no request fits in is refused at start, naming the keys.
func TestKVBudgetBelowARequestIsRefused(t *testing.T) {
	c := testConfig(t)
	c.Serve.KVBudget, c.Serve.MaxPromptTokens, c.Serve.MaxTokens = 1000, 1000, 16
	db, err := ltm.OpenSQLite(c.Memory.Path, ltm.SQLiteOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	_, err = New(with(c.options(), func(o *Options) { o.Native, o.Store = randomPolicy(t), db }))
	if err == nil || !strings.Contains(err.Error(), "serve.kv_budget 1000 is below a request's largest prompt (1000") {
		t.Fatalf("%v", err)
	}
}

func testNativeBackend(t *testing.T, budget int) {
	pol := randomPolicy(t)
	c := testConfig(t)
	c.Agent.MaxSteps = 2
	c.Serve.MaxBatch = 4
	if budget > 0 {
		c.Serve.KVBudget, c.Serve.MaxPromptTokens, c.Serve.MaxTokens = budget, budget-16, 16
	}
	db, err := ltm.OpenSQLite(c.Memory.Path, ltm.SQLiteOptions{})
	if err != nil {
		t.Fatal(err)
	}
	s, err := New(with(c.options(), func(o *Options) { o.Native, o.Store = pol, db }))
	if err != nil {
		t.Fatal(err)
	}
	ts := &testServer{Server: newHTTPTest(s), srv: s, db: db}
	defer func() { ts.Close(); s.Close(); db.Close() }()

	const n = 6
	replies := make([]reply, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			replies[i] = do(t, "POST", ts.URL+"/v1/chat/completions", aliceKey,
				chatBody("", "Where was Marla born? "+strconv.Itoa(i), "seed", 100+i, "temperature", 0, "max_tokens", 12))
		})
	}
	wg.Wait()
	sys, _ := memtools.SystemPromptFor("compact")
	alone := pol.Start(native.Options{})
	defer alone.Close()
	for i, r := range replies {
		if r.Status != 422 || r.errorCode(t) != "tool_format_error" {
			t.Fatalf("request %d: %d %s", i, r.Status, r.Body)
		}
		var body struct {
			Error struct {
				AgeMem traceInfo `json:"agemem"`
			} `json:"error"`
		}
		json.Unmarshal(r.Body, &body)
		steps := body.Error.AgeMem.Steps
		if len(steps) != 2 {
			t.Fatalf("request %d: %d steps", i, len(steps))
		}
		want, err := alone.Chat(context.Background(), llm.Request{Messages: []chat.Message{{Role: stm.System, Content: sys}, {Role: stm.User, Content: "Where was Marla born? " + strconv.Itoa(i)}},
			Sampling: &llm.Sampling{TopP: 1, MaxTokens: 12, Seed: uint64(100 + i)}})
		if err != nil {
			t.Fatal(err)
		}
		if steps[0].Response != want.Message.Content {
			t.Fatalf("request %d: served %q, the policy alone %q", i, steps[0].Response, want.Message.Content)
		}
	}
	m := string(do(t, "GET", ts.URL+"/metrics", "", nil).Body)
	count := regexp.MustCompile(`agemem_decode_batch_sequences_count (\d+)`).FindStringSubmatch(m)
	single := regexp.MustCompile(`agemem_decode_batch_sequences_bucket\{le="1"\} (\d+)`).FindStringSubmatch(m)
	if count == nil || single == nil || count[1] == single[1] {
		t.Fatalf("no decoding step held more than one sequence:\n%s", m)
	}
	blocks := regexp.MustCompile(`agemem_kv_cache_blocks (\d+)`).FindStringSubmatch(m)
	peak := regexp.MustCompile(`agemem_kv_cache_peak_blocks (\d+)`).FindStringSubmatch(m)
	if blocks == nil || peak == nil {
		t.Fatalf("no KV pool series:\n%s", m)
	}
	if b, p := atoi(blocks[1]), atoi(peak[1]); b != budget/engine.KVBlock || p > b || (budget > 0) != (p > 0) {
		t.Fatalf("kv_budget %d: %d blocks, peak %d", budget, b, p)
	}
	t.Logf("kv_budget %d: %s blocks, peak %s; %s", budget, blocks[1], peak[1], regexp.MustCompile(`agemem_kv_preempted_total \d+`).FindString(m))
	// Streaming through the scheduler: the status is held until answer text,
	// so a model that never answers still gets its 422.
	r := do(t, "POST", ts.URL+"/v1/chat/completions", aliceKey, chatBody("", "hello", "stream", true, "seed", 1, "max_tokens", 8))
	if r.Status == 200 {
		if st := readSSE(t, r.Body); st.err == nil || !st.done {
			t.Fatalf("a streamed answer that fails must end with an error event: %s", r.Body)
		}
	} else if r.errorCode(t) != "tool_format_error" {
		t.Fatalf("streamed: %d %s", r.Status, r.Body)
	}
	if r := do(t, "GET", ts.URL+"/v1/memories", aliceKey, nil); r.Status != 200 {
		t.Fatalf("still serving: %d", r.Status)
	}
}

func atoi(s string) int {
	n, _ := strconv.Atoi(s)
	return n
}

// TestPrefixCacheDoesNotCrossTenants: the timing side channel of a shared
// prompt cache, measured by what it leaks through (the prompt tokens a
// request is served from cache). Alice's long message, sent again by Bob,
// is prefilled in full for Bob (only the system prompt every tenant shares
// comes from the cache), while Alice's own repeat is served from her
// cached prefix.
func TestPrefixCacheDoesNotCrossTenants(t *testing.T) {
	c := testConfig(t)
	c.Agent.MaxSteps = 1
	db, err := ltm.OpenSQLite(c.Memory.Path, ltm.SQLiteOptions{})
	if err != nil {
		t.Fatal(err)
	}
	s, err := New(with(c.options(), func(o *Options) { o.Native, o.Store = randomPolicy(t), db }))
	if err != nil {
		t.Fatal(err)
	}
	ts := &testServer{Server: newHTTPTest(s), srv: s, db: db}
	defer func() { ts.Close(); s.Close(); db.Close() }()
	pc := s.be.(*native.Engine).Batching().Prefixes()
	secret := strings.Repeat("My account number at the Velden savings bank is 4417 0092 1183, and my mother's maiden name is Quenby. ", 8)
	send := func(key string) (reused int64, took time.Duration) {
		before := pc.Reused
		t0 := time.Now()
		r := do(t, "POST", ts.URL+"/v1/chat/completions", key, chatBody("", secret, "seed", 1, "temperature", 0, "max_tokens", 4))
		if r.Status != 200 && r.Status != 422 {
			t.Fatalf("%d %s", r.Status, r.Body)
		}
		return pc.Reused - before, time.Since(t0)
	}
	aliceFirst, t1 := send(aliceKey)
	bob, t2 := send(bobKey)
	aliceAgain, t3 := send(aliceKey)
	t.Logf("prompt tokens from cache: alice %d (%v), bob with alice's text %d (%v), alice again %d (%v)", aliceFirst, t1, bob, t2, aliceAgain, t3)
	if bob != aliceFirst {
		t.Fatalf("bob's request took %d cached tokens, alice's first %d: a tenant's prompt was served from another's cache", bob, aliceFirst)
	}
	if aliceAgain <= bob+100 {
		t.Fatalf("alice's repeat took %d cached tokens, no more than bob's %d: the cache does not serve a tenant's own prefix", aliceAgain, bob)
	}
}
