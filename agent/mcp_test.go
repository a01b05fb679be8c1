package agent

import (
	"context"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/agemem/agemem/embed"
	"github.com/agemem/agemem/memtools"
	"github.com/agemem/agemem/memtools/ltm"
	"github.com/agemem/agemem/memtools/stm"
	"github.com/agemem/agemem/serve"
)

// idle is a serve backend never asked for a completion here (only /mcp).
type idle struct{}

func (idle) Count(s string) int               { return stm.Words{}.Count(s) }
func (idle) ContextLength() int               { return 0 }
func (idle) Close()                           {}
func (idle) Policy(serve.Gen) memtools.Policy { return nil }

// TestLoopOnOurMCPServer: the loop runs with the memory tools of our own
// serve's /mcp endpoint (streamable HTTP, a bearer key in the headers):
// the model stores a fact and retrieves it; a call that breaks the tool's
// schema is refused before it leaves; once the server is gone a call fails
// and the model is told, the loop goes on.
func TestLoopOnOurMCPServer(t *testing.T) {
	db, err := ltm.OpenSQLite(filepath.Join(t.TempDir(), "m.db"), ltm.SQLiteOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	sc := serve.DefaultConfig()
	sc.Keys, sc.KeysEnv = []serve.APIKey{{Key: "sk-alice", Namespace: "alice"}}, ""
	srv, err := serve.New(serve.Options{Config: sc, Agent: memtools.DefaultAgent(), Tools: memtools.DefaultOptions(), Namespace: "default",
		Backend: idle{}, Store: db, Embedder: embed.NewHashing(64, []int{3})})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	hs := httptest.NewServer(srv.Handler())
	defer hs.Close()
	ctx := context.Background()
	c, err := ConnectMCP(ctx, MCPServer{Name: "memory", URL: hs.URL + "/mcp", Headers: map[string]string{"Authorization": "Bearer sk-alice"}})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ts, _ := NewToolset(clock())
	if err := ts.AddMCP(ctx, c); err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(ts.Names(), ","); got != "now,Add_memory,Delete_memory,Retrieve_memory,Update_memory" {
		t.Fatalf("tools %s", got)
	}
	m := &script{replies: []Message{
		{ToolCalls: []ToolCall{call("", "Add_memory", `{"content": "Ivo is a judge."}`)}},
		{ToolCalls: []ToolCall{call("", "Retrieve_memory", `{"query": "judge", "top_k": "2"}`)}},
		{ToolCalls: []ToolCall{call("", "Retrieve_memory", `{"query": "judge", "top_k": 2}`)}},
		{Content: "Ivo is a judge."},
	}}
	tr, err := Run(ctx, m, ts, []Message{{Role: "user", Content: "Remember Ivo, then recall him."}}, Limits{MaxSteps: 5})
	if err != nil || !tr.HasAnswer {
		t.Fatalf("%v %+v", err, tr)
	}
	if r := tr.Steps[0].Results[0]; !r.OK || !strings.Contains(r.Result, "success") {
		t.Fatalf("add: %+v", r)
	}
	if r := tr.Steps[1].Results[0]; r.OK || !strings.Contains(r.Result, "schema") {
		t.Fatalf("a string top_k: %+v", r)
	}
	if r := tr.Steps[2].Results[0]; !r.OK || !strings.Contains(r.Result, "Ivo is a judge.") {
		t.Fatalf("retrieve: %+v", r)
	}
	ns, _ := db.Namespace("alice")
	if n, _ := ns.Count(ctx); n != 1 {
		t.Fatalf("alice holds %d memories", n)
	}
	// The server goes away: the call fails, the model reads why.
	hs.CloseClientConnections()
	hs.Close()
	m = &script{replies: []Message{{ToolCalls: []ToolCall{call("", "Add_memory", `{"content": "x"}`)}}, {Content: "The memory is down."}}}
	tr, err = Run(ctx, m, ts, nil, Limits{MaxSteps: 3})
	if err != nil || !tr.HasAnswer {
		t.Fatalf("after the server died: %v %+v", err, tr)
	}
	if r := tr.Steps[0].Results[0]; r.OK || !strings.Contains(r.Result, `MCP server "memory"`) {
		t.Fatalf("a call to a dead server: %+v", r)
	}
}

// TestMCPToolListChanged: a server that adds a tool mid-run announces it,
// and the next turn offers (and runs) it.
func TestMCPToolListChanged(t *testing.T) {
	s := mcp.NewServer(&mcp.Implementation{Name: "grow", Version: "1"}, nil)
	echo := func(text string) mcp.ToolHandler {
		return func(context.Context, *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
			return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: text}}}, nil
		}
	}
	obj := map[string]any{"type": "object"}
	s.AddTool(&mcp.Tool{Name: "a", InputSchema: obj}, echo("from a"))
	hs := httptest.NewServer(mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return s }, nil))
	defer hs.Close()
	ctx := context.Background()
	c, err := ConnectMCP(ctx, MCPServer{Name: "grow", URL: hs.URL})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ts, _ := NewToolset()
	if err := ts.AddMCP(ctx, c); err != nil {
		t.Fatal(err)
	}
	s.AddTool(&mcp.Tool{Name: "b", InputSchema: obj}, echo("from b"))
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		c.mu.Lock()
		ch := c.changed
		c.mu.Unlock()
		if ch {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("no tools/list_changed notification arrived")
		}
	}
	m := &script{replies: []Message{{ToolCalls: []ToolCall{call("", "b", "{}")}}, {Content: "done"}}}
	tr, err := Run(ctx, m, ts, nil, Limits{MaxSteps: 3})
	if err != nil || tr.Steps[0].Results[0].Result != "from b" || len(m.specs[0]) != 2 {
		t.Fatalf("%v %+v (specs %v)", err, tr, m.specs)
	}
}
