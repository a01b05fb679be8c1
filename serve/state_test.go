package serve

import (
	"bytes"
	"context"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/agemem/agemem/internal/pgschema"
	"github.com/agemem/agemem/internal/pgtest"
	"github.com/agemem/agemem/memtools/ltm"
)

// forEachState runs f with sessions and idempotency keys in this process
// and in PostgreSQL (a schema of the test's own; skipped without a
// database unless AGEMEM_REQUIRE_PG=1).
func forEachState(t *testing.T, f func(t *testing.T, c config)) {
	for _, name := range []string{"memory", "postgres"} {
		t.Run(name, func(t *testing.T) {
			c := testConfig(t)
			if name == "postgres" {
				c.StateDSN, _ = pgtest.Schema(t)
			}
			f(t, c)
		})
	}
}

// openPGStore is the PostgreSQL memory store at dsn, searched exactly;
// lazy opens it while the database is down.
func openPGStore(t *testing.T, dsn string, lazy bool) *ltm.Postgres {
	t.Helper()
	h := ltm.DefaultConfig().HNSW
	h.MinRows = 0
	db, err := ltm.OpenPostgres(context.Background(), ltm.PostgresOptions{DSN: dsn, HNSW: h, Lazy: lazy})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return db
}

// startOn serves c on the store db: a replica of a server whose state is
// c.StateDSN.
func startOn(t *testing.T, c config, be Backend, db ltm.DB) (*httptest.Server, *Server) {
	t.Helper()
	s, err := New(with(c.options(), func(o *Options) { o.Backend, o.Store = be, db }))
	if err != nil {
		t.Fatal(err)
	}
	ts := newHTTPTest(s)
	t.Cleanup(func() { ts.Close(); s.Close() })
	return ts, s
}

// turnOf is the session_turn of a chat reply's trace.
func turnOf(t *testing.T, r reply) int {
	t.Helper()
	tr, _ := r.json(t)["agemem"].(map[string]any)
	n, _ := tr["session_turn"].(float64)
	return int(n)
}

func contentOf(t *testing.T, r reply) string {
	t.Helper()
	m := r.json(t)
	return m["choices"].([]any)[0].(map[string]any)["message"].(map[string]any)["content"].(string)
}

// An Idempotency-Key makes a write's retry return the first answer: a
// memory stored once, a chat turn counted once, a stream replayed byte
// for byte; another request under a used key is a 422 naming it; keys are
// per tenant; a failure is not recorded.
func TestIdempotencyKey(t *testing.T) { forEachState(t, testIdempotencyKey) }

