package serve

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"net"
	"net/http"
	"os/exec"
	"strings"
	"testing"
	"time"
)

// rawRequest writes raw to addr, half-closes the connection when close
// is set (the client sent all it will), and reads the response.
func rawRequest(t *testing.T, addr, raw string, closeWrite bool, wait time.Duration) reply {
	t.Helper()
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	io.WriteString(conn, raw)
	if closeWrite {
		conn.(*net.TCPConn).CloseWrite()
	}
	conn.SetReadDeadline(time.Now().Add(wait))
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatalf("no response: %v", err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return reply{resp.StatusCode, resp.Header, body}
}

// Every item of the bad-input list is a named JSON 4xx (before:
// stored as U+FFFD, 400 incomplete_body for a body too large, plain-text
// MCP errors, text/plain accepted, a message's unknown key dropped,
// metadata 5,000 deep stored, a bad memory_id replaced, a stalled body a
// 400 showing socket addresses, a short body "more than one JSON value"),
// and nothing is stored by any of them.
func TestBadInputIsANamedJSONError(t *testing.T) {
	c := testConfig(t)
	c.Serve.ReadTimeout = 700 * time.Millisecond
	s := newServer(t, c)
	addr := serveOn(t, s)
	base := "http://" + addr
	deep := func(n int) string {
		return strings.Repeat(`{"a":`, n) + "1" + strings.Repeat("}", n)
	}
	big := strings.Repeat(`{"content":"a fact that is long enough to fill the body quickly, line after line"}`+"\n", 14000)
	for _, tc := range []struct {
		name, method, path, ctype, body string
		status                          int
		code, param                     string
	}{
		{"invalid UTF-8 in chat content", "POST", "/v1/chat/completions", "application/json",
			"{\"model\":\"agemem\",\"messages\":[{\"role\":\"user\",\"content\":\"hi \xff\xfe\"}]}", 400, "invalid_utf8", "messages[0].content"},
		{"half a surrogate pair in chat content", "POST", "/v1/chat/completions", "application/json",
			`{"model":"agemem","messages":[{"role":"system","content":"x"},{"role":"user","content":"\ud800"}]}`, 400, "invalid_utf8", "messages[1].content"},
		{"invalid UTF-8 in a memory", "POST", "/v1/memories", "application/json", "{\"content\":\"caf\xe9\"}", 400, "invalid_utf8", "content"},
		{"invalid UTF-8 in an import line", "POST", "/v1/memories/import", "application/x-ndjson",
			"{\"content\":\"fine\"}\n{\"content\":\"caf\xe9\"}\n", 400, "invalid_jsonl", ""},
		{"an import over max_body_bytes", "POST", "/v1/memories/import", "application/x-ndjson", big, 413, "body_too_large", ""},
		{"a memory over max_body_bytes", "POST", "/v1/memories", "application/json", `{"content":"` + strings.Repeat("x", 1<<20) + `"}`, 413, "body_too_large", ""},
		{"text/plain on a memory", "POST", "/v1/memories", "text/plain", `{"content":"x"}`, 415, "unsupported_media_type", ""},
		{"text/plain on a search", "POST", "/v1/memories/search", "text/plain", `{"query":"x"}`, 415, "unsupported_media_type", ""},
		{"text/plain on an import", "POST", "/v1/memories/import", "text/plain", `{"content":"x"}`, 415, "unsupported_media_type", ""},
		{"an unknown key in a message", "POST", "/v1/chat/completions", "application/json",
			`{"model":"agemem","messages":[{"role":"user","content":"hi","colour":"red"}]}`, 400, "unknown_parameter", "messages[0].colour"},
		{"a tool call in a message", "POST", "/v1/chat/completions", "application/json",
			`{"model":"agemem","messages":[{"role":"assistant","content":null,"tool_calls":[{"id":"1"}]},{"role":"user","content":"hi"}]}`, 400, "unsupported", "messages[0].tool_calls"},
		{"metadata 5,000 deep", "POST", "/v1/memories", "application/json", `{"content":"x","metadata":` + deep(5000) + `}`, 400, "invalid_metadata", "metadata"},
		{"metadata 17 deep", "POST", "/v1/memories", "application/json", `{"content":"x","metadata":` + deep(17) + `}`, 400, "invalid_metadata", "metadata"},
		{"metadata over 16 KiB", "POST", "/v1/memories", "application/json", `{"content":"x","metadata":{"k":"` + strings.Repeat("v", 17<<10) + `"}}`, 400, "invalid_metadata", "metadata"},
		{"deep metadata in an import", "POST", "/v1/memories/import", "application/x-ndjson", `{"content":"x","metadata":` + deep(40) + "}\n", 400, "invalid_metadata", "metadata"},
		{"an import memory_id that is a path", "POST", "/v1/memories/import", "application/x-ndjson", `{"memory_id":"../../x","content":"x"}` + "\n", 400, "invalid_jsonl", ""},
		{"a path memory id that is not one", "GET", "/v1/memories/not-an-id", "", "", 400, "invalid_memory_id", "memory_id"},
		{"MCP without the Accept it needs", "POST", "/mcp", "application/json", `{"jsonrpc":"2.0","id":1,"method":"tools/list"}`, 400, "invalid_mcp_request", ""},
		{"MCP with a session that does not exist", "GET", "/mcp", "", "", 400, "invalid_mcp_request", ""},
		{"MCP in text/plain", "POST", "/mcp", "text/plain", `{}`, 415, "unsupported_media_type", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			req, _ := http.NewRequest(tc.method, base+tc.path, strings.NewReader(tc.body))
			req.Header.Set("Authorization", "Bearer "+aliceKey)
			if tc.ctype != "" {
				req.Header.Set("Content-Type", tc.ctype)
			}
			if tc.path == "/mcp" && tc.method == "GET" {
				req.Header.Set("Accept", "text/event-stream")
			}
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			raw, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			r := reply{resp.StatusCode, resp.Header, raw}
			if r.Status != tc.status || r.Header.Get("Content-Type") != "application/json" || r.errorCode(t) != tc.code {
				t.Fatalf("%d %q %.300s; want %d %s as JSON", r.Status, r.Header.Get("Content-Type"), raw, tc.status, tc.code)
			}
			if p, _ := r.json(t)["error"].(map[string]any)["param"].(string); p != tc.param {
				t.Fatalf("param %q, want %q: %.300s", p, tc.param, raw)
			}
		})
	}
	if n := len(do(t, "GET", base+"/v1/memories", aliceKey, nil).json(t)["data"].([]any)); n != 0 {
		t.Fatalf("the refused requests stored %d memories", n)
	}

	// An assistant message as OpenAI's clients send it back is accepted.
	msgs := `[{"role":"user","content":"hi"},{"role":"assistant","content":"echo: hi","refusal":null,"tool_calls":null},{"role":"user","content":"again"}]`
	if r := do(t, "POST", base+"/v1/chat/completions", aliceKey, `{"model":"agemem","messages":`+msgs+`}`); r.Status != 200 {
		t.Fatalf("an assistant message with refusal and tool_calls null: %d %s", r.Status, r.Body)
	}
	// Metadata within the limits is stored, and the list stays readable
	// by another language's parser.
	if r := do(t, "POST", base+"/v1/memories", aliceKey, `{"content":"x","metadata":`+deep(16)+`}`, "Content-Type", "application/json"); r.Status != 201 {
		t.Fatalf("metadata 16 deep: %d %s", r.Status, r.Body)
	}
	list := do(t, "GET", base+"/v1/memories", aliceKey, nil)
	if py, err := exec.LookPath("python3"); err == nil {
		cmd := exec.Command(py, "-c", "import json, sys; json.load(sys.stdin)")
		cmd.Stdin = bytes.NewReader(list.Body)
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("Python's json cannot read GET /v1/memories: %v %s", err, out)
		}
	} else {
		t.Log("python3 not found: the list's readability by Python is not checked")
	}

	// A body that stalls: 408 once serve.read_timeout passes, naming no
	// socket.
	stalled := rawRequest(t, addr, fmt.Sprintf("POST /v1/memories HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"content\": \"", aliceKey), false, 5*time.Second)
	if stalled.Status != 408 || stalled.errorCode(t) != "body_timeout" || strings.Contains(string(stalled.Body), "127.0.0.1") || strings.Contains(string(stalled.Body), "tcp") {
		t.Fatalf("a stalled body: %d %s", stalled.Status, stalled.Body)
	}
	// A Content-Length longer than the body sent: incomplete, not "more
	// than one JSON value".
	short := rawRequest(t, addr, fmt.Sprintf("POST /v1/memories HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"content\": \"x\"}", aliceKey), true, 5*time.Second)
	if short.Status != 400 || short.errorCode(t) != "incomplete_body" {
		t.Fatalf("a body shorter than its Content-Length: %d %s", short.Status, short.Body)
	}
	if n := len(do(t, "GET", base+"/v1/memories", aliceKey, nil).json(t)["data"].([]any)); n != 1 {
		t.Fatalf("%d memories stored; want the one within the limits", n)
	}
}
