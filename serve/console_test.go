package serve

import (
	"bufio"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/cookiejar"
	"net/url"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/agemem/agemem/memtools"
	"github.com/agemem/agemem/memtools/ltm"
	"github.com/agemem/agemem/model/train"
)

// startLogged is start with the server's log kept.
func startLogged(t *testing.T, c config) (*testServer, *logBuffer) {
	t.Helper()
	logs := &logBuffer{}
	db, err := ltm.OpenSQLite(c.Memory.Path, ltm.SQLiteOptions{})
	if err != nil {
		t.Fatal(err)
	}
	s, err := New(with(c.options(), func(o *Options) {
		o.Backend, o.Store, o.Logger = newScripted(), db, slog.New(slog.NewJSONHandler(logs, nil))
	}))
	if err != nil {
		t.Fatal(err)
	}
	ts := &testServer{Server: newHTTPTest(s), srv: s, db: db}
	t.Cleanup(func() { ts.Close(); s.Close(); db.Close() })
	return ts, logs
}

// visitor is a browser-like client of the console: a cookie jar, no
// redirects followed (the tests read them), and the last CSRF token seen.
type visitor struct {
	t    testing.TB
	c    *http.Client
	base string
	csrf string
}

var (
	csrfRE  = regexp.MustCompile(`name="csrf" value="([^"]+)"`)
	nonceRE = regexp.MustCompile(`name="nonce" value="([^"]+)"`)
)

func newVisitor(t testing.TB, base string) *visitor {
	jar, _ := cookiejar.New(nil)
	return &visitor{t: t, base: base, c: &http.Client{Jar: jar, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}}
}