func testIdempotencyKey(t *testing.T, c config) {
	ts := start(t, c, newScripted())
	add := func(key, idem, content string) reply {
		return do(t, "POST", ts.URL+"/v1/memories", key, map[string]any{"content": content}, "Idempotency-Key", idem)
	}
	first := add(aliceKey, "k1", "Alice's cat is called Tabby")
	if first.Status != 201 || first.Header.Get("Idempotent-Replayed") != "" {
		t.Fatalf("first add: %d %s", first.Status, first.Body)
	}
	again := add(aliceKey, "k1", "Alice's cat is called Tabby")
	if again.Status != 201 || !bytes.Equal(again.Body, first.Body) || again.Header.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("the retry: %d %s (replayed %q); first %s", again.Status, again.Body, again.Header.Get("Idempotent-Replayed"), first.Body)
	}
	if r := add(aliceKey, "k1", "Alice's dog is called Rex"); r.Status != 422 || r.errorCode(t) != "idempotency_key_reused" || !strings.Contains(string(r.Body), `\"k1\"`) {
		t.Fatalf("another body under k1: %d %s", r.Status, r.Body)
	}
	if r := add(bobKey, "k1", "Bob's dog is called Rex"); r.Status != 201 || r.Header.Get("Idempotent-Replayed") != "" {
		t.Fatalf("bob's k1 is his own: %d %s", r.Status, r.Body)
	}
	if r := add(aliceKey, "bad key", "x"); r.Status != 400 || r.errorCode(t) != "invalid_idempotency_key" {
		t.Fatalf("a key with a space: %d %s", r.Status, r.Body)
	}
	// Eight retries of one key at once store one memory and give one answer.
	var wg sync.WaitGroup
	bodies := make([][]byte, 8)
	for i := range bodies {
		wg.Go(func() { bodies[i] = add(aliceKey, "k2", "Alice lives in Velden").Body })
	}
	wg.Wait()
	for _, b := range bodies[1:] {
		if !bytes.Equal(b, bodies[0]) {
			t.Fatalf("answers to one key differ: %s and %s", b, bodies[0])
		}
	}
	list := do(t, "GET", ts.URL+"/v1/memories", aliceKey, nil).json(t)["data"].([]any)
	if len(list) != 2 {
		t.Fatalf("alice holds %d memories after two keys, want 2: %v", len(list), list)
	}

	chat := func(idem, session, user string, extra ...any) reply {
		return do(t, "POST", ts.URL+"/v1/chat/completions", aliceKey, chatBody(session, user, extra...), "Idempotency-Key", idem)
	}
	a := chat("c1", "s", "my bike is red")
	b := chat("c1", "s", "my bike is red")
	if a.Status != 200 || !bytes.Equal(a.Body, b.Body) || b.Header.Get("Idempotent-Replayed") != "true" || b.Header.Get("X-Session-ID") != "s" {
		t.Fatalf("a chat's retry: %d %s then %d %s", a.Status, a.Body, b.Status, b.Body)
	}
	h := chat("c2", "s", "History?")
	if got := contentOf(t, h); got != "my bike is red | History?" || turnOf(t, h) != 2 {
		t.Fatalf("after a retried turn: %q, turn %d", got, turnOf(t, h))
	}
	s1 := chat("c3", "s", "hello", "stream", true)
	s2 := chat("c3", "s", "hello", "stream", true)
	if s1.Status != 200 || !bytes.Equal(s1.Body, s2.Body) || s2.Header.Get("Idempotent-Replayed") != "true" || !readSSE(t, s1.Body).done {
		t.Fatalf("a stream's retry:\n%s\nthen\n%s", s1.Body, s2.Body)
	}
	if h := chat("c4", "s", "History?"); turnOf(t, h) != 4 {
		t.Fatalf("turn %d after a replayed stream, want 4: %s", turnOf(t, h), h.Body)
	}
	for range 2 {
		if r := chat("c5", "s", "Break"); r.Status != 422 || r.Header.Get("Idempotent-Replayed") != "" {
			t.Fatalf("a failure is run again, not replayed: %d %s", r.Status, r.Body)
		}
	}
	id := first.json(t)["memory_id"].(string)
	for range 2 {
		if r := do(t, "DELETE", ts.URL+"/v1/memories/"+id, aliceKey, nil, "Idempotency-Key", "d1"); r.Status != 200 {
			t.Fatalf("a retried delete: %d %s", r.Status, r.Body)
		}
	}
	if r := do(t, "DELETE", ts.URL+"/v1/memories/"+id, aliceKey, nil); r.Status != 404 {
		t.Fatalf("a delete without a key: %d %s", r.Status, r.Body)
	}
}

