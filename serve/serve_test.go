package serve

import (
	"bufio"
	"bytes"
	"context"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/agemem/agemem/embed"
	"github.com/agemem/agemem/llm/ollama"
	"github.com/agemem/agemem/memtools"
	"github.com/agemem/agemem/memtools/ltm"
)

const (
	aliceKey = "sk-alice-0000001"
	bobKey   = "sk-bob-00000002"
	adminKey = "sk-admin-000003"
)

// config is the sections a server reads, with their defaults.
type config struct {
	Serve  Config
	Agent  memtools.Agent
	Tools  memtools.Options
	Memory ltm.Config
	Embed  embed.Config
	Ollama ollama.Config
	// StateDSN keeps sessions and idempotency keys in PostgreSQL
	// (forEachState); "" keeps them in the process.
	StateDSN string
}

func defaults() config {
	return config{Serve: DefaultConfig(), Agent: memtools.DefaultAgent(), Tools: memtools.DefaultOptions(),
		Memory: ltm.DefaultConfig(), Embed: embed.DefaultConfig(), Ollama: ollama.DefaultConfig()}
}

// options are the server's options for c.
func (c config) options() Options {
	return Options{Config: c.Serve, Agent: c.Agent, Tools: c.Tools, Namespace: c.Memory.Namespace, Embedder: c.Embed.Hashing(), StateDSN: c.StateDSN}
}

// with applies f to o.
func with(o Options, f func(*Options)) Options {
	f(&o)
	return o
}

func testConfig(t testing.TB) config {
	c := defaults()
	c.Memory.Path = filepath.Join(t.TempDir(), "memory.db")
	c.Agent.SystemPrompt = "compact"
	c.Serve.Keys = []APIKey{{Key: aliceKey, Namespace: "alice"}, {Key: bobKey, Namespace: "bob"}, {Key: adminKey, Admin: true}}
	c.Serve.KeysEnv = ""
	return c
}

type testServer struct {
	*httptest.Server
	srv *Server
	db  *ltm.SQLite
}

func start(t *testing.T, c config, be Backend) *testServer {
	t.Helper()
	db, err := ltm.OpenSQLite(c.Memory.Path, ltm.SQLiteOptions{})
	if err != nil {
		t.Fatal(err)
	}
	s, err := New(with(c.options(), func(o *Options) { o.Backend, o.Store = be, db }))
	if err != nil {
		t.Fatal(err)
	}
	ts := &testServer{Server: newHTTPTest(s), srv: s, db: db}
	t.Cleanup(func() { ts.Close(); s.Close(); db.Close() })
	return ts
}

func newHTTPTest(s *Server) *httptest.Server { return httptest.NewServer(s.Handler()) }

type reply struct {
	Status int
	Header http.Header
	Body   []byte
}

func (r reply) json(t *testing.T) map[string]any {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal(r.Body, &m); err != nil {
		t.Fatalf("status %d, body not JSON: %s", r.Status, r.Body)
	}
	return m
}

// errorCode is the code of an OpenAI-shaped error body.
func (r reply) errorCode(t *testing.T) string {
	t.Helper()
	e, ok := r.json(t)["error"].(map[string]any)
	if !ok {
		t.Fatalf("status %d without an error object: %s", r.Status, r.Body)
	}
	if e["message"] == "" || e["type"] == "" {
		t.Fatalf("error without message or type: %s", r.Body)
	}
	code, _ := e["code"].(string)
	return code
}