func (v *visitor) do(req *http.Request) (int, http.Header, string) {
	v.t.Helper()
	resp, err := v.c.Do(req)
	if err != nil {
		v.t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	body := string(raw)
	if m := csrfRE.FindStringSubmatch(body); m != nil {
		v.csrf = m[1]
	}
	return resp.StatusCode, resp.Header, body
}

func (v *visitor) get(path string) (int, http.Header, string) {
	v.t.Helper()
	req, _ := http.NewRequest("GET", v.base+path, nil)
	return v.do(req)
}

// post sends a form; with the visitor's CSRF token unless form has one.
func (v *visitor) post(path string, form url.Values, hdr ...string) (int, http.Header, string) {
	v.t.Helper()
	if !form.Has("csrf") {
		form.Set("csrf", v.csrf)
	}
	req, _ := http.NewRequest("POST", v.base+path, strings.NewReader(form.Encode()))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	return v.do(req)
}

// login logs in with key through the form and returns the status of the
// form's answer.
func (v *visitor) login(key string) int {
	v.t.Helper()
	code, _, body := v.get("/ui/login")
	m := nonceRE.FindStringSubmatch(body)
	if code != 200 || m == nil {
		v.t.Fatalf("login page: %d\n%s", code, body)
	}
	code, _, _ = v.post("/ui/login", url.Values{"key": {key}, "nonce": {m[1]}, "next": {"/ui/memories"}})
	if code == http.StatusSeeOther {
		v.get("/ui/memories") // a page, for its CSRF token
	}
	return code
}

func addViaAPI(t *testing.T, ts *testServer, key, content string) string {
	t.Helper()
	r := do(t, "POST", ts.URL+"/v1/memories", key, map[string]any{"content": content})
	if r.Status != http.StatusCreated {
		t.Fatalf("add: %d %s", r.Status, r.Body)
	}
	return r.json(t)["memory_id"].(string)
}

// auditLines are the audit records of the server's log.
func auditLines(t *testing.T, logs *logBuffer) []map[string]any {
	var out []map[string]any
	sc := bufio.NewScanner(strings.NewReader(logs.String()))
	for sc.Scan() {
		var m map[string]any
		if json.Unmarshal(sc.Bytes(), &m) == nil && m["msg"] == "audit" {
			out = append(out, m)
		}
	}
	return out
}

// TestConsoleEditsAreTheAPIsOperations: a memory edited and deleted on the
// console pages is what the memory API then reads, and each change is an
// audit line of the same operation as the API's, naming the same key.
func TestConsoleEditsAreTheAPIsOperations(t *testing.T) {
	ts, logs := startLogged(t, testConfig(t))
	id := addViaAPI(t, ts, aliceKey, "Alice's cat is called Miso")
	v := newVisitor(t, ts.URL)
	if code := v.login(aliceKey); code != http.StatusSeeOther {
		t.Fatalf("login: %d", code)
	}
	if _, _, body := v.get("/ui/memories"); !strings.Contains(body, "Alice&#39;s cat is called Miso") {
		t.Fatalf("the list lacks the memory added through the API:\n%s", body)
	}
	code, hdr, _ := v.post("/ui/memories/"+id, url.Values{"content": {"Alice's cat is called Mochi"}, "metadata": {`{"pet": "cat"}`}})
	if code != http.StatusSeeOther || !strings.Contains(hdr.Get("Location"), "done=updated") {
		t.Fatalf("edit: %d %v", code, hdr)
	}
	got := do(t, "GET", ts.URL+"/v1/memories/"+id, aliceKey, nil).json(t)
	if got["content"] != "Alice's cat is called Mochi" || got["metadata"].(map[string]any)["pet"] != "cat" {
		t.Fatalf("the API reads %v after the console's edit", got)
	}
	if code, _, _ := v.post("/ui/memories/"+id+"/delete", url.Values{}); code != http.StatusSeeOther {
		t.Fatalf("delete: %d", code)
	}
	if r := do(t, "GET", ts.URL+"/v1/memories/"+id, aliceKey, nil); r.Status != http.StatusNotFound {
		t.Fatalf("the API still has the memory the console deleted: %d", r.Status)
	}
	id2 := addViaAPI(t, ts, aliceKey, "second")
	do(t, "DELETE", ts.URL+"/v1/memories/"+id2, aliceKey, nil)
	var trail []string
	for _, a := range auditLines(t, logs) {
		trail = append(trail, a["op"].(string)+" "+a["via"].(string)+" "+a["namespace"].(string)+" "+a["key"].(string))
	}
	alice := func() string { p, _ := ts.srv.keys.lookup(aliceKey); return p.KeyID }()
	want := []string{"memory.add api alice " + alice, "memory.update console alice " + alice, "memory.delete console alice " + alice,
		"memory.add api alice " + alice, "memory.delete api alice " + alice}
	if strings.Join(trail, "\n") != strings.Join(want, "\n") {
		t.Fatalf("audit trail:\n%s\nwant:\n%s", strings.Join(trail, "\n"), strings.Join(want, "\n"))
	}
}

// TestConsoleRefusesForgedAndForeignRequests: a state-changing form without
// its login's CSRF token, one from another site, one naming another
// tenant's namespace and one before login each change nothing; a key never
// travels in a URL; the login cookie is HttpOnly and SameSite=Strict; every
// page carries the Content-Security-Policy; a login cannot be sent on to
// another site.
func TestConsoleRefusesForgedAndForeignRequests(t *testing.T) {
	ts := start(t, testConfig(t), newScripted())
	id := addViaAPI(t, ts, aliceKey, "keep me")
	count := func() int {
		return len(do(t, "GET", ts.URL+"/v1/memories", aliceKey, nil).json(t)["data"].([]any))
	}
	anon := newVisitor(t, ts.URL)
	if code, hdr, _ := anon.get("/ui/memories"); code != http.StatusSeeOther || !strings.HasPrefix(hdr.Get("Location"), "/ui/login") {
		t.Fatalf("a page before login: %d %s", code, hdr.Get("Location"))
	}
	if code, _, _ := anon.post("/ui/memories/"+id+"/delete", url.Values{"csrf": {"x"}}); code != http.StatusForbidden {
		t.Fatalf("a delete before login: %d", code)
	}
	if code, _, body := anon.get("/ui/login?key=" + aliceKey); code != http.StatusBadRequest || !strings.Contains(body, "never goes in a URL") {
		t.Fatalf("a key in the URL: %d", code)
	}

	other := newVisitor(t, ts.URL)
	other.login(adminKey)
	anonCSRF := other.csrf
	bob := newVisitor(t, ts.URL)
	if code := bob.login("sk-not-a-key-00"); code != http.StatusUnauthorized {
		t.Fatalf("a wrong key logs in: %d", code)
	}
	if code := bob.login(bobKey); code != http.StatusSeeOther {
		t.Fatalf("bob's login: %d", code)
	}
	u, _ := url.Parse(ts.URL + "/ui/")
	for _, ck := range bob.c.Jar.Cookies(u) {
		if ck.Name == "agemem_console" && strings.Contains(ck.Value, bobKey) {
			t.Fatal("the login cookie holds the key")
		}
	}
	for _, c := range []struct {
		name string
		path string
		form url.Values
		hdr  []string
		want int
	}{
		{"no CSRF token", "/ui/memories", url.Values{"csrf": {""}, "content": {"planted"}}, nil, http.StatusForbidden},
		{"another login's CSRF token", "/ui/memories", url.Values{"csrf": {anonCSRF}, "content": {"planted"}}, nil, http.StatusForbidden},
		{"another tenant's namespace", "/ui/memories/" + id + "/delete", url.Values{"namespace": {"alice"}}, nil, http.StatusForbidden},
		{"another tenant's memory in its own namespace", "/ui/memories/" + id + "/delete", url.Values{}, nil, http.StatusNotFound},
		{"another tenant's add", "/ui/memories", url.Values{"namespace": {"alice"}, "content": {"planted"}}, nil, http.StatusForbidden},
		{"from another site", "/ui/memories", url.Values{"content": {"planted"}}, []string{"Sec-Fetch-Site", "cross-site", "Origin", "https://evil.example"}, http.StatusForbidden},
	} {
		if code, _, body := bob.post(c.path, c.form, c.hdr...); code != c.want {
			t.Errorf("%s: %d, want %d\n%.400s", c.name, code, c.want, body)
		}
	}
	if code, _, _ := bob.get("/ui/memories?namespace=alice"); code != http.StatusForbidden {
		t.Errorf("bob reads alice's page: %d", code)
	}
	if code, _, _ := bob.get("/ui/conversations?namespace=alice"); code != http.StatusForbidden {
		t.Errorf("bob reads alice's conversations: %d", code)
	}
	if n := count(); n != 1 {
		t.Fatalf("alice holds %d memories after the refused requests, want 1", n)
	}
	if r := do(t, "GET", ts.URL+"/v1/memories", bobKey, nil); len(r.json(t)["data"].([]any)) != 0 {
		t.Fatalf("a refused add planted a memory in bob's namespace: %s", r.Body)
	}

	// The headers and the cookie.
	alice := newVisitor(t, ts.URL)
	_, _, body := alice.get("/ui/login")
	nonce := nonceRE.FindStringSubmatch(body)[1]
	req, _ := http.NewRequest("POST", ts.URL+"/ui/login", strings.NewReader(url.Values{"key": {aliceKey}, "nonce": {nonce}, "next": {"//evil.example/x"}}.Encode()))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	resp, err := alice.c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if loc := resp.Header.Get("Location"); resp.StatusCode != http.StatusSeeOther || loc != "/ui/" {
		t.Fatalf("a login sends the visitor on to %q (%d)", loc, resp.StatusCode)
	}
	var set *http.Cookie
	for _, ck := range resp.Cookies() {
		if ck.Name == "agemem_console" && ck.Value != "" {
			set = ck
		}
	}
	if set == nil || !set.HttpOnly || set.SameSite != http.SameSiteStrictMode || set.Path != "/ui" {
		t.Fatalf("the login cookie: %+v", set)
	}
	for _, p := range []string{"/ui/memories", "/ui/login", "/ui/health", "/ui/nowhere", "/ui/memories/" + id} {
		code, hdr, _ := alice.get(p)
		if csp := hdr.Get("Content-Security-Policy"); !strings.Contains(csp, "script-src 'self'") || strings.Contains(csp, "unsafe") ||
			hdr.Get("X-Content-Type-Options") != "nosniff" || hdr.Get("X-Frame-Options") != "DENY" {
			t.Errorf("%s (%d): headers %v", p, code, hdr)
		}
	}
	if code, _, _ := alice.post("/ui/logout", url.Values{}); code != http.StatusSeeOther {
		t.Fatalf("logout: %d", code)
	}
	if code, _, _ := alice.get("/ui/memories"); code != http.StatusSeeOther {
		t.Fatalf("a page after logout: %d", code)
	}

	// Guessing keys: after serve.console.login_failures failures a minute
	// an address is told to wait, even with the right key.
	guesser := newVisitor(t, ts.URL)
	for range ts.srv.cfg.Console.LoginFailures - 1 { // bob's wrong key above was the first
		if code := guesser.login("sk-guess-000000"); code != http.StatusUnauthorized {
			t.Fatalf("a wrong key: %d", code)
		}
	}
	if code := guesser.login(aliceKey); code != http.StatusTooManyRequests {
		t.Fatalf("a login after %d failures in a minute: %d, want 429", ts.srv.cfg.Console.LoginFailures, code)
	}
}

// TestConsoleMemoryListFollowsOtherWriters: the list pages keep each
// namespace's memories in memory; a memory another process adds or
// deletes shows at once (the count moved), one it edits within
// list_refresh.
func TestConsoleMemoryListFollowsOtherWriters(t *testing.T) {
	c := testConfig(t)
	c.Serve.Console.ListRefresh = 50 * time.Millisecond
	ts := start(t, c, newScripted())
	id := addViaAPI(t, ts, aliceKey, "first version")
	v := newVisitor(t, ts.URL)
	v.login(aliceKey)
	other, err := ts.db.Namespace("alice") // another writer: not through the server
	if err != nil {
		t.Fatal(err)
	}
	vec, _ := ts.srv.enc.Embed(t.Context(), []string{"x"})
	if _, err := other.Add(t.Context(), ltm.Entry{Content: "added elsewhere", Embedding: vec[0]}); err != nil {
		t.Fatal(err)
	}
	if _, _, body := v.get("/ui/memories"); !strings.Contains(body, "added elsewhere") || !strings.Contains(body, "2 memories") {
		t.Fatalf("the list misses a memory added by another writer:\n%s", body)
	}
	if _, err := other.Update(t.Context(), id, "edited elsewhere", vec[0], nil); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		_, _, body := v.get("/ui/memories")
		if strings.Contains(body, "edited elsewhere") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("an edit by another writer never showed (list_refresh 50ms):\n%s", body)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestConsoleRunsAreForAdmins: with serve.console.runs set, the training
// pages answer an admin's login and refuse a tenant's.
func TestConsoleRunsAreForAdmins(t *testing.T) {
	c := testConfig(t)
	c.Serve.Console.Runs = t.TempDir()
	m, err := train.OpenMetrics(filepath.Join(c.Serve.Console.Runs, "sft", "metrics.jsonl"), false)
	if err != nil {
		t.Fatal(err)
	}
	for step := 1; step <= 3; step++ {
		m.Log(map[string]any{"step": step, "loss": 1.0 / float64(step)})
	}
	m.Close()
	ts := start(t, c, newScripted())
	alice, admin := newVisitor(t, ts.URL), newVisitor(t, ts.URL)
	alice.login(aliceKey)
	admin.login(adminKey)
	if code, _, body := alice.get("/ui/runs"); code != http.StatusForbidden || strings.Contains(body, "sft") {
		t.Fatalf("a tenant's key reads the runs: %d", code)
	}
	if code, _, _ := alice.get("/ui/runs/chart.svg?run=sft&metric=loss"); code != http.StatusForbidden {
		t.Fatalf("a tenant's key reads a chart: %d", code)
	}
	if code, _, body := admin.get("/ui/runs/run?name=sft"); code != 200 || !strings.Contains(body, "chart.svg?") {
		t.Fatalf("an admin's run page: %d\n%s", code, body)
	}
}

// TestJournalBounds: the journal keeps at most turns in all and
// turns_per_namespace of one namespace, dropping the oldest, so a busy
// tenant cannot push out another's history.
func TestJournalBounds(t *testing.T) {
	j := newJournal(5, 3)
	clock := time.Unix(0, 0)
	j.now = func() time.Time { clock = clock.Add(time.Second); return clock }
	rec := func(ns, id string) { j.record(ns, "", id, nil, memtools.Trace{}, 0, nil) }
	rec("quiet", "q1")
	for i := range 6 {
		rec("busy", "b"+string(rune('0'+i)))
	}
	ids := func(ns string) string {
		cs, _ := j.Conversations(t.Context(), ns)
		var out []string
		for _, c := range cs {
			out = append(out, c.ID)
		}
		return strings.Join(out, " ")
	}
	if got := ids("busy"); got != "b5 b4 b3" {
		t.Fatalf("busy keeps %q, want its 3 newest", got)
	}
	if got := ids("quiet"); got != "q1" {
		t.Fatalf("quiet keeps %q: a busy tenant pushed its turn out", got)
	}
	rec("third", "t1")
	rec("third", "t2")
	if got := ids("quiet"); got != "" {
		t.Fatalf("quiet keeps %q beyond the journal's 5 turns (the oldest go)", got)
	}
	if got := ids("busy") + " | " + ids("third"); got != "b5 b4 b3 | t2 t1" {
		t.Fatalf("after the cap: %q", got)
	}
}