// Two replicas on one database serve any request of any session: a turn
// on one continues on the other, a request of a session waits while the
// other replica runs one, an answer recorded under a key on one is
// replayed by the other, and a session deleted on one is gone on both.
func TestSessionsAcrossReplicas(t *testing.T) {
	c := testConfig(t)
	c.StateDSN, _ = pgtest.Schema(t)
	db := openPGStore(t, c.StateDSN, false)
	beA := newScripted()
	beA.calls = make(chan string, 64)
	a, _ := startOn(t, c, beA, db)
	b, _ := startOn(t, c, newScripted(), db)
	post := func(ts *httptest.Server, session, user string, hdr ...string) reply {
		return do(t, "POST", ts.URL+"/v1/chat/completions", aliceKey, chatBody(session, user), hdr...)
	}
	if r := post(a, "s", "my name is Ada"); r.Status != 200 || turnOf(t, r) != 1 {
		t.Fatalf("turn 1 on A: %d %s", r.Status, r.Body)
	}
	if r := post(b, "s", "History?"); contentOf(t, r) != "my name is Ada | History?" || turnOf(t, r) != 2 {
		t.Fatalf("turn 2 on B: %s", r.Body)
	}
	// A holds the session while its model runs; B's turn waits for it.
	ra := make(chan reply, 1)
	go func() { ra <- post(a, "s", "Wait") }()
	for call := range beA.calls {
		if call == "Wait" {
			break
		}
	}
	rb := make(chan reply, 1)
	go func() { rb <- post(b, "s", "History?") }()
	select {
	case r := <-rb:
		t.Fatalf("B answered while A held the session: %s", r.Body)
	case <-time.After(500 * time.Millisecond):
	}
	close(beA.gate)
	if r := <-ra; turnOf(t, r) != 3 {
		t.Fatalf("A's turn: %s", r.Body)
	}
	if r := <-rb; turnOf(t, r) != 4 || contentOf(t, r) != "my name is Ada | History? | Wait | History?" {
		t.Fatalf("B's turn after A's: %s", r.Body)
	}
	// A key's answer recorded on A is B's answer too.
	first := do(t, "POST", a.URL+"/v1/memories", aliceKey, map[string]any{"content": "Ada rides a red bike"}, "Idempotency-Key", "m1")
	again := do(t, "POST", b.URL+"/v1/memories", aliceKey, map[string]any{"content": "Ada rides a red bike"}, "Idempotency-Key", "m1")
	if first.Status != 201 || !bytes.Equal(first.Body, again.Body) || again.Header.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("a key across replicas: %s then %s", first.Body, again.Body)
	}
	if r := do(t, "DELETE", a.URL+"/v1/sessions/s", aliceKey, nil); r.Status != 200 {
		t.Fatalf("delete on A: %d %s", r.Status, r.Body)
	}
	if r := post(b, "s", "History?"); contentOf(t, r) != "History?" || turnOf(t, r) != 1 {
		t.Fatalf("the deleted session on B: %s", r.Body)
	}
}

