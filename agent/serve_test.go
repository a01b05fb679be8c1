package agent_test

import (
	"context"
	"errors"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"

	"github.com/agemem/agemem/agent"
	"github.com/agemem/agemem/embed"
	"github.com/agemem/agemem/llm"
	"github.com/agemem/agemem/memtools"
	"github.com/agemem/agemem/memtools/ltm"
	"github.com/agemem/agemem/memtools/stm"
	"github.com/agemem/agemem/model/chat"
	"github.com/agemem/agemem/serve"
)

// script plays its replies in order.
type script struct{ replies []chat.Message }

func (s *script) Chat(context.Context, llm.Request) (llm.Response, error) {
	if len(s.replies) == 0 {
		return llm.Response{}, errors.New("the script ran out")
	}
	r := s.replies[0]
	s.replies = s.replies[1:]
	return llm.Response{Message: r}, nil
}

func call(id, name, args string) chat.ToolCall {
	return chat.ToolCall{ID: id, Name: name, Arguments: args}
}

// idle is a serve backend never asked for a completion here (only /mcp).
type idle struct{}

func (idle) Count(s string) int { return stm.Words{}.Count(s) }
func (idle) ContextLength() int { return 0 }
func (idle) Close()             {}
func (idle) Chat(context.Context, llm.Request) (llm.Response, error) {
	return llm.Response{}, errors.New("idle")
}

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
	c, err := agent.ConnectMCP(ctx, agent.MCPServer{Name: "memory", URL: hs.URL + "/mcp", Headers: map[string]string{"Authorization": "Bearer sk-alice"}})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ts, _ := agent.NewToolset()
	if err := ts.AddMCP(ctx, c); err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(ts.Names(), ","); got != "Add_memory,Delete_memory,Retrieve_memory,Update_memory" {
		t.Fatalf("tools %s", got)
	}
	m := &script{replies: []chat.Message{
		{ToolCalls: []chat.ToolCall{call("", "Add_memory", `{"content": "Ivo is a judge."}`)}},
		{ToolCalls: []chat.ToolCall{call("", "Retrieve_memory", `{"query": "judge", "top_k": "2"}`)}},
		{ToolCalls: []chat.ToolCall{call("", "Retrieve_memory", `{"query": "judge", "top_k": 2}`)}},
		{Content: "Ivo is a judge."},
	}}
	tr, err := agent.Run(ctx, m, ts, []chat.Message{{Role: "user", Content: "Remember Ivo, then recall him."}}, agent.Limits{MaxSteps: 5})
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
	m = &script{replies: []chat.Message{{ToolCalls: []chat.ToolCall{call("", "Add_memory", `{"content": "x"}`)}}, {Content: "The memory is down."}}}
	tr, err = agent.Run(ctx, m, ts, nil, agent.Limits{MaxSteps: 3})
	if err != nil || !tr.HasAnswer {
		t.Fatalf("after the server died: %v %+v", err, tr)
	}
	if r := tr.Steps[0].Results[0]; r.OK || !strings.Contains(r.Result, `MCP server "memory"`) {
		t.Fatalf("a call to a dead server: %+v", r)
	}
}
