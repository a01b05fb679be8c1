package serve

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/agemem/agemem/internal/pgtest"
)

// replicaSoakDuration is how long TestReplicaSoak sends traffic:
// AGEMEM_REPLICA_SOAK (a Go duration), or 40 s, which keeps the test
// within about a minute and a half in CI.
func replicaSoakDuration(t *testing.T) time.Duration {
	v := os.Getenv("AGEMEM_REPLICA_SOAK")
	if v == "" {
		return 40 * time.Second
	}
	d, err := time.ParseDuration(v)
	if err != nil || d < 10*time.Second {
		t.Fatalf("AGEMEM_REPLICA_SOAK=%q: a Go duration of 10s or more", v)
	}
	return d
}

// TestReplicaSoak is the loopback soak: three serve processes on
// one PostgreSQL behind HAProxy, 16 clients of 8 tenants (chat plain and
// streamed in sessions, memory writes with Idempotency-Keys, concurrent
// identical adds, searches, deletes); one replica SIGKILLed mid-traffic and
// restarted; the database restarted mid-traffic. A client retries what
// did not get an answer (a transport error, a cut stream, a 502/503/504)
// with the same key, as a client of an API with idempotency keys does.
// Afterwards: every acknowledged write is readable, no key has two
// different answers, no tenant read another's memory, concurrent identical
// adds made one memory, every session's turns went on without a gap or a
// repeat, and the only 5xx are 503s while the database was down.
func TestReplicaSoak(t *testing.T) {
	haproxyBin(t)
	d := replicaSoakDuration(t)
	cl := pgtest.NewCluster(t)
	const tenants, perTenant = 8, 2
	rs := make([]*replica, 3)
	for i := range rs {
		rs[i] = newReplica(t, fmt.Sprint("r", i+1), cl.DSN, tenants)
		rs[i].start(t)
	}
	for _, r := range rs {
		r.await(t, "/readyz")
	}
	w := &soakWorld{base: "http://" + haproxyFor(t, rs), byStatus: map[string]int{}, acks: map[string]string{},
		added: map[string]string{}, deleted: map[string]bool{},
		client: &http.Client{Timeout: 2 * time.Minute, Transport: &http.Transport{MaxIdleConnsPerHost: 64}}}
	defer w.client.CloseIdleConnections()
	// Every replica takes traffic before the chaos.
	time.Sleep(time.Second)

	start := time.Now()
	stop := start.Add(d)
	var wg sync.WaitGroup
	for i := range tenants * perTenant {
		wg.Go(func() { w.runClient(i, i/perTenant, stop) })
	}
	var killAt, dbDown, dbUp time.Time
	time.Sleep(d * 3 / 10)
	killAt = time.Now()
	rs[1].kill()
	time.Sleep(3 * time.Second)
	rs[1].start(t)
	time.Sleep(time.Until(start.Add(d * 6 / 10)))
	dbDown = time.Now()
	cl.Stop(t)
	time.Sleep(4 * time.Second)
	cl.Start(t)
	dbUp = time.Now()
	wg.Wait()
	elapsed := time.Since(start)

	// The 503s of the database's outage: from its stop until the replicas
	// have reconnected and HAProxy's checks see them ready again.
	outageEnd := dbUp.Add(15 * time.Second)
	var outage503, other5xx int
	var bad []string
	for _, f := range w.fails {
		switch {
		case f.status == 503 && !f.at.Before(dbDown) && f.at.Before(outageEnd):
			outage503++
		case f.status >= 500:
			other5xx++
			bad = append(bad, fmt.Sprintf("%s at +%s: %d %s", f.op, f.at.Sub(start).Round(time.Millisecond), f.status, f.body))
		}
	}
	w.check(t, tenants)

	var codes []string
	for k, v := range w.byStatus {
		codes = append(codes, fmt.Sprintf("%s: %d", k, v))
	}
	sort.Strings(codes)
	t.Logf("replica soak %s (r2 SIGKILLed at +%s, database down +%s to +%s): %d operations in %d attempts; answers %s",
		elapsed.Round(time.Second), killAt.Sub(start).Round(time.Second), dbDown.Sub(start).Round(time.Second), dbUp.Sub(start).Round(time.Second),
		w.ops, w.attempts, strings.Join(codes, ", "))
	t.Logf("acknowledged: %d memory adds (%d readable at the end, %d deleted), %d facts stored by chat, %d chat turns in %d sessions, %d identical-add pairs (one memory each), %d replayed answers; "+
		"retried: %d cut streams or connections; 5xx: %d 503s during the database outage, %d others",
		len(w.added), w.readable, len(w.deleted), len(w.facts), w.turns, w.sessions, w.twins, w.replays, w.cut, outage503, other5xx)
	if len(bad) > 0 {
		t.Errorf("5xx other than the outage's 503s:\n%s", strings.Join(bad[:min(len(bad), 10)], "\n"))
	}
	if len(w.violations) > 0 {
		t.Fatalf("%d violations:\n%s", len(w.violations), strings.Join(w.violations[:min(len(w.violations), 20)], "\n"))
	}
	if w.turns == 0 || len(w.added) == 0 || w.twins == 0 {
		t.Fatal("the soak acknowledged nothing of some kind")
	}
}

