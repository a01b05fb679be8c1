package serve

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/agemem/agemem/memtools/ltm"
)

// A prompt under serve.max_prompt_tokens but over the model's positions is
// the client's error (400 context_length_exceeded), found before the agent
// loop starts, not a 500 from inside it.
func TestContextLengthExceeded(t *testing.T) {
	pol := randomPolicy(t)
	pol.Model.MaxPositions = 300
	c := testConfig(t)
	c.Agent.MaxSteps = 1
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
	long := strings.Repeat("word ", 400)
	if c.Agent.ContextBudget < 400 {
		t.Fatalf("the case needs agent.context_budget above the prompt, got %d", c.Agent.ContextBudget)
	}
	for _, stream := range []bool{false, true} {
		r := do(t, "POST", ts.URL+"/v1/chat/completions", aliceKey, chatBody("", long, "stream", stream, "max_tokens", 8))
		if r.Status != 400 || r.errorCode(t) != "context_length_exceeded" || !strings.Contains(string(r.Body), "maximum context length is 300") {
			t.Fatalf("stream=%v: %d %s", stream, r.Status, r.Body)
		}
	}
	// One that fits the positions only without its response: max_tokens counts.
	r := do(t, "POST", ts.URL+"/v1/chat/completions", aliceKey, chatBody("", strings.Repeat("word ", 40), "max_tokens", 290))
	if r.Status != 400 || r.errorCode(t) != "context_length_exceeded" {
		t.Fatalf("prompt + max_tokens over the positions: %d %s", r.Status, r.Body)
	}
}

// serveOn runs s.Serve on a loopback listener until the test ends.
func serveOn(t *testing.T, s *Server) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { s.Serve(ctx, ln); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	return ln.Addr().String()
}

func newServer(t *testing.T, c config) *Server {
	t.Helper()
	db, err := ltm.OpenSQLite(c.Memory.Path, ltm.SQLiteOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	s, err := New(with(c.options(), func(o *Options) { o.Backend, o.Store = newScripted(), db }))
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// dialFrom opens a connection to addr from another loopback address, so
// that it counts as another client.
func dialFrom(t *testing.T, local, addr string) net.Conn {
	t.Helper()
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(local)}, Timeout: 2 * time.Second}
	c, err := d.Dial("tcp", addr)
	if err != nil {
		t.Fatalf("dial from %s: %v", local, err)
	}
	return c
}

