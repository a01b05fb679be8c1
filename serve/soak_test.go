package serve

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"runtime"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// soakDuration is how long TestSoak runs: AGEMEM_SOAK (a Go duration;
// `make soak` sets minutes), or a few seconds so CI runs the same mix.
func soakDuration(t *testing.T) time.Duration {
	v := os.Getenv("AGEMEM_SOAK")
	if v == "" {
		return 4 * time.Second
	}
	d, err := time.ParseDuration(v)
	if err != nil {
		t.Fatalf("AGEMEM_SOAK=%q: %v", v, err)
	}
	return d
}

// soakStats counts replies by status (0: the request failed without a
// reply and the client had not abandoned it).
type soakStats struct {
	mu       sync.Mutex
	byStatus map[string]int // "200", "400 context_length_exceeded", ...
	fiveXX   []string
	requests atomic.Int64
	gone     atomic.Int64 // requests the client abandoned on purpose
}

func (s *soakStats) record(op string, status int, body []byte) {
	s.requests.Add(1)
	s.mu.Lock()
	defer s.mu.Unlock()
	key := fmt.Sprint(status)
	var e struct {
		Error struct{ Code string } `json:"error"`
	}
	if status >= 400 && json.Unmarshal(body, &e) == nil && e.Error.Code != "" {
		key += " " + e.Error.Code
	}
	s.byStatus[key]++
	if (status >= 500 || status == 0) && len(s.fiveXX) < 10 {
		s.fiveXX = append(s.fiveXX, fmt.Sprintf("%s: %d %s", op, status, body))
	}
}

// heapInUse is the live heap after a full collection.
func heapInUse() uint64 {
	runtime.GC()
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapAlloc
}

// TestSoak is the bounded soak of the serve-under-attack issue: clients of
// eight tenants run a mix of plain and streamed chat in sessions, memory
// API calls, malformed requests and requests they abandon at a random
// moment, against the real server (its listener, timeouts and limits) and
// a SQLite store, for AGEMEM_SOAK. It must end with zero 5xx and with
// goroutines and heap back where they were after a warm-up of the same mix.
// Each client deletes what it stores beyond a few dozen memories and reuses
// a few session ids, so what the server rightly keeps stays bounded.
func TestSoak(t *testing.T) {
	d := soakDuration(t)
	c := testConfig(t)
	const tenants, perTenant = 8, 2
	soakKeys(&c, tenants)
	addr := serveOn(t, newServer(t, c))
	base := "http://" + addr
	// A request that hangs (a lost slot, a deadlock) fails the soak as a
	// transport error instead of hanging it.
	client := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: 64}}
	defer client.CloseIdleConnections()

	run := func(d time.Duration, st *soakStats) {
		soakRun(tenants, perTenant, d, st, func(int) (*http.Client, string) { return client, base })
	}

	warm := newStats()
	run(min(d/4, 5*time.Second), warm)
	client.CloseIdleConnections()
	g0, h0 := goroutines(0), heapInUse()

	st := newStats()
	start := time.Now()
	run(d, st)
	elapsed := time.Since(start)
	client.CloseIdleConnections()
	g1 := goroutines(g0)
	h1 := heapInUse()

	var codes []string
	for k, v := range st.byStatus {
		codes = append(codes, fmt.Sprintf("%s: %d", k, v))
	}
	sort.Strings(codes)
	t.Logf("soak %s: %d requests (%.0f/s), %d abandoned by the client; statuses %s; goroutines %d -> %d; heap %.1f -> %.1f MiB",
		elapsed.Round(time.Second), st.requests.Load(), float64(st.requests.Load())/elapsed.Seconds(), st.gone.Load(),
		strings.Join(codes, ", "), g0, g1, float64(h0)/(1<<20), float64(h1)/(1<<20))
	if len(st.fiveXX) > 0 || len(warm.fiveXX) > 0 {
		t.Fatalf("5xx replies or failed requests: %v %v", warm.fiveXX, st.fiveXX)
	}
	if st.byStatus["200"] == 0 {
		t.Fatal("no request succeeded")
	}
	if g1 > g0+2 {
		t.Fatalf("goroutines %d after the soak, %d before", g1, g0)
	}
	// The heap may move by what the server rightly keeps (sessions, the
	// namespaces' caches: bounded by the clients' clean-up) and the
	// allocator's noise, not by what requests leave behind.
	if h1 > h0+8<<20 {
		t.Fatalf("heap %.1f MiB after the soak, %.1f MiB before", float64(h1)/(1<<20), float64(h0)/(1<<20))
	}
}

func newStats() *soakStats { return &soakStats{byStatus: map[string]int{}} }

// soakRun runs perTenant clients of each of tenants keys (sk-soak-N) for
// d; target gives client i its HTTP client and the server's base URL.
func soakRun(tenants, perTenant int, d time.Duration, st *soakStats, target func(i int) (*http.Client, string)) {
	var wg sync.WaitGroup
	stop := time.Now().Add(d)
	for i := range tenants * perTenant {
		client, base := target(i)
		wg.Go(func() { soakClient(client, base, fmt.Sprintf("sk-soak-%d", i/perTenant), i, stop, st) })
	}
	wg.Wait()
}