// soakWorld is what the clients of TestReplicaSoak did and saw.
type soakWorld struct {
	base   string
	client *http.Client

	mu       sync.Mutex
	ops      int
	attempts int
	byStatus map[string]int    // every attempt's answer: "201", "503 store_unavailable", "cut"
	fails    []failure         // the 5xx answers
	acks     map[string]string // Idempotency-Key → the first acknowledged answer
	// Memory ids are a namespace's: two tenants may hold one id, so both
	// maps are keyed by "tenant/id".
	added      map[string]string // tenant/id → "tenant\x00content", acknowledged
	deleted    map[string]bool   // acknowledged deletes
	facts      []string          // "tenant\x00content" stored by a chat turn (Add_memory)
	violations []string
	turns      int
	sessions   int
	twins      int
	replays    int
	cut        int
	readable   int
}

type failure struct {
	op, body string
	status   int
	at       time.Time
}

func (w *soakWorld) violate(format string, args ...any) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.violations = append(w.violations, fmt.Sprintf(format, args...))
}

// soakAnswer is one operation's final answer.
type soakAnswer struct {
	status   int
	body     []byte
	replayed bool
	retried  bool // an earlier attempt got no answer, or an outage's
}

// send runs one operation until it is answered: a transport error, a cut
// stream or a 502/503/504 is retried, with the same Idempotency-Key, after
// Retry-After; it gives up after two minutes.
func (w *soakWorld) send(tenant int, op, method, path string, body any, key string, stream bool) soakAnswer {
	raw, _ := json.Marshal(body)
	w.mu.Lock()
	w.ops++
	w.mu.Unlock()
	var a soakAnswer
	for deadline := time.Now().Add(2 * time.Minute); time.Now().Before(deadline); a.retried = true {
		var rd io.Reader
		if body != nil {
			rd = bytes.NewReader(raw)
		}
		req, _ := http.NewRequest(method, w.base+path, rd)
		req.Header.Set("Authorization", "Bearer sk-soak-"+strconv.Itoa(tenant))
		if key != "" {
			req.Header.Set("Idempotency-Key", key)
		}
		status, got, wait, hdr := w.attempt(req, stream)
		label := strconv.Itoa(status)
		var e struct {
			Error struct{ Code string } `json:"error"`
		}
		if status >= 400 && json.Unmarshal(got, &e) == nil && e.Error.Code != "" {
			label += " " + e.Error.Code
		}
		if status == 0 {
			label = "cut"
		}
		w.mu.Lock()
		w.attempts++
		w.byStatus[label]++
		if status >= 500 {
			w.fails = append(w.fails, failure{op: op, status: status, body: string(got[:min(len(got), 300)]), at: time.Now()})
		}
		if status == 0 {
			w.cut++
		}
		w.mu.Unlock()
		if status != 0 && status != 502 && status != 503 && status != 504 {
			a.status, a.body, a.replayed = status, got, hdr.Get("Idempotent-Replayed") == "true"
			return a
		}
		time.Sleep(wait)
	}
	w.violate("%s %s: no answer in two minutes", op, path)
	return a
}