// rawJSONError reads a response from c and checks it is a JSON error with
// the given status and code.
func rawJSONError(t *testing.T, c net.Conn, status int, code string) {
	t.Helper()
	c.SetReadDeadline(time.Now().Add(3 * time.Second))
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatalf("want %d %s: %v", status, code, err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	r := reply{resp.StatusCode, resp.Header, raw}
	if r.Status != status || resp.Header.Get("Content-Type") != "application/json" || r.errorCode(t) != code {
		t.Fatalf("got %d %q %s; want %d %s as JSON", r.Status, resp.Header.Get("Content-Type"), raw, status, code)
	}
}

// Slow clients (silent, trickling headers, a body that never completes)
// are cut off by the read timeouts, a client is held to its share of
// connections, and everyone else is served meanwhile.
func TestSlowClientsAreBounded(t *testing.T) {
	c := testConfig(t)
	c.Serve.ReadHeaderTimeout, c.Serve.ReadTimeout, c.Serve.IdleTimeout = 300*time.Millisecond, 800*time.Millisecond, 800*time.Millisecond
	c.Serve.MaxConnectionsPerClient = 30
	addr := serveOn(t, newServer(t, c))

	var slow []net.Conn
	for i := range 30 {
		conn := dialFrom(t, "127.0.0.2", addr)
		slow = append(slow, conn)
		switch i % 3 {
		case 1: // headers, a byte at a time, never finished
			fmt.Fprint(conn, "GET /healthz HTTP/1.1\r\nHo")
		case 2: // a body that never arrives in full
			fmt.Fprintf(conn, "POST /v1/memories HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\nContent-Type: application/json\r\nContent-Length: 100000\r\n\r\n{\"content\": \"", aliceKey)
		}
	}
	// The 31st connection from that client is refused at once, in JSON.
	extra := dialFrom(t, "127.0.0.2", addr)
	rawJSONError(t, extra, 503, "max_connections_per_client")
	extra.Close()

	// Another client is served while they hang.
	t0 := time.Now()
	cl := &http.Client{Timeout: 2 * time.Second}
	resp, err := cl.Get("http://" + addr + "/healthz")
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("healthz while slow clients hang: %v %v", resp, err)
	}
	resp.Body.Close()
	if d := time.Since(t0); d > time.Second {
		t.Fatalf("healthz took %s", d)
	}
	// Every slow connection is closed by the server within the read
	// timeout (and a little scheduling slack).
	deadline := time.Now().Add(3 * time.Second)
	for i, conn := range slow {
		conn.SetReadDeadline(deadline)
		if _, err := io.Copy(io.Discard, conn); err != nil {
			t.Fatalf("slow connection %d still open after the timeouts: %v", i, err)
		}
		conn.Close()
	}
	// With them gone, the client may connect again.
	again := dialFrom(t, "127.0.0.2", addr)
	fmt.Fprint(again, "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
	again.SetReadDeadline(time.Now().Add(2 * time.Second))
	if resp, err := http.ReadResponse(bufio.NewReader(again), nil); err != nil || resp.StatusCode != 200 {
		t.Fatalf("after the slow connections closed: %v %v", resp, err)
	}
	again.Close()
}

// What net/http answers by itself (an unparsable request line, headers
// over serve.max_header_bytes), an unclean path and an MCP key naming
// another namespace all get the API's JSON errors.
func TestServerErrorsAreJSON(t *testing.T) {
	c := testConfig(t)
	c.Serve.MaxHeaderBytes = 4096
	addr := serveOn(t, newServer(t, c))
	send := func(raw string, status int, code string) {
		t.Helper()
		conn, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		io.WriteString(conn, raw)
		rawJSONError(t, conn, status, code)
	}
	send("GARBAGE\r\n\r\n", 400, "bad_request")
	send("GET /healthz HTTP/1.1\r\n\r\n", 400, "bad_request") // no Host header
	send("GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: "+strings.Repeat("a", 64<<10)+"\r\n\r\n", 431, "header_too_large")
	send("GET /v1/memories/../memories/x HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer "+aliceKey+"\r\n\r\n", 400, "invalid_path")
	send("GET //v1/memories HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer "+aliceKey+"\r\n\r\n", 400, "invalid_path")
	send("POST /mcp HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer "+bobKey+"\r\nX-AgeMem-Namespace: alice\r\nContent-Length: 2\r\n\r\n{}", 403, "namespace_forbidden")
	send("POST /mcp HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer sk-nobody-000000\r\nContent-Length: 2\r\n\r\n{}", 401, "invalid_api_key")
	// A good request on a kept-alive connection is untouched.
	resp, err := http.Get("http://" + addr + "/v1/models/agemem")
	if err != nil || resp.StatusCode != 401 {
		t.Fatalf("no key: %v %v", resp, err)
	}
}

// One tenant sending far more concurrent requests than its share gets
// fast 429s past its own queue, and another tenant is still served at
// once.
func TestGreedyTenantDoesNotStarveOthers(t *testing.T) {
	c := testConfig(t)
	c.Serve.MaxConcurrent, c.Serve.MaxQueue, c.Serve.MaxConcurrentPerKey, c.Serve.MaxQueuePerKey = 8, 8, 4, 4
	be := newScripted()
	be.calls = make(chan string, 64)
	ts := start(t, c, be)
	const n = 40
	replies := make([]reply, n)
	var wg sync.WaitGroup
	var answered atomic.Int64
	for i := range n {
		wg.Go(func() {
			replies[i] = do(t, "POST", ts.URL+"/v1/chat/completions", aliceKey, chatBody("", "Wait"))
			answered.Add(1)
		})
	}
	for range 4 { // alice's four slots are taken
		<-be.calls
	}
	deadline := time.Now().Add(5 * time.Second)
	for ts.srv.admit.keyGate(principalOf(t, ts, aliceKey)).Queued() < 4 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	t0 := time.Now()
	if got, _ := answer(t, ts, bobKey, "", "ping"); got != "echo: ping" {
		t.Fatalf("bob: %q", got)
	}
	<-be.calls // bob's own call
	if d := time.Since(t0); d > time.Second {
		t.Fatalf("bob waited %s behind alice's flood", d)
	}
	// Every request beyond alice's 8 is refused at once; the slots open only
	// after, or a late request would take one.
	for answered.Load() < n-8 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	close(be.gate)
	wg.Wait()
	ok, refused := 0, 0
	for _, r := range replies {
		switch {
		case r.Status == 200:
			ok++
		case r.Status == 429 && r.errorCode(t) == "key_queue_full" && r.Header.Get("Retry-After") != "":
			refused++
		default:
			t.Fatalf("alice: %d %s", r.Status, r.Body)
		}
	}
	if ok != 8 || refused != n-8 {
		t.Fatalf("alice: %d served, %d refused; want 8 (4 running, 4 queued) and %d", ok, refused, n-8)
	}
}

func principalOf(t *testing.T, ts *testServer, key string) string {
	t.Helper()
	p, err := ts.srv.keys.lookup(key)
	if err != nil {
		t.Fatal(err)
	}
	return p.KeyID
}

// serve.rate_limit: a key past its burst gets 429 with the wait in
// Retry-After; another key is not affected.
func TestRateLimitPerKey(t *testing.T) {
	c := testConfig(t)
	c.Serve.RateLimit, c.Serve.RateBurst = 0.5, 3
	ts := start(t, c, newScripted())
	for i := range 3 {
		if r := do(t, "GET", ts.URL+"/v1/memories", aliceKey, nil); r.Status != 200 {
			t.Fatalf("request %d within the burst: %d %s", i, r.Status, r.Body)
		}
	}
	r := do(t, "GET", ts.URL+"/v1/memories", aliceKey, nil)
	if r.Status != 429 || r.errorCode(t) != "rate_limited" || r.Header.Get("Retry-After") != "2" {
		t.Fatalf("past the burst: %d %s Retry-After %q", r.Status, r.Body, r.Header.Get("Retry-After"))
	}
	if r := do(t, "GET", ts.URL+"/v1/memories", bobKey, nil); r.Status != 200 {
		t.Fatalf("another key: %d %s", r.Status, r.Body)
	}
}

// Failing requests create no session, a tenant at its cap evicts only its
// own sessions, a server at max_sessions evicts from the tenant holding the
// most, and a request naming an evicted session is told so.
func TestSessionEvictionIsPerTenant(t *testing.T) { forEachState(t, testSessionEvictionIsPerTenant) }

func testSessionEvictionIsPerTenant(t *testing.T, c config) {
	c.Serve.MaxSessions, c.Serve.MaxSessionsPerNamespace = 4, 2
	ts := start(t, c, newScripted())
	post := func(key, session, user string) reply {
		return do(t, "POST", ts.URL+"/v1/chat/completions", key, chatBody(session, user))
	}
	if r := post(aliceKey, "a1", "Remember: the cat is grey"); r.Status != 200 {
		t.Fatalf("alice: %d %s", r.Status, r.Body)
	}
	// Bob's failing requests (the model breaks the format) leave nothing.
	for i := range 5 {
		if r := post(bobKey, fmt.Sprint("b-fail-", i), "Break"); r.Status != 422 {
			t.Fatalf("bob's failing request: %d %s", r.Status, r.Body)
		}
	}
	if n := sessionCount(t, ts.srv); n != 1 {
		t.Fatalf("%d sessions after 5 failed requests; want alice's one", n)
	}
	// Bob's live sessions beyond his cap evict his own.
	for i := range 3 {
		if r := post(bobKey, fmt.Sprint("b", i), "hi"); r.Status != 200 {
			t.Fatalf("bob: %d %s", r.Status, r.Body)
		}
	}
	// Alice's session is intact: it still holds the earlier turn.
	if got, _ := answer(t, ts, aliceKey, "a1", "History?"); !strings.Contains(got, "the cat is grey") {
		t.Fatalf("alice's session lost its context: %q", got)
	}
	// Bob's first session went, and he is told.
	r := post(bobKey, "b0", "hi")
	if tr := r.json(t)["agemem"].(map[string]any); tr["session_reset"] != "evicted" {
		t.Fatalf("bob's evicted session: %s", r.Body)
	}
	// At max_sessions (alice 2, bob 2) a new session of carol's (admin,
	// namespace carol) evicts from a tenant holding the most, never leaving
	// alice below her live session.
	post(aliceKey, "a2", "hi")
	if r := do(t, "POST", ts.URL+"/v1/chat/completions", adminKey, chatBody("c1", "hi"), "X-AgeMem-Namespace", "carol"); r.Status != 200 {
		t.Fatalf("carol: %d %s", r.Status, r.Body)
	}
	if n := sessionCount(t, ts.srv); n != 4 {
		t.Fatalf("%d sessions, want max_sessions 4", n)
	}
}

// An import whose client goes away mid-body writes nothing; the same
// export imported twice leaves one copy (ids are kept).
func TestImportIsAllOrNothingAndIdempotent(t *testing.T) {
	c := testConfig(t)
	ts := start(t, c, newScripted())
	var body strings.Builder
	for i := range 500 {
		fmt.Fprintf(&body, `{"memory_id":"mem_%08x","content":"fact number %d","created":"2026-01-02T03:04:05Z","updated":"2026-01-02T03:04:05Z"}`+"\n", i+1, i)
	}
	raw := body.String()
	conn, err := net.Dial("tcp", strings.TrimPrefix(ts.URL, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	fmt.Fprintf(conn, "POST /v1/memories/import HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\nContent-Type: application/x-ndjson\r\nContent-Length: %d\r\n\r\n%s",
		aliceKey, len(raw), raw[:len(raw)/2])
	conn.Close()
	time.Sleep(200 * time.Millisecond)
	count := func() int {
		r := do(t, "GET", ts.URL+"/v1/memories", aliceKey, nil)
		return len(r.json(t)["data"].([]any))
	}
	if n := count(); n != 0 {
		t.Fatalf("an import cut off mid-body wrote %d memories", n)
	}
	for range 2 {
		r := do(t, "POST", ts.URL+"/v1/memories/import", aliceKey, raw, "Content-Type", "application/x-ndjson")
		if r.Status != 200 {
			t.Fatalf("import: %d %s", r.Status, r.Body)
		}
	}
	if n := count(); n != 500 {
		t.Fatalf("the same export imported twice: %d memories, want 500", n)
	}
	r := do(t, "GET", ts.URL+"/v1/memories/mem_00000007", aliceKey, nil)
	if r.Status != 200 || r.json(t)["content"] != "fact number 6" || r.json(t)["created"] != "2026-01-02T03:04:05Z" {
		t.Fatalf("an imported memory keeps its id and timestamps: %d %s", r.Status, r.Body)
	}
	// A malformed line anywhere writes nothing either.
	bad := raw + "{not json}\n"
	if r := do(t, "POST", ts.URL+"/v1/memories/import", bobKey, bad); r.Status != 400 || count() != 500 {
		t.Fatalf("malformed import: %d %s", r.Status, r.Body)
	}
	if r := do(t, "GET", ts.URL+"/v1/memories", bobKey, nil); len(r.json(t)["data"].([]any)) != 0 {
		t.Fatalf("bob's namespace after a malformed import: %s", r.Body)
	}
}

// Hundreds of concurrent writers queue for the store instead of failing:
// no 500, and no error shows the store's file.
func TestConcurrentWritersQueue(t *testing.T) {
	c := testConfig(t)
	c.Serve.MaxConnectionsPerClient = 1000
	ts := start(t, c, newScripted())
	const n = 400
	replies := make([]reply, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			key := []string{aliceKey, bobKey}[i%2]
			replies[i] = do(t, "POST", ts.URL+"/v1/memories", key, map[string]any{"content": fmt.Sprint("note ", i)})
		})
	}
	wg.Wait()
	for i, r := range replies {
		if r.Status != 201 {
			t.Fatalf("writer %d: %d %s", i, r.Status, r.Body)
		}
	}
	total := 0
	for _, key := range []string{aliceKey, bobKey} {
		total += len(do(t, "GET", ts.URL+"/v1/memories", key, nil).json(t)["data"].([]any))
	}
	if total != n {
		t.Fatalf("%d memories stored of %d acknowledged", total, n)
	}
}

// A full write queue is a 503 with Retry-After; a store failure is a 500
// that names no file.
func TestStoreErrorsAreRetryableAndOpaque(t *testing.T) {
	c := testConfig(t)
	ts := start(t, c, newScripted())
	e := ts.srv.storeError(ltm.ErrBusy)
	if e.Status != 503 || e.retryAfter != 1 || e.Code != "store_busy" {
		t.Fatalf("a full write queue: %+v", e)
	}
	ts.db.Close() // every later store call fails
	r := do(t, "POST", ts.URL+"/v1/memories", aliceKey, map[string]any{"content": "x"})
	if r.Status != 500 || r.errorCode(t) != "store_error" || strings.Contains(string(r.Body), c.Memory.Path) || strings.Contains(string(r.Body), "memory.db") {
		t.Fatalf("a failed store: %d %s", r.Status, r.Body)
	}
}

// sessionCount is the sessions srv's state holds.
func sessionCount(t *testing.T, srv *Server) int {
	t.Helper()
	n, err := srv.state.sessions(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return n
}
