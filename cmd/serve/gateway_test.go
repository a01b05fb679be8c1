package main

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/agemem/agemem/internal/testkit"
)

type bearer struct{ key string }

func (b bearer) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer "+b.key)
	return http.DefaultTransport.RoundTrip(r)
}

// TestServeToolGateway: serve with serve.tool_gateway puts a third-party
// MCP server from npm behind /mcp/tools. The official SDK's client of one
// key sees the two meta-tools, searches, is told the list changed and
// calls a tool found; another key's working set stays empty; no key is
// refused.
func TestServeToolGateway(t *testing.T) {
	if testing.Short() {
		t.Skip("starts processes")
	}
	node, err := exec.LookPath("node")
	if err != nil {
		t.Skip("node is not installed")
	}
	server := filepath.Join(testkit.NPM(t), "node_modules", "@modelcontextprotocol", "server-memory", "dist", "index.js")
	dir := t.TempDir()
	cfgPath := filepath.Join(dir, "serve.yaml")
	yaml := fmt.Sprintf(`memory:
  path: %s
agent:
  system_prompt: compact
serve:
  addr: 127.0.0.1:0
  policy: %s
  tool_gateway: true
memtool:
  top_k: 1
mcp:
  servers:
    - {name: memory, command: [%s, %s], env: {MEMORY_FILE_PATH: %s}}
`, filepath.Join(dir, "memory.db"), randomPolicyDir(t), node, server, filepath.Join(dir, "graph.jsonl"))
	os.WriteFile(cfgPath, []byte(yaml), 0o644)
	p := startServe(t, cfgPath)
	var sessions []*mcp.ClientSession
	defer func() {
		for _, s := range sessions {
			s.Close()
		}
		p.stop(t)
	}()
	ctx := context.Background()
	connect := func(key string) (*mcp.ClientSession, *atomic.Int32) {
		var changed atomic.Int32
		c := mcp.NewClient(&mcp.Implementation{Name: "test", Version: "1"}, &mcp.ClientOptions{
			ToolListChangedHandler: func(context.Context, *mcp.ToolListChangedRequest) { changed.Add(1) }})
		sess, err := c.Connect(ctx, &mcp.StreamableClientTransport{Endpoint: p.url + "/mcp/tools", MaxRetries: -1, HTTPClient: &http.Client{Transport: bearer{key}}}, nil)
		if err != nil {
			t.Fatalf("connect with %q: %v", key, err)
		}
		sessions = append(sessions, sess)
		return sess, &changed
	}
	names := func(sess *mcp.ClientSession) []string {
		res, err := sess.ListTools(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, tl := range res.Tools {
			out = append(out, tl.Name)
		}
		return out
	}
	alice, changed := connect("sk-alice-0001")
	if got := names(alice); len(got) != 2 {
		t.Fatalf("alice before searching: %v", got)
	}
	res, err := alice.CallTool(ctx, &mcp.CallToolParams{Name: "SYS_SEARCH_TOOLS", Arguments: map[string]any{"keywords": []string{"create multiple new entities in the knowledge graph"}}})
	if err != nil || res.IsError {
		t.Fatalf("search: %v %+v", err, res)
	}
	for deadline := time.Now().Add(5 * time.Second); changed.Load() == 0; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("no tools/list_changed")
		}
	}
	if got := names(alice); !slices.Contains(got, "create_entities") {
		t.Fatalf("alice after searching: %v", got)
	}
	res, err = alice.CallTool(ctx, &mcp.CallToolParams{Name: "create_entities", Arguments: map[string]any{"entities": []any{map[string]any{"name": "Ada", "entityType": "person", "observations": []string{"likes tea"}}}}})
	if err != nil || res.IsError {
		t.Fatalf("create_entities through the gateway: %v %+v", err, res)
	}
	bob, _ := connect("sk-bob-00001")
	if got := names(bob); len(got) != 2 {
		t.Fatalf("bob sees alice's working set: %v", got)
	}
	if code, _ := call(t, "POST", p.url+"/mcp/tools", "", `{"jsonrpc":"2.0","id":1,"method":"tools/list"}`); code != 401 {
		t.Fatalf("no key: %d", code)
	}
	if raw, err := os.ReadFile(filepath.Join(dir, "graph.jsonl")); err != nil || !strings.Contains(string(raw), "likes tea") {
		t.Fatalf("the upstream server's file: %v", err)
	}
}