// soakKeys gives c the soak's tenants' keys.
func soakKeys(c *config, tenants int) {
	c.Serve.Keys = nil
	for i := range tenants {
		c.Serve.Keys = append(c.Serve.Keys, APIKey{Key: fmt.Sprintf("sk-soak-%d", i), Namespace: fmt.Sprintf("tenant%d", i)})
	}
}

// soakClient runs one client's random mix until stop.
func soakClient(client *http.Client, base, key string, id int, stop time.Time, st *soakStats) {
	rng := rand.New(rand.NewPCG(uint64(id), 7))
	send := func(ctx context.Context, op, method, path string, body any, read func(io.Reader) []byte) (status int, raw []byte) {
		var rd io.Reader
		switch b := body.(type) {
		case nil:
		case string:
			rd = strings.NewReader(b)
		default:
			raw, _ := json.Marshal(b)
			rd = bytes.NewReader(raw)
		}
		req, _ := http.NewRequestWithContext(ctx, method, base+path, rd)
		req.Header.Set("Authorization", "Bearer "+key)
		if rd != nil {
			req.Header.Set("Content-Type", "application/json")
		}
		resp, err := client.Do(req)
		if err != nil {
			if ctx.Err() != nil {
				st.gone.Add(1)
				return 0, nil
			}
			st.record(op, 0, []byte(err.Error()))
			return 0, nil
		}
		defer resp.Body.Close()
		if read != nil && resp.StatusCode == 200 {
			raw = read(resp.Body)
		} else {
			raw, _ = io.ReadAll(resp.Body)
		}
		if ctx.Err() != nil {
			st.gone.Add(1)
			return 0, nil
		}
		st.record(op, resp.StatusCode, raw)
		return resp.StatusCode, raw
	}
	prompts := []string{"Remember: the soak fact %d", "Recall: soak fact %d", "Forget: fact %d", "History?", "hello %d", "Break"}
	for n := 0; time.Now().Before(stop); n++ {
		session := fmt.Sprintf("s%d-%d", id, rng.IntN(4))
		user := prompts[rng.IntN(len(prompts))]
		if strings.Contains(user, "%d") {
			user = fmt.Sprintf(user, rng.IntN(1000))
		}
		ctx := context.Background()
		var cancel context.CancelFunc = func() {}
		if rng.IntN(8) == 0 { // abandon this one at a random moment
			ctx, cancel = context.WithTimeout(ctx, time.Duration(rng.IntN(20))*time.Millisecond)
		}
		var status int
		var raw []byte
		switch op := rng.IntN(10); {
		case op < 4:
			status, raw = send(ctx, "chat", "POST", "/v1/chat/completions", chatBody(session, user), nil)
		case op < 7:
			status, raw = send(ctx, "chat stream", "POST", "/v1/chat/completions", chatBody(session, user, "stream", true), func(r io.Reader) []byte {
				// Read event by event, as SSE clients do; a few stop
				// reading half-way and hang up.
				sc := bufio.NewScanner(r)
				for i := 0; sc.Scan(); i++ {
					if i == 3 && rng.IntN(4) == 0 {
						break
					}
				}
				return nil
			})
		case op == 7:
			send(ctx, "add", "POST", "/v1/memories", map[string]any{"content": fmt.Sprintf("note %d of client %d", n, id)}, nil)
		case op == 8:
			send(ctx, "search", "POST", "/v1/memories/search", map[string]any{"query": "note", "top_k": 3}, nil)
		default: // malformed on purpose: every one must be a 4xx
			bad := []string{`{"model": "agemem", "messages": [`, `{"model": "agemem", "messages": [{"role": "user", "content": "hi"}]} trailing`, `{"model": "agemem", "bogus": 1, "messages": [{"role": "user", "content": "hi"}]}`}
			send(ctx, "malformed", "POST", "/v1/chat/completions", bad[rng.IntN(len(bad))], nil)
		}
		cancel()
		// A session that outgrew the model is started afresh, as a chat
		// client does when told context_length_exceeded.
		if status == 400 && bytes.Contains(raw, []byte("context_length_exceeded")) {
			send(context.Background(), "delete session", "DELETE", "/v1/sessions/"+session, nil, nil)
		}
		if n%25 == 24 {
			prune(client, base, key, 40, st)
		}
	}
}

// prune deletes the namespace's memories beyond keep (oldest first), as a
// long-running client would.
func prune(client *http.Client, base, key string, keep int, st *soakStats) {
	req, _ := http.NewRequest("GET", base+"/v1/memories", nil)
	req.Header.Set("Authorization", "Bearer "+key)
	resp, err := client.Do(req)
	if err != nil {
		st.record("list", 0, []byte(err.Error()))
		return
	}
	var list struct {
		Data []struct {
			ID string `json:"memory_id"`
		} `json:"data"`
	}
	raw, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	st.record("list", resp.StatusCode, raw)
	json.Unmarshal(raw, &list)
	for i := 0; i < len(list.Data)-keep; i++ {
		req, _ := http.NewRequest("DELETE", base+"/v1/memories/"+list.Data[i].ID, nil)
		req.Header.Set("Authorization", "Bearer "+key)
		if resp, err := client.Do(req); err == nil {
			raw, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			st.record("delete", resp.StatusCode, raw)
		}
	}
}