// A database that goes away is an outage: a replica started while it is
// down comes up not ready and answers 503 with Retry-After, becomes ready
// when it returns; stopped under a running replica, the same; nothing
// acknowledged is lost and the pools reconnect by themselves.
func TestDatabaseOutage(t *testing.T) {
	cl := pgtest.NewCluster(t)
	cl.Stop(t)
	c := testConfig(t)
	c.StateDSN = cl.DSN
	ts, _ := startOn(t, c, newScripted(), openPGStore(t, cl.DSN, true))
	add := func(idem, content string) reply {
		return do(t, "POST", ts.URL+"/v1/memories", aliceKey, map[string]any{"content": content}, "Idempotency-Key", idem)
	}
	down := func(when string) {
		t.Helper()
		if r := do(t, "GET", ts.URL+"/readyz", "", nil); r.Status != 503 {
			t.Fatalf("%s: readyz %d %s", when, r.Status, r.Body)
		}
		for _, r := range []reply{add("k-down", "written while down"),
			do(t, "POST", ts.URL+"/v1/chat/completions", aliceKey, chatBody("s", "hello")),
			do(t, "POST", ts.URL+"/v1/memories/search", aliceKey, map[string]any{"query": "cat"})} {
			if r.Status != 503 || r.Header.Get("Retry-After") == "" || r.errorCode(t) != "store_unavailable" {
				t.Fatalf("%s: %d %s (Retry-After %q)", when, r.Status, r.Body, r.Header.Get("Retry-After"))
			}
		}
	}
	up := func() {
		t.Helper()
		deadline := time.Now().Add(30 * time.Second)
		for do(t, "GET", ts.URL+"/readyz", "", nil).Status != 200 {
			if time.Now().After(deadline) {
				t.Fatal("not ready 30 s after the database returned")
			}
			time.Sleep(200 * time.Millisecond)
		}
	}
	down("started with the database down")
	cl.Start(t)
	up()
	if r := add("k1", "Alice's cat is called Tabby"); r.Status != 201 {
		t.Fatalf("after the database came up: %d %s", r.Status, r.Body)
	}
	if r := do(t, "POST", ts.URL+"/v1/chat/completions", aliceKey, chatBody("s", "my name is Ada")); r.Status != 200 || turnOf(t, r) != 1 {
		t.Fatalf("a session's first turn: %d %s", r.Status, r.Body)
	}
	cl.Stop(t)
	down("the database stopped under the replica")
	cl.Start(t)
	up()
	if r := add("k1", "Alice's cat is called Tabby"); r.Status != 201 || r.Header.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("k1 after the restart: %d %s", r.Status, r.Body)
	}
	if r := add("k-down", "written while down"); r.Status != 201 || r.Header.Get("Idempotent-Replayed") != "" {
		t.Fatalf("the write refused while down, retried: %d %s", r.Status, r.Body)
	}
	if n := len(do(t, "GET", ts.URL+"/v1/memories", aliceKey, nil).json(t)["data"].([]any)); n != 2 {
		t.Fatalf("%d memories after the outages, want 2", n)
	}
	r := do(t, "POST", ts.URL+"/v1/chat/completions", aliceKey, chatBody("s", "History?"))
	if contentOf(t, r) != "my name is Ada | History?" || turnOf(t, r) != 2 {
		t.Fatalf("the session after the restart: %s", r.Body)
	}
}

// A session unused for serve.session_ttl starts afresh, and the request
// naming it is told so (session_reset "expired"), in either state.
func TestSessionExpires(t *testing.T) { forEachState(t, testSessionExpires) }

func testSessionExpires(t *testing.T, c config) {
	c.Serve.SessionTTL = time.Second
	ts := start(t, c, newScripted())
	post := func(user string) reply {
		return do(t, "POST", ts.URL+"/v1/chat/completions", aliceKey, chatBody("s", user))
	}
	post("my name is Ada")
	if r := post("History?"); contentOf(t, r) != "my name is Ada | History?" || turnOf(t, r) != 2 {
		t.Fatalf("within the TTL: %s", r.Body)
	}
	time.Sleep(1500 * time.Millisecond)
	r := post("History?")
	if tr := r.json(t)["agemem"].(map[string]any); tr["session_reset"] != "expired" || contentOf(t, r) != "History?" || turnOf(t, r) != 1 {
		t.Fatalf("past the TTL: %s", r.Body)
	}
	if r := post("History?"); r.json(t)["agemem"].(map[string]any)["session_reset"] != nil || turnOf(t, r) != 2 {
		t.Fatalf("the session after it restarted: %s", r.Body)
	}
}