// attempt sends req once; status 0 is no complete answer (a transport
// error, or a stream that ended without [DONE]). A stream that ends with
// an error event is answered by that error's status, as a plain request
// would be.
func (w *soakWorld) attempt(req *http.Request, stream bool) (status int, body []byte, wait time.Duration, hdr http.Header) {
	wait = 200 * time.Millisecond
	resp, err := w.client.Do(req)
	if err != nil {
		return 0, []byte(err.Error()), wait, nil
	}
	defer resp.Body.Close()
	body, err = io.ReadAll(resp.Body)
	if err != nil {
		return 0, []byte(err.Error()), wait, nil
	}
	if s, err := strconv.Atoi(resp.Header.Get("Retry-After")); err == nil {
		wait = time.Duration(s) * time.Second
	}
	if stream && resp.StatusCode == 200 {
		if !bytes.HasSuffix(body, []byte("data: [DONE]\n\n")) {
			return 0, body, wait, nil
		}
		if ev := streamError(body); ev != nil {
			return ev.Status, ev.raw, time.Second, resp.Header
		}
	}
	return resp.StatusCode, body, wait, resp.Header
}

type streamErr struct {
	Status int
	raw    []byte
}

// streamError is the error event a stream ended with, if any; its status
// is that of the same error answered as a plain request.
func streamError(body []byte) *streamErr {
	for _, l := range strings.Split(string(body), "\n") {
		data, ok := strings.CutPrefix(l, "data: ")
		if !ok || data == "[DONE]" {
			continue
		}
		var e struct {
			Error *struct{ Code string } `json:"error"`
		}
		if json.Unmarshal([]byte(data), &e) == nil && e.Error != nil {
			st := 500
			switch e.Error.Code {
			case "store_unavailable", "session_conflict", "store_busy":
				st = 503
			case "tool_format_error", "answer_cut":
				st = 422
			}
			return &streamErr{Status: st, raw: []byte(data)}
		}
	}
	return nil
}

// chatReply is what a chat answer says: its content and the session's turn.
func chatReply(body []byte, stream bool) (content string, turn int, reset string, ok bool) {
	var tr struct {
		SessionTurn  int    `json:"session_turn"`
		SessionReset string `json:"session_reset"`
	}
	if !stream {
		var m struct {
			Choices []struct{ Message struct{ Content string } } `json:"choices"`
			AgeMem  json.RawMessage                              `json:"agemem"`
		}
		if json.Unmarshal(body, &m) != nil || len(m.Choices) != 1 || json.Unmarshal(m.AgeMem, &tr) != nil {
			return "", 0, "", false
		}
		return m.Choices[0].Message.Content, tr.SessionTurn, tr.SessionReset, true
	}
	var sb strings.Builder
	sc := bufio.NewScanner(bytes.NewReader(body))
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		data, found := strings.CutPrefix(sc.Text(), "data: ")
		if !found || data == "[DONE]" {
			continue
		}
		var ev struct {
			Choices []struct{ Delta struct{ Content string } } `json:"choices"`
			AgeMem  json.RawMessage                            `json:"agemem"`
		}
		if json.Unmarshal([]byte(data), &ev) != nil {
			return "", 0, "", false
		}
		for _, c := range ev.Choices {
			sb.WriteString(c.Delta.Content)
		}
		if len(ev.AgeMem) > 0 && json.Unmarshal(ev.AgeMem, &tr) != nil {
			return "", 0, "", false
		}
	}
	return sb.String(), tr.SessionTurn, tr.SessionReset, tr.SessionTurn > 0
}

