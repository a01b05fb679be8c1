package serve

import (
	"context"
	"net/http"
	"strings"
	"testing"

	"github.com/agemem/agemem/memtools"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

type bearer struct {
	key  string
	next http.RoundTripper
}

func (b bearer) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer "+b.key)
	return b.next.RoundTrip(r)
}

func mcpSession(t *testing.T, url, key string) (*mcp.ClientSession, error) {
	t.Helper()
	c := mcp.NewClient(&mcp.Implementation{Name: "test", Version: "1"}, nil)
	return c.Connect(context.Background(), &mcp.StreamableClientTransport{Endpoint: url + "/mcp", MaxRetries: -1,
		HTTPClient: &http.Client{Transport: bearer{key, http.DefaultTransport}}}, nil)
}

func callText(t *testing.T, cs *mcp.ClientSession, name string, args map[string]any) (string, bool) {
	t.Helper()
	res, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: name, Arguments: args})
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	return res.Content[0].(*mcp.TextContent).Text, res.IsError
}

// The SDK's own client lists and calls the memory tools over streamable
// HTTP; each key reaches only its namespace, and what MCP stores the chat
// endpoint retrieves.
func TestMCPOverHTTP(t *testing.T) {
	ts := start(t, testConfig(t), newScripted())
	if _, err := mcpSession(t, ts.URL, "sk-wrong-key-0000"); err == nil {
		t.Fatal("MCP accepted a wrong key")
	}
	alice, err := mcpSession(t, ts.URL, aliceKey)
	if err != nil {
		t.Fatal(err)
	}
	defer alice.Close()
	tools, err := alice.ListTools(context.Background(), nil)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, tl := range tools.Tools {
		names = append(names, tl.Name)
		if tl.InputSchema.(map[string]any)["type"] != "object" {
			t.Errorf("%s: schema %v", tl.Name, tl.InputSchema)
		}
	}
	if strings.Join(names, ",") != "Add_memory,Delete_memory,Retrieve_memory,Update_memory" {
		t.Fatalf("tools: %v", names)
	}
	out, isErr := callText(t, alice, "Add_memory", map[string]any{"content": "The spare key is under the blue pot", "metadata": map[string]any{"room": "garden"}})
	if isErr || !strings.Contains(out, "mem_") {
		t.Fatalf("Add_memory: %s", out)
	}
	out, _ = callText(t, alice, "Retrieve_memory", map[string]any{"query": "where is the spare key", "top_k": 1})
	if !strings.Contains(out, "blue pot") {
		t.Fatalf("Retrieve_memory: %s", out)
	}
	// A bad argument is a tool error the caller can read, not a failure.
	if out, isErr := callText(t, alice, "Delete_memory", map[string]any{"memory_id": "nope"}); !isErr || out == "" {
		t.Fatalf("bad id: %v %s", isErr, out)
	}
	// The chat endpoint sees what MCP stored.
	if got, _ := answer(t, ts, aliceKey, "", "Recall: spare key"); !strings.Contains(got, "blue pot") {
		t.Fatalf("chat after MCP add: %q", got)
	}
	bob, err := mcpSession(t, ts.URL, bobKey)
	if err != nil {
		t.Fatal(err)
	}
	defer bob.Close()
	if out, _ := callText(t, bob, "Retrieve_memory", map[string]any{"query": "where is the spare key"}); strings.Contains(out, "blue pot") {
		t.Fatalf("bob retrieves alice's memory over MCP: %s", out)
	}
}

// TestMCPToolsAsClientsExpect: the official SDK client reads tool
// annotations (Retrieve read-only, Delete destructive), an output schema
// and structured results; wrongly typed arguments are tool errors; a
// missing key gets 401 with WWW-Authenticate.
func TestMCPToolsAsClientsExpect(t *testing.T) {
	ts := start(t, testConfig(t), newScripted())
	cs, err := mcpSession(t, ts.URL, aliceKey)
	if err != nil {
		t.Fatal(err)
	}
	defer cs.Close()
	tools, err := cs.ListTools(context.Background(), nil)
	if err != nil {
		t.Fatal(err)
	}
	byName := map[string]*mcp.Tool{}
	for _, tl := range tools.Tools {
		byName[tl.Name] = tl
		if tl.OutputSchema == nil || tl.Annotations == nil || tl.Annotations.Title == "" {
			t.Errorf("%s: no output schema or annotations", tl.Name)
		}
	}
	if a := byName[memtools.ToolRetrieve].Annotations; !a.ReadOnlyHint {
		t.Errorf("Retrieve_memory is not read-only: %+v", a)
	}
	if a := byName[memtools.ToolDelete].Annotations; a.ReadOnlyHint || a.DestructiveHint == nil || !*a.DestructiveHint {
		t.Errorf("Delete_memory is not destructive: %+v", a)
	}
	res, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: memtools.ToolAdd, Arguments: map[string]any{"content": "Ivo is a judge."}})
	if err != nil || res.IsError {
		t.Fatalf("add: %v %+v", err, res)
	}
	st, _ := res.StructuredContent.(map[string]any)
	if st["status"] != "success" || st["memory_id"] == "" {
		t.Fatalf("structured result %v", res.StructuredContent)
	}
	for _, c := range []struct {
		args map[string]any
		bad  bool
	}{
		{map[string]any{"query": "judge", "top_k": 2}, false},
		{map[string]any{"query": "judge", "top_k": "2"}, true},
		{map[string]any{"query": "judge", "top_k": 1.5}, true},
		{map[string]any{"query": 7}, true},
	} {
		res, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: memtools.ToolRetrieve, Arguments: c.args})
		if err != nil || res.IsError != c.bad {
			t.Fatalf("%v: %v, error %v", c.args, err, res.IsError)
		}
		if c.bad && !strings.Contains(res.Content[0].(*mcp.TextContent).Text, "must be of type") {
			t.Fatalf("%v: %s", c.args, res.Content[0].(*mcp.TextContent).Text)
		}
	}
	r := do(t, "POST", ts.URL+"/mcp", "", `{"jsonrpc":"2.0","id":1,"method":"tools/list"}`)
	if r.Status != 401 || !strings.HasPrefix(r.Header.Get("WWW-Authenticate"), "Bearer") {
		t.Fatalf("no key: %d, WWW-Authenticate %q", r.Status, r.Header.Get("WWW-Authenticate"))
	}
}