func do(t testing.TB, method, url, key string, body any, hdr ...string) reply {
	t.Helper()
	var rd io.Reader
	switch b := body.(type) {
	case nil:
	case string:
		rd = strings.NewReader(b)
	case []byte:
		rd = bytes.NewReader(b)
	default:
		raw, _ := json.Marshal(b)
		rd = bytes.NewReader(raw)
	}
	req, _ := http.NewRequest(method, url, rd)
	if key != "" {
		req.Header.Set("Authorization", "Bearer "+key)
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	return reply{resp.StatusCode, resp.Header, raw}
}

func chatBody(session, user string, extra ...any) map[string]any {
	b := map[string]any{"model": "agemem", "messages": []map[string]any{{"role": "user", "content": user}}}
	if session != "" {
		b["session_id"] = session
	}
	for i := 0; i+1 < len(extra); i += 2 {
		b[extra[i].(string)] = extra[i+1]
	}
	return b
}

// answer posts a chat completion and returns the assistant's content.
func answer(t *testing.T, ts *testServer, key, session, user string) (string, map[string]any) {
	t.Helper()
	r := do(t, "POST", ts.URL+"/v1/chat/completions", key, chatBody(session, user))
	if r.Status != 200 {
		t.Fatalf("%q: status %d: %s", user, r.Status, r.Body)
	}
	m := r.json(t)
	msg := m["choices"].([]any)[0].(map[string]any)["message"].(map[string]any)
	return msg["content"].(string), m
}

// TestMemoryFollowsTheUser is the first check: a fact stored in
// one session is retrieved in another session of the same user, is
// invisible to another user's key, and survives a restart of the server
// on the same SQLite file.
func TestMemoryFollowsTheUser(t *testing.T) {
	c := testConfig(t)
	ts := start(t, c, newScripted())
	got, m := answer(t, ts, aliceKey, "a1", "Remember: Alice's cat is called Tabby")
	if got != "Stored." {
		t.Fatalf("store: %q", got)
	}
	calls := m["agemem"].(map[string]any)["steps"].([]any)[0].(map[string]any)["tool_calls"].([]any)
	if tc := calls[0].(map[string]any); tc["name"] != "Add_memory" || tc["ok"] != true {
		t.Fatalf("trace: %v", tc)
	}
	if u := m["usage"].(map[string]any); u["total_tokens"].(float64) <= 0 || u["completion_tokens"].(float64) <= 0 {
		t.Fatalf("usage: %v", u)
	}
	if got, _ := answer(t, ts, aliceKey, "a2", "Recall: what is the cat called"); !strings.Contains(got, "Tabby") {
		t.Fatalf("alice, another session: %q", got)
	}
	if got, _ := answer(t, ts, bobKey, "a2", "Recall: what is the cat called"); strings.Contains(got, "Tabby") {
		t.Fatalf("bob sees alice's memory: %q", got)
	}
	if got, _ := answer(t, ts, bobKey, "", "Recall: cat"); strings.Contains(got, "Tabby") {
		t.Fatalf("bob, stateless: %q", got)
	}
	// The memory API agrees, and the namespace boundary holds there too.
	list := do(t, "GET", ts.URL+"/v1/memories", aliceKey, nil).json(t)["data"].([]any)
	if len(list) != 1 {
		t.Fatalf("alice has %d memories", len(list))
	}
	id := list[0].(map[string]any)["memory_id"].(string)
	if r := do(t, "GET", ts.URL+"/v1/memories/"+id, bobKey, nil); r.Status != 404 {
		t.Fatalf("bob reads alice's memory by id: %d %s", r.Status, r.Body)
	}
	if r := do(t, "DELETE", ts.URL+"/v1/memories/"+id, bobKey, nil); r.Status != 404 {
		t.Fatalf("bob deletes alice's memory: %d", r.Status)
	}
	if r := do(t, "GET", ts.URL+"/v1/memories?namespace=alice", bobKey, nil); r.Status != 403 || r.errorCode(t) != "namespace_forbidden" {
		t.Fatalf("bob names alice's namespace: %d %s", r.Status, r.Body)
	}
	if r := do(t, "POST", ts.URL+"/v1/chat/completions", bobKey, chatBody("", "Recall: cat"), "X-AgeMem-Namespace", "alice"); r.Status != 403 {
		t.Fatalf("bob chats in alice's namespace: %d", r.Status)
	}
	if r := do(t, "GET", ts.URL+"/v1/memories/"+id+"?namespace=alice", adminKey, nil); r.Status != 200 {
		t.Fatalf("admin reads alice's memory: %d %s", r.Status, r.Body)
	}
	if r := do(t, "GET", ts.URL+"/v1/namespaces", adminKey, nil); !strings.Contains(string(r.Body), "alice") {
		t.Fatalf("namespaces: %s", r.Body)
	}
	if r := do(t, "GET", ts.URL+"/v1/namespaces", aliceKey, nil); r.Status != 403 {
		t.Fatalf("alice lists namespaces: %d", r.Status)
	}

	// Restart on the same file.
	ts.Close()
	ts.srv.Close()
	ts.db.Close()
	ts2 := start(t, c, newScripted())
	if got, _ := answer(t, ts2, aliceKey, "a3", "Recall: what is the cat called"); !strings.Contains(got, "Tabby") {
		t.Fatalf("after restart: %q", got)
	}
}

// TestBadRequestsGetJSONErrors sends each kind of bad request and checks
// its status and error code, and that the server keeps serving.
func TestBadRequestsGetJSONErrors(t *testing.T) {
	c := testConfig(t)
	c.Serve.MaxBodyBytes = 4096
	c.Serve.MaxMessages = 3
	ts := start(t, c, newScripted())
	url := ts.URL + "/v1/chat/completions"
	big := chatBody("", strings.Repeat("x", 5000))
	cases := []struct {
		name   string
		key    string
		body   any
		status int
		code   string
	}{
		{"malformed JSON", aliceKey, `{"model": "agemem", "messages": [`, 400, "invalid_json"},
		{"empty body", aliceKey, "", 400, "invalid_json"},
		{"wrong type", aliceKey, `{"model": "agemem", "messages": "hi"}`, 400, "invalid_type"},
		{"wrong type, nested", aliceKey, `{"model": "agemem", "messages": [{"role": 1, "content": "hi"}]}`, 400, "invalid_type"},
		{"temperature a string", aliceKey, chatBody("", "hi", "temperature", "hot"), 400, "invalid_type"},
		{"oversized body", aliceKey, big, 413, "body_too_large"},
		{"unknown model", aliceKey, map[string]any{"model": "gpt-4o", "messages": []any{map[string]any{"role": "user", "content": "hi"}}}, 404, "model_not_found"},
		{"no model", aliceKey, map[string]any{"messages": []any{map[string]any{"role": "user", "content": "hi"}}}, 400, "missing_model"},
		{"bad key", "sk-nobody-000000", chatBody("", "hi"), 401, "invalid_api_key"},
		{"no key", "", chatBody("", "hi"), 401, "missing_api_key"},
		{"too many messages", aliceKey, map[string]any{"model": "agemem", "messages": []any{
			map[string]any{"role": "user", "content": "a"}, map[string]any{"role": "assistant", "content": "b"},
			map[string]any{"role": "user", "content": "c"}, map[string]any{"role": "user", "content": "d"}}}, 400, "too_many_messages"},
		{"bad role", aliceKey, map[string]any{"model": "agemem", "messages": []any{map[string]any{"role": "tool", "content": "x"}}}, 400, "invalid_role"},
		{"last not user", aliceKey, map[string]any{"model": "agemem", "messages": []any{map[string]any{"role": "user", "content": "a"}, map[string]any{"role": "assistant", "content": "b"}}}, 400, "last_not_user"},
		{"max_tokens too big", aliceKey, chatBody("", "hi", "max_tokens", 1<<20), 400, "invalid_value"},
		{"temperature", aliceKey, chatBody("", "hi", "temperature", 5), 400, "invalid_value"},
		{"n", aliceKey, chatBody("", "hi", "n", 2), 400, "unsupported"},
		{"client tools", aliceKey, chatBody("", "hi", "tools", []any{map[string]any{"type": "function"}}), 400, "unsupported"},
		{"image part", aliceKey, map[string]any{"model": "agemem", "messages": []any{map[string]any{"role": "user", "content": []any{map[string]any{"type": "image_url"}}}}}, 400, "invalid_content"},
		{"bad session id", aliceKey, chatBody("../etc", "hi"), 400, "invalid_session_id"},
		{"trailing garbage", aliceKey, `{"model": "agemem", "messages": [{"role": "user", "content": "hi"}]} xyz`, 400, "invalid_json"},
		{"two objects", aliceKey, `{"model": "agemem", "messages": [{"role": "user", "content": "hi"}]}{"model": "agemem"}`, 400, "invalid_json"},
		{"unknown parameter", aliceKey, chatBody("", "hi", "temprature", 0.5), 400, "unknown_parameter"},
		{"presence penalty", aliceKey, chatBody("", "hi", "presence_penalty", 1), 400, "unsupported"},
		{"json response format", aliceKey, chatBody("", "hi", "response_format", map[string]any{"type": "json_object"}), 400, "unsupported"},
		{"empty content", aliceKey, chatBody("", "  "), 400, "empty_content"},
		{"broken tool calls", aliceKey, chatBody("", "Break"), 422, "tool_format_error"},
		{"broken tool calls, streamed", aliceKey, chatBody("", "Break", "stream", true), 422, "tool_format_error"},
	}
	for _, tc := range cases {
		r := do(t, "POST", url, tc.key, tc.body)
		if r.Status != tc.status || r.errorCode(t) != tc.code {
			t.Errorf("%s: status %d, body %s; want %d %s", tc.name, r.Status, r.Body, tc.status, tc.code)
		}
		if r.Header.Get("Content-Type") != "application/json" {
			t.Errorf("%s: content type %q", tc.name, r.Header.Get("Content-Type"))
		}
		// The server still serves after each one.
		if got, _ := answer(t, ts, aliceKey, "", "ping"); got != "echo: ping" {
			t.Fatalf("after %s: %q", tc.name, got)
		}
	}
	// A value of the wrong type is named as OpenAI names it: param and kinds.
	r0 := do(t, "POST", url, aliceKey, chatBody("", "hi", "temperature", "hot"))
	if e := r0.json(t)["error"].(map[string]any); e["param"] != "temperature" || e["message"] != "temperature is a JSON string where a number belongs" {
		t.Errorf("temperature \"hot\": %s", r0.Body)
	}
	// A 422 carries the trace: what the model wrote and why it failed.
	r := do(t, "POST", url, aliceKey, chatBody("", "Break"))
	tr := r.json(t)["error"].(map[string]any)["agemem"].(map[string]any)
	st := tr["steps"].([]any)
	if len(st) != c.Agent.MaxSteps || len(st[0].(map[string]any)["format_errors"].([]any)) == 0 {
		t.Fatalf("422 trace: %s", r.Body)
	}
	// A body that is not JSON by its content type; parameters that do not
	// change the answer are accepted.
	if r := do(t, "POST", url, aliceKey, chatBody("", "hi"), "Content-Type", "text/plain"); r.Status != 415 || r.errorCode(t) != "unsupported_media_type" {
		t.Fatalf("text/plain: %d %s", r.Status, r.Body)
	}
	if r := do(t, "POST", url, aliceKey, chatBody("", "ping", "user", "u1", "metadata", map[string]any{"a": "b"}, "presence_penalty", 0, "parallel_tool_calls", true),
		"Content-Type", "application/json; charset=utf-8"); r.Status != 200 {
		t.Fatalf("known parameters: %d %s", r.Status, r.Body)
	}
	if r := do(t, "GET", ts.URL+"/v1/nothing", aliceKey, nil); r.Status != 404 || r.errorCode(t) != "not_found" {
		t.Fatalf("unknown route: %d %s", r.Status, r.Body)
	}
	if r := do(t, "GET", ts.URL+"/v1/models", aliceKey, nil); !strings.Contains(string(r.Body), `"id":"agemem"`) {
		t.Fatalf("models: %s", r.Body)
	}
	if r := do(t, "GET", ts.URL+"/v1/models/other", aliceKey, nil); r.Status != 404 {
		t.Fatalf("unknown model: %d", r.Status)
	}
}

// Sessions keep the short-term context between requests, including what
// Filter_context removed; a failed request leaves the session as it was.
func TestSessionsKeepShortTermContext(t *testing.T) {
	forEachState(t, testSessionsKeepShortTermContext)
}

func testSessionsKeepShortTermContext(t *testing.T, c config) {
	ts := start(t, c, newScripted())
	answer(t, ts, aliceKey, "s", "my favourite colour is green")
	answer(t, ts, aliceKey, "s", "I live in Velden")
	if got, _ := answer(t, ts, aliceKey, "s", "History?"); got != "my favourite colour is green | I live in Velden | History?" {
		t.Fatalf("session history: %q", got)
	}
	if got, _ := answer(t, ts, aliceKey, "", "History?"); got != "History?" {
		t.Fatalf("stateless: %q", got)
	}
	if got, _ := answer(t, ts, bobKey, "s", "History?"); got != "History?" {
		t.Fatalf("bob's session s is not alice's: %q", got)
	}
	// The header works as the field does.
	r := do(t, "POST", ts.URL+"/v1/chat/completions", aliceKey, chatBody("", "History?"), "X-Session-ID", "s")
	if !strings.Contains(string(r.Body), "Velden") || r.Header.Get("X-Session-ID") != "s" {
		t.Fatalf("X-Session-ID: %s", r.Body)
	}
	// A filter persists into the next request.
	answer(t, ts, aliceKey, "s", "Forget: favourite colour green")
	got, _ := answer(t, ts, aliceKey, "s", "History?")
	if strings.Contains(got, "green") || !strings.Contains(got, "Velden") {
		t.Fatalf("after Filter_context: %q", got)
	}
	// A failed request does not change the session.
	do(t, "POST", ts.URL+"/v1/chat/completions", aliceKey, chatBody("s", "Break"))
	if got2, _ := answer(t, ts, aliceKey, "s", "History?"); strings.Contains(got2, "Break") {
		t.Fatalf("a failed request entered the session: %q", got2)
	}
	// Clients that resend the history: only the new turn is appended.
	r = do(t, "POST", ts.URL+"/v1/chat/completions", aliceKey, map[string]any{"model": "agemem", "session_id": "s2", "messages": []any{
		map[string]any{"role": "user", "content": "one"}}})
	r = do(t, "POST", ts.URL+"/v1/chat/completions", aliceKey, map[string]any{"model": "agemem", "session_id": "s2", "messages": []any{
		map[string]any{"role": "user", "content": "one"}, map[string]any{"role": "assistant", "content": "echo: one"},
		map[string]any{"role": "user", "content": "History?"}}})
	if !strings.Contains(string(r.Body), `"content":"one | History?"`) {
		t.Fatalf("resent history: %s", r.Body)
	}
	if r := do(t, "DELETE", ts.URL+"/v1/sessions/s2", aliceKey, nil); r.Status != 200 {
		t.Fatalf("delete session: %d", r.Status)
	}
	if r := do(t, "DELETE", ts.URL+"/v1/sessions/s2", aliceKey, nil); r.Status != 404 {
		t.Fatalf("delete session twice: %d", r.Status)
	}
}

type sse struct {
	content, finish string
	usage           map[string]any
	agemem          map[string]any
	err             map[string]any
	done            bool
}

func readSSE(t *testing.T, body []byte) sse {
	t.Helper()
	var out sse
	sc := bufio.NewScanner(bytes.NewReader(body))
	for sc.Scan() {
		line := sc.Text()
		if line == "" {
			continue
		}
		data, ok := strings.CutPrefix(line, "data: ")
		if !ok {
			t.Fatalf("not an SSE data line: %q", line)
		}
		if data == "[DONE]" {
			out.done = true
			continue
		}
		var ev map[string]any
		if err := json.Unmarshal([]byte(data), &ev); err != nil {
			t.Fatalf("event %q: %v", data, err)
		}
		if e, ok := ev["error"].(map[string]any); ok {
			out.err = e
			continue
		}
		if ev["object"] != "chat.completion.chunk" {
			t.Fatalf("chunk object %v", ev["object"])
		}
		if u, ok := ev["usage"].(map[string]any); ok {
			out.usage = u
		}
		if a, ok := ev["agemem"].(map[string]any); ok {
			out.agemem = a
		}
		for _, ch := range ev["choices"].([]any) {
			c := ch.(map[string]any)
			if d, ok := c["delta"].(map[string]any); ok {
				if s, ok := d["content"].(string); ok {
					out.content += s
				}
			}
			if f, ok := c["finish_reason"].(string); ok {
				out.finish = f
			}
		}
	}
	return out
}

func TestStreamingMatchesNonStreaming(t *testing.T) {
	ts := start(t, testConfig(t), newScripted())
	answer(t, ts, aliceKey, "", "Remember: the launch code is 0000 and the door is blue")
	want, _ := answer(t, ts, aliceKey, "", "Recall: launch code")
	r := do(t, "POST", ts.URL+"/v1/chat/completions", aliceKey, chatBody("", "Recall: launch code", "stream", true, "stream_options", map[string]any{"include_usage": true}))
	if r.Status != 200 || !strings.HasPrefix(r.Header.Get("Content-Type"), "text/event-stream") {
		t.Fatalf("stream: %d %s", r.Status, r.Header)
	}
	got := readSSE(t, r.Body)
	if got.content != want || got.finish != "stop" || !got.done || got.usage == nil || got.agemem == nil {
		t.Fatalf("streamed %+v, want content %q", got, want)
	}
	// Several deltas, not one: the answer was streamed as it grew.
	if n := strings.Count(string(r.Body), `"content":`); n < 3 {
		t.Fatalf("%d content deltas", n)
	}
}

func TestAnswerSoFarIsAlwaysAPrefix(t *testing.T) {
	full := "<think>x</think>\n<answer>  Paris, in France. ü </answer>"
	final, _ := answerSoFar(full)
	if final != "Paris, in France. ü" {
		t.Fatalf("final %q", final)
	}
	for i := range len(full) + 1 {
		part, ok := answerSoFar(full[:i])
		if ok && !strings.HasPrefix(final, part) {
			t.Fatalf("after %d bytes %q is not a prefix of %q", i, part, final)
		}
	}
	if _, ok := answerSoFar(`<think>a</think><tool_call>[]</tool_call><think>b</think><answer>x`); ok {
		t.Fatal("an answer after a tool call in the same response was streamed")
	}
}

// With one slot and no queue, a second concurrent request gets 429 at
// once; the first still completes.
func TestQueueFullGets429(t *testing.T) {
	c := testConfig(t)
	c.Serve.MaxConcurrent, c.Serve.MaxQueue = 1, 0
	be := newScripted()
	be.calls = make(chan string, 8)
	ts := start(t, c, be)
	var first reply
	var wg sync.WaitGroup
	wg.Go(func() { first = do(t, "POST", ts.URL+"/v1/chat/completions", aliceKey, chatBody("", "Wait")) })
	<-be.calls // the first request holds the slot
	r := do(t, "POST", ts.URL+"/v1/chat/completions", bobKey, chatBody("", "hi"))
	if r.Status != 429 || r.errorCode(t) != "queue_full" || r.Header.Get("Retry-After") == "" {
		t.Fatalf("second request: %d %s", r.Status, r.Body)
	}
	if m := do(t, "GET", ts.URL+"/metrics", "", nil); !strings.Contains(string(m.Body), "agemem_active_requests 1") {
		t.Fatalf("metrics while busy:\n%s", m.Body)
	}
	close(be.gate)
	wg.Wait()
	if first.Status != 200 {
		t.Fatalf("first request: %d %s", first.Status, first.Body)
	}
	be.calls = nil
}

func TestMemoryAPI(t *testing.T) {
	ts := start(t, testConfig(t), newScripted())
	u := ts.URL + "/v1/memories"
	r := do(t, "POST", u, aliceKey, map[string]any{"content": "Bob was born in Velden", "metadata": map[string]any{"topic": "bio"}, "memory_type": "fact"})
	if r.Status != 201 {
		t.Fatalf("add: %d %s", r.Status, r.Body)
	}
	id := r.json(t)["memory_id"].(string)
	do(t, "POST", u, aliceKey, map[string]any{"content": "The cat likes fish"})
	if r := do(t, "POST", u, aliceKey, map[string]any{"content": " "}); r.Status != 400 {
		t.Fatalf("empty content: %d", r.Status)
	}
	if r := do(t, "POST", u, aliceKey, map[string]any{"content": "x", "colour": "red"}); r.Status != 400 || r.errorCode(t) != "unknown_parameter" {
		t.Fatalf("unknown field: %d %s", r.Status, r.Body)
	}
	r = do(t, "POST", u+"/search", aliceKey, map[string]any{"query": "where was Bob born", "top_k": 1})
	hits := r.json(t)["data"].([]any)
	if len(hits) != 1 || hits[0].(map[string]any)["memory_id"] != id || hits[0].(map[string]any)["embedding"] != nil {
		t.Fatalf("search: %s", r.Body)
	}
	if r := do(t, "POST", u+"/search", aliceKey, map[string]any{"query": "x", "metadata": map[string]any{"topic": "none"}}); len(r.json(t)["data"].([]any)) != 0 {
		t.Fatalf("filtered search: %s", r.Body)
	}
	if r := do(t, "POST", u+"/search", aliceKey, map[string]any{"query": "x", "top_k": 1000}); r.Status != 400 {
		t.Fatalf("top_k 1000: %d", r.Status)
	}
	if r := do(t, "PATCH", u+"/"+id, aliceKey, map[string]any{"content": "Bob was born in Hallstatt"}); r.Status != 200 || !strings.Contains(string(r.Body), `"topic":"bio"`) {
		t.Fatalf("update (metadata kept): %d %s", r.Status, r.Body)
	}
	if r := do(t, "PATCH", u+"/mem_00000000", aliceKey, map[string]any{"content": "x"}); r.Status != 404 {
		t.Fatalf("update missing: %d", r.Status)
	}
	export := do(t, "GET", u+"/export", aliceKey, nil)
	if export.Header.Get("Content-Type") != "application/x-ndjson" || bytes.Count(export.Body, []byte("\n")) != 2 {
		t.Fatalf("export: %s", export.Body)
	}
	// A malformed import writes nothing; a good one copies the memories.
	bad := append(append([]byte{}, export.Body...), []byte("{\"content\": \"x\", \"oops\": 1}\n")...)
	if r := do(t, "POST", u+"/import", bobKey, bad); r.Status != 400 || !strings.Contains(string(r.Body), "body:3") {
		t.Fatalf("bad import: %d %s", r.Status, r.Body)
	}
	if n := len(do(t, "GET", u, bobKey, nil).json(t)["data"].([]any)); n != 0 {
		t.Fatalf("a failed import wrote %d memories", n)
	}
	if r := do(t, "POST", u+"/import", bobKey, export.Body); r.Status != 200 || r.json(t)["imported"].(float64) != 2 {
		t.Fatalf("import: %d %s", r.Status, r.Body)
	}
	if got := do(t, "GET", u, bobKey, nil).Body; !strings.Contains(string(got), "Hallstatt") {
		t.Fatalf("bob after import: %s", got)
	}
	if r := do(t, "DELETE", u+"/"+id, aliceKey, nil); r.Status != 200 {
		t.Fatalf("delete: %d", r.Status)
	}
	if r := do(t, "GET", u+"/"+id, aliceKey, nil); r.Status != 404 || r.errorCode(t) != "memory_not_found" {
		t.Fatalf("get deleted: %d %s", r.Status, r.Body)
	}
}

func TestHealthReadyMetrics(t *testing.T) {
	ts := start(t, testConfig(t), newScripted())
	if r := do(t, "GET", ts.URL+"/healthz", "", nil); r.Status != 200 {
		t.Fatalf("healthz %d", r.Status)
	}
	if r := do(t, "GET", ts.URL+"/readyz", "", nil); r.Status != 200 {
		t.Fatalf("readyz %d", r.Status)
	}
	answer(t, ts, aliceKey, "", "Remember: x is 1")
	m := string(do(t, "GET", ts.URL+"/metrics", "", nil).Body)
	for _, want := range []string{
		`agemem_http_requests_total{code="200",route="POST /v1/chat/completions"} 1`,
		`agemem_tool_calls_total{ok="true",tool="Add_memory"} 1`,
		`agemem_tokens_total{kind="completion"}`,
		`agemem_http_request_duration_seconds_bucket{route="POST /v1/chat/completions"`,
		"agemem_queue_depth 0",
		"agemem_sessions 0",
	} {
		if !strings.Contains(m, want) {
			t.Errorf("metrics lack %s", want)
		}
	}
	ts.srv.ready.Store(false)
	if r := do(t, "GET", ts.URL+"/readyz", "", nil); r.Status != 503 {
		t.Fatalf("readyz while shutting down: %d", r.Status)
	}
}

// Serve finishes a request in flight when its context ends, refuses new
// connections, and returns.
func TestGracefulShutdown(t *testing.T) {
	c := testConfig(t)
	be := newScripted()
	be.calls = make(chan string, 8)
	db, err := ltm.OpenSQLite(c.Memory.Path, ltm.SQLiteOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	s, err := New(with(c.options(), func(o *Options) { o.Backend, o.Store = be, db }))
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	url := "http://" + ln.Addr().String()
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- s.Serve(ctx, ln) }()
	var inflight reply
	var wg sync.WaitGroup
	wg.Go(func() { inflight = do(t, "POST", url+"/v1/chat/completions", aliceKey, chatBody("", "Wait")) })
	<-be.calls
	cancel()
	time.Sleep(50 * time.Millisecond)
	if _, err := http.Get(url + "/healthz"); err == nil {
		t.Error("a new connection was accepted during shutdown")
	}
	close(be.gate)
	wg.Wait()
	if inflight.Status != 200 || !strings.Contains(string(inflight.Body), "waited") {
		t.Fatalf("in-flight request: %d %s", inflight.Status, inflight.Body)
	}
	select {
	case err := <-served:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Serve did not return")
	}
}

func TestLoadTestReports(t *testing.T) {
	ts := start(t, testConfig(t), newScripted())
	rep, err := LoadTest(context.Background(), LoadOptions{URL: ts.URL, Key: aliceKey, Clients: 4, Duration: 300 * time.Millisecond, Prompts: []string{"a", "Remember: b is 2"}})
	if err != nil {
		t.Fatal(err)
	}
	if rep.OK == 0 || rep.OK != rep.Requests || len(rep.Errors) != 0 || rep.CompletionTokens == 0 || rep.P50 > rep.P99 || rep.P50 <= 0 {
		t.Fatalf("report: %+v", rep)
	}
	rep, _ = LoadTest(context.Background(), LoadOptions{URL: ts.URL, Key: "sk-nobody-000000", Clients: 2, Duration: 100 * time.Millisecond, Prompts: []string{"a"}})
	if rep.OK != 0 || rep.Errors["401"] != rep.Requests || !strings.Contains(rep.String(), "401: ") {
		t.Fatalf("bad key: %+v", rep)
	}
	if _, err := LoadTest(context.Background(), LoadOptions{URL: ts.URL, Clients: 0, Duration: time.Second, Prompts: []string{"a"}}); err == nil {
		t.Fatal("0 clients accepted")
	}
}

// TestEmbeddingsEndpoint: /v1/embeddings serves the store's embedder as
// OpenAI does (a string or a list, float or base64), and refuses what it
// cannot honour with a 4xx naming the parameter.
func TestEmbeddingsEndpoint(t *testing.T) {
	ts := start(t, testConfig(t), newScripted())
	url := ts.URL + "/v1/embeddings"
	r := do(t, "POST", url, aliceKey, map[string]any{"model": "agemem", "input": []string{"a fact", "another"}})
	var got struct {
		Data []struct {
			Index     int       `json:"index"`
			Embedding []float32 `json:"embedding"`
		} `json:"data"`
		Usage map[string]int `json:"usage"`
	}
	if r.Status != 200 || json.Unmarshal(r.Body, &got) != nil || len(got.Data) != 2 || got.Usage["prompt_tokens"] == 0 {
		t.Fatalf("%d %s", r.Status, r.Body)
	}
	want, _ := ts.srv.enc.Embed(t.Context(), []string{"a fact", "another"})
	if fmt.Sprint(got.Data[1].Embedding) != fmt.Sprint(want[1]) || got.Data[1].Index != 1 {
		t.Fatalf("vector 1 is not the embedder's")
	}
	r = do(t, "POST", url, aliceKey, map[string]any{"model": "agemem", "input": "a fact", "encoding_format": "base64"})
	var b64 struct {
		Data []struct{ Embedding string } `json:"data"`
	}
	json.Unmarshal(r.Body, &b64)
	raw, err := base64.StdEncoding.DecodeString(b64.Data[0].Embedding)
	if err != nil || len(raw) != 4*len(want[0]) || math.Float32frombits(binary.LittleEndian.Uint32(raw[4:])) != want[0][1] {
		t.Fatalf("base64: %v, %d bytes", err, len(raw))
	}
	for _, c := range []struct {
		body   any
		status int
		code   string
	}{
		{map[string]any{"model": "gpt", "input": "x"}, 404, "model_not_found"},
		{map[string]any{"model": "agemem", "input": []int{1, 2}}, 400, "invalid_input"},
		{map[string]any{"model": "agemem", "input": []string{"ok", ""}}, 400, "invalid_input"},
		{map[string]any{"model": "agemem", "input": []string{}}, 400, "invalid_input"},
		{map[string]any{"model": "agemem", "input": "x", "dimensions": 7}, 400, "unsupported"},
		{map[string]any{"model": "agemem", "input": "x", "encoding_format": "int8"}, 400, "invalid_value"},
		{map[string]any{"model": "agemem", "input": "x", "bogus": 1}, 400, "unknown_parameter"},
	} {
		r := do(t, "POST", url, aliceKey, c.body)
		if r.Status != c.status || r.errorCode(t) != c.code {
			t.Errorf("%v: %d %s", c.body, r.Status, r.Body)
		}
	}
	if r := do(t, "POST", url, "", map[string]any{"model": "agemem", "input": "x"}); r.Status != 401 {
		t.Fatalf("no key: %d", r.Status)
	}
}