// soakSession is what a client knows of one of its sessions.
type soakSession struct {
	id    string
	turns int
	users []string // the user messages of its acknowledged turns
}

// runClient is one client of tenant until stop.
func (w *soakWorld) runClient(id, tenant int, stop time.Time) {
	rng := rand.New(rand.NewPCG(uint64(id), 11))
	tag := fmt.Sprintf("t%d c%d", tenant, id) // every content this client writes starts with it
	var sessions []*soakSession
	for i := range 3 {
		sessions = append(sessions, &soakSession{id: fmt.Sprintf("c%d-s%d", id, i)})
	}
	generation := 3
	var mine []string // ids of this client's acknowledged adds, not deleted
	addOne := func(op, content, key string) (string, bool) {
		a := w.send(tenant, op, "POST", "/v1/memories", map[string]any{"content": content}, key, false)
		if a.status != 201 {
			w.violate("%s %q: %d %s", op, content, a.status, a.body)
			return "", false
		}
		var m struct {
			ID      string `json:"memory_id"`
			Content string `json:"content"`
		}
		json.Unmarshal(a.body, &m)
		w.ack(key, a)
		if m.Content != content {
			w.violate("%s %q answered with %s", op, content, a.body)
		}
		w.mu.Lock()
		w.added[fmt.Sprint(tenant, "/", m.ID)] = fmt.Sprint(tenant, "\x00", content)
		w.mu.Unlock()
		return m.ID, true
	}
	for n := 0; time.Now().Before(stop); n++ {
		key := fmt.Sprintf("c%d-op%d", id, n)
		switch op := rng.IntN(20); {
		case op < 10: // a chat turn, plain or streamed
			s := sessions[rng.IntN(len(sessions))]
			if s.turns >= 12 { // a session that grew long is left for a new one
				*s = soakSession{id: fmt.Sprintf("c%d-s%d", id, generation)}
				generation++
			}
			var user string
			switch rng.IntN(3) {
			case 0:
				user = fmt.Sprintf("Remember: %s fact %d", tag, n)
			case 1:
				user = fmt.Sprintf("hello %d", n)
			default:
				user = "History?"
			}
			stream := op >= 6
			a := w.send(tenant, "chat", "POST", "/v1/chat/completions", chatBody(s.id, user, "stream", stream), key, stream)
			if a.status != 200 {
				w.violate("chat %s %q: %d %s", s.id, user, a.status, a.body)
				continue
			}
			w.ack(key, a)
			content, turn, reset, ok := chatReply(a.body, stream)
			s.users = append(s.users, user)
			switch {
			case !ok:
				w.violate("chat %s: an answer without a session turn: %s", s.id, a.body)
			case reset != "" || turn != s.turns+1:
				w.violate("session %s of tenant %d: turn %d (reset %q) after %d", s.id, tenant, turn, reset, s.turns)
			case user == "History?" && content != strings.Join(s.users, " | "):
				w.violate("session %s: history %q, want %q", s.id, content, strings.Join(s.users, " | "))
			}
			if s.turns == 0 {
				w.mu.Lock()
				w.sessions++
				w.mu.Unlock()
			}
			s.turns = turn
			w.mu.Lock()
			w.turns++
			if strings.HasPrefix(user, "Remember: ") {
				w.facts = append(w.facts, fmt.Sprint(tenant, "\x00", strings.TrimPrefix(user, "Remember: ")))
			}
			w.mu.Unlock()
		case op < 14: // a memory write
			if id, ok := addOne("add", fmt.Sprintf("%s note %d", tag, n), key); ok {
				mine = append(mine, id)
			}
		case op == 14: // the same content added twice at once, under two keys
			content := fmt.Sprintf("%s twin %d", tag, n)
			var ids [2]string
			var wg sync.WaitGroup
			for i := range ids {
				wg.Go(func() { ids[i], _ = addOne("twin add", content, fmt.Sprintf("%s-%d", key, i)) })
			}
			wg.Wait()
			if ids[0] == "" || ids[0] != ids[1] {
				w.violate("identical adds of %q: ids %q and %q", content, ids[0], ids[1])
			} else {
				mine = append(mine, ids[0])
				w.mu.Lock()
				w.twins++
				w.mu.Unlock()
			}
		case op < 18: // a search: only the tenant's memories
			a := w.send(tenant, "search", "POST", "/v1/memories/search", map[string]any{"query": "note fact", "top_k": 5}, "", false)
			var res struct {
				Data []struct{ Content string } `json:"data"`
			}
			if a.status != 200 || json.Unmarshal(a.body, &res) != nil {
				w.violate("search: %d %s", a.status, a.body)
				continue
			}
			for _, r := range res.Data {
				if !strings.HasPrefix(r.Content, fmt.Sprintf("t%d ", tenant)) {
					w.violate("tenant %d read another's memory: %q", tenant, r.Content)
				}
			}
		default: // a delete of one of the client's memories
			if len(mine) == 0 {
				continue
			}
			i := rng.IntN(len(mine))
			mid := mine[i]
			a := w.send(tenant, "delete", "DELETE", "/v1/memories/"+mid, nil, key, false)
			// Always 200, a retry's too (the load balancer's after a
			// replica died mid-request, or the client's after a 503):
			// one whose first attempt deleted the memory and recorded
			// no answer finds it gone and answers as that attempt would.
			if a.status != 200 {
				w.violate("delete %s: %d %s", mid, a.status, a.body)
				continue
			}
			w.ack(key, a)
			mine = append(mine[:i], mine[i+1:]...)
			w.mu.Lock()
			w.deleted[fmt.Sprint(tenant, "/", mid)] = true
			w.mu.Unlock()
		}
	}
}

