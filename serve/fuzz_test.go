package serve

import (
	"bytes"
	"encoding/json"
	"net/http/httptest"
	"testing"

	"github.com/agemem/agemem/memtools/ltm"
)

// FuzzHandlers sends arbitrary bodies to the chat, memory and MCP routes:
// every answer is a JSON error or success with a status below 500, and the
// server keeps serving. `make fuzz` runs it longer.
func FuzzHandlers(f *testing.F) {
	for _, seed := range []string{
		`{"model":"agemem","messages":[{"role":"user","content":"Remember: a"}]}`,
		`{"model":"agemem","messages":[{"role":"user","content":[{"type":"text","text":"hi"}]}],"stream":true}`,
		`{"content":"x","metadata":{"a":1}}`, `{"query":"x","top_k":2}`,
		`{"memory_id":"mem_00000001","content":"x"}` + "\n", `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{}}`,
		`{}`, `[]`, `null`, `{"model":"agemem","messages":[]} {}`, "\xff\xfe",
	} {
		for route := range 5 {
			f.Add(uint8(route), []byte(seed))
		}
	}
	c := testConfig(f)
	c.Serve.MaxBodyBytes = 1 << 16
	s, db := newFuzzServer(f, c)
	defer db.Close()
	h := s.Handler()
	routes := []string{"/v1/chat/completions", "/v1/memories", "/v1/memories/search", "/v1/memories/import", "/mcp"}
	f.Fuzz(func(t *testing.T, route uint8, body []byte) {
		path := routes[int(route)%len(routes)]
		req := httptest.NewRequest("POST", path, bytes.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+aliceKey)
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Accept", "application/json, text/event-stream")
		w := httptest.NewRecorder()
		h.ServeHTTP(w, req)
		if w.Code >= 500 {
			t.Fatalf("%s %q: %d %s", path, body, w.Code, w.Body)
		}
		if w.Code >= 400 && path != "/mcp" && !json.Valid(w.Body.Bytes()) {
			t.Fatalf("%s %q: %d with a body that is not JSON: %s", path, body, w.Code, w.Body)
		}
	})
}

func newFuzzServer(f *testing.F, c config) (*Server, interface{ Close() error }) {
	f.Helper()
	db, err := openTestStore(c)
	if err != nil {
		f.Fatal(err)
	}
	s, err := New(with(c.options(), func(o *Options) { o.Backend, o.Store = newScripted(), db }))
	if err != nil {
		f.Fatal(err)
	}
	return s, db
}

func openTestStore(c config) (*ltm.SQLite, error) {
	return ltm.OpenSQLite(c.Memory.Path, ltm.SQLiteOptions{})
}