// A replica that dies after deleting a memory and before recording its
// answer leaves its attempt noted under the key: the client's (or the
// load balancer's) retry on another replica finds the memory gone and
// answers as the first attempt would have, 200. A delete that ended in a
// client error is forgotten: its retry is a new request, 404 again.
func TestDeleteRetriedAfterAReplicaDied(t *testing.T) {
	c := testConfig(t)
	c.StateDSN, _ = pgtest.Schema(t)
	db := openPGStore(t, c.StateDSN, false)
	_, a := startOn(t, c, newScripted(), db)
	b, _ := startOn(t, c, newScripted(), db)
	m := do(t, "POST", b.URL+"/v1/memories", aliceKey, map[string]any{"content": "Ada rides a red bike"})
	id, _ := m.json(t)["memory_id"].(string)
	if m.Status != 201 || id == "" {
		t.Fatalf("add: %d %s", m.Status, m.Body)
	}
	// Replica A's attempt: the key claimed, the memory deleted, then its
	// process gone, which cuts its database connection.
	ctx := context.Background()
	h := a.state.hold().(*pgHold)
	fp := fingerprint(httptest.NewRequest("DELETE", "/v1/memories/"+id, nil), nil)
	if _, unfinished, err := h.claim(ctx, "alice", "d1", fp); err != nil || unfinished {
		t.Fatalf("A's claim: unfinished %v, %v", unfinished, err)
	}
	ns, err := db.Namespace("alice")
	if err != nil {
		t.Fatal(err)
	}
	if err := ns.Delete(ctx, id); err != nil {
		t.Fatal(err)
	}
	h.c.Conn().Close(ctx)
	h.c.Release()

	r := do(t, "DELETE", b.URL+"/v1/memories/"+id, aliceKey, nil, "Idempotency-Key", "d1")
	if r.Status != 200 || r.json(t)["deleted"] != true {
		t.Fatalf("the retry on B: %d %s", r.Status, r.Body)
	}
	if again := do(t, "DELETE", b.URL+"/v1/memories/"+id, aliceKey, nil, "Idempotency-Key", "d1"); !bytes.Equal(again.Body, r.Body) || again.Header.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("the recorded answer: %d %s", again.Status, again.Body)
	}
	for range 2 {
		if r := do(t, "DELETE", b.URL+"/v1/memories/mem_00000000", aliceKey, nil, "Idempotency-Key", "d2"); r.Status != 404 {
			t.Fatalf("a delete of no memory, under a key: %d %s", r.Status, r.Body)
		}
	}
}

// A database of the first serve schema, holding a session and a recorded
// answer, upgrades when a replica of this build starts on it: the session
// goes on where it was and the answer is replayed.
func TestServeSchemaUpgradeKeepsState(t *testing.T) {
	c := testConfig(t)
	c.StateDSN, _ = pgtest.Schema(t)
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, c.StateDSN)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	if _, err := pgschema.Apply(ctx, conn, "serve", pgStateMigrations[:1]); err != nil {
		t.Fatal(err)
	}
	body := []byte(`{"content":"Ada rides a red bike"}`)
	fp := fingerprint(httptest.NewRequest("POST", "/v1/memories", nil), body)
	answer := `{"memory_id":"mem_0a0b0c0d","content":"Ada rides a red bike"}`
	if _, err := conn.Exec(ctx, `INSERT INTO agemem_sessions VALUES ('alice', 's', $1, 1, now())`,
		[]byte(`[{"role":"user","content":"my name is Ada"},{"role":"assistant","content":"my name is Ada"}]`)); err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(ctx, `INSERT INTO agemem_idempotency VALUES ('alice', 'm1', $1, 201, '{"Content-Type":"application/json"}', $2, now() + interval '1 hour')`,
		fp, []byte(answer)); err != nil {
		t.Fatal(err)
	}
	db := openPGStore(t, c.StateDSN, false)
	ts, _ := startOn(t, c, newScripted(), db)
	if v, _ := pgschema.Version(ctx, conn, "serve"); v != len(pgStateMigrations) {
		t.Fatalf("serve schema version %d after the start, want %d", v, len(pgStateMigrations))
	}
	r := do(t, "POST", ts.URL+"/v1/chat/completions", aliceKey, chatBody("s", "History?"))
	if contentOf(t, r) != "my name is Ada | History?" || turnOf(t, r) != 2 {
		t.Fatalf("the session after the upgrade: %s", r.Body)
	}
	again := do(t, "POST", ts.URL+"/v1/memories", aliceKey, map[string]any{"content": "Ada rides a red bike"}, "Idempotency-Key", "m1")
	if string(again.Body) != answer || again.Header.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("the answer recorded before the upgrade: %d %s", again.Status, again.Body)
	}
}