// ack records a key's answer: every answer under one key must be the first.
func (w *soakWorld) ack(key string, a soakAnswer) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if a.replayed {
		w.replays++
	}
	if first, ok := w.acks[key]; ok && first != string(a.body) {
		w.violations = append(w.violations, fmt.Sprintf("key %s answered twice, differently: %s then %s", key, first, a.body))
	}
	w.acks[key] = string(a.body)
}

// check reads every tenant's memories: each acknowledged add is there
// (unless deleted), each acknowledged delete is not, each fact a chat
// stored is there, once, and nothing of another tenant.
func (w *soakWorld) check(t *testing.T, tenants int) {
	held := map[string]string{} // tenant/id → tenant\x00content
	count := map[string]int{}   // tenant\x00content → copies
	for tenant := range tenants {
		a := w.send(tenant, "list", "GET", "/v1/memories", nil, "", false)
		var list struct {
			Data []struct {
				ID      string `json:"memory_id"`
				Content string `json:"content"`
			} `json:"data"`
		}
		if a.status != 200 || json.Unmarshal(a.body, &list) != nil {
			t.Fatalf("list tenant %d: %d %s", tenant, a.status, a.body)
		}
		for _, m := range list.Data {
			k := fmt.Sprint(tenant, "\x00", m.Content)
			held[fmt.Sprint(tenant, "/", m.ID)] = k
			if count[k]++; count[k] == 2 {
				w.violate("tenant %d holds %q twice", tenant, m.Content)
			}
			if !strings.HasPrefix(m.Content, fmt.Sprintf("t%d ", tenant)) {
				w.violate("tenant %d holds another's memory %q", tenant, m.Content)
			}
		}
	}
	for id, want := range w.added {
		got, ok := held[id]
		switch {
		case w.deleted[id] && ok:
			w.violate("memory %s was deleted (acknowledged) and is still there", id)
		case !w.deleted[id] && got != want:
			w.violate("acknowledged memory %s (%q) reads %q", id, want, got)
		case !w.deleted[id]:
			w.readable++
		}
	}
	for _, f := range w.facts {
		if count[f] == 0 { // clients delete only their notes and twins
			w.violate("a fact a chat turn stored is gone: %q", f)
		}
	}
}
