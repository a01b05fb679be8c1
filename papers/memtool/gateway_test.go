package memtool

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/agemem/agemem/agent"
	"github.com/agemem/agemem/bench/stabletoolbench"
	"github.com/agemem/agemem/embed"
	"github.com/agemem/agemem/internal/testkit"
	"github.com/agemem/agemem/llm"
	"github.com/agemem/agemem/model/chat"
)

// gatewayClient connects the official SDK's client to working set id of
// g over streamable HTTP and counts the list_changed notifications.
func gatewayClient(t *testing.T, g *Gateway, id string) (*mcp.ClientSession, *atomic.Int32) {
	t.Helper()
	hs := httptest.NewServer(mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return g.Server(id) }, nil))
	t.Cleanup(hs.Close)
	var changed atomic.Int32
	c := mcp.NewClient(&mcp.Implementation{Name: "test", Version: "1"}, &mcp.ClientOptions{
		ToolListChangedHandler: func(context.Context, *mcp.ToolListChangedRequest) { changed.Add(1) }})
	sess, err := c.Connect(context.Background(), &mcp.StreamableClientTransport{Endpoint: hs.URL}, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sess.Close() })
	return sess, &changed
}

func listNames(t *testing.T, sess *mcp.ClientSession) []string {
	t.Helper()
	res, err := sess.ListTools(context.Background(), nil)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, tl := range res.Tools {
		out = append(out, tl.Name)
	}
	slices.Sort(out)
	return out
}

func callText(t *testing.T, sess *mcp.ClientSession, name string, args any) (string, bool) {
	t.Helper()
	res, err := sess.CallTool(context.Background(), &mcp.CallToolParams{Name: name, Arguments: args})
	if err != nil {
		t.Fatal(err)
	}
	return res.Content[0].(*mcp.TextContent).Text, res.IsError
}

func waitFor(t *testing.T, what string, ok func() bool) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); !ok(); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
	}
}

// financeServer is a live MCP server of 18 tools, three figures of six
// companies ("Acme revenue is 0"), at url; calls counts the calls it ran.
func financeServer(t *testing.T) (url string, calls *atomic.Int32) {
	t.Helper()
	up := mcp.NewServer(&mcp.Implementation{Name: "finance", Version: "1"}, nil)
	calls = new(atomic.Int32)
	for i, co := range []string{"Acme", "Bolt", "Crane", "Delta", "Ember", "Fjord"} {
		for j, metric := range []string{"revenue", "stock price", "net income"} {
			name := fmt.Sprintf("%s_%s", strings.ToLower(co), strings.ReplaceAll(metric, " ", "_"))
			text := fmt.Sprintf("%s %s is %d", co, metric, 100*i+j)
			up.AddTool(&mcp.Tool{Name: name, Description: fmt.Sprintf("Returns the %s of %s.", metric, co), InputSchema: map[string]any{"type": "object"}},
				func(context.Context, *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
					calls.Add(1)
					return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: text}}}, nil
				})
		}
	}
	hs := httptest.NewServer(mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return up }, nil))
	t.Cleanup(hs.Close)
	return hs.URL, calls
}

// The benchmark over live tools: the knowledge base is an MCP server's
// tools, every call runs on the server, and the judge compares the answer
// with what the gold tools returned in the turn. The oracle, which states
// the results, gets all; an agent that answers without calling gets none,
// and the model judge is told the figures the server returned.
func TestBenchLiveTools(t *testing.T) {
	url, calls := financeServer(t)
	ctx := context.Background()
	upstream, closeAll, err := agent.ConnectAll(ctx, []agent.MCPServer{{Name: "finance", URL: url}})
	if err != nil {
		t.Fatal(err)
	}
	defer closeAll()
	kb, exec, err := Upstream(ctx, embed.NewHashing(256, []int{3, 4}), upstream)
	if err != nil {
		t.Fatal(err)
	}
	qs := []stabletoolbench.Query{
		{ID: "1", Text: "What is the revenue of Acme?", Gold: []string{"acme_revenue"}},
		{ID: "2", Text: "Give me the stock price and net income of Delta.", Gold: []string{"delta_stock_price", "delta_net_income"}},
		{ID: "3", Text: "How much did Fjord earn, net?", Gold: []string{"fjord_net_income"}},
	}
	c := cfg(Autonomous)
	c.Limit, c.TopK, c.Bench.Turns = 12, 2, 3
	rep, err := Bench(ctx, BenchOptions{Config: c, Modes: []string{Autonomous}, Agent: oracleFor(kb, qs), Judge: ContainsJudge{}, KB: kb, Exec: exec, Queries: qs})
	if err != nil {
		t.Fatal(err)
	}
	m := rep.Modes[0].Metrics
	if rep.Tools != 18 || m.ToolCorrectness != 1 || m.TaskCompletion != 1 {
		t.Fatalf("live oracle: %d tools, tool correctness %.3f, task completion %.3f", rep.Tools, m.ToolCorrectness, m.TaskCompletion)
	}
	if n := calls.Load(); n != 4 {
		t.Fatalf("the server ran %d calls, want the 4 gold tools", n)
	}
	if a := rep.Modes[0].Turns[1].Answer; !strings.Contains(a, "Delta stock price is 301") || !strings.Contains(a, "Delta net income is 302") {
		t.Fatalf("the answer does not carry the server's results: %q", a)
	}
	// An agent that answers at once, with the right figure made up: no
	// tool ran, so nothing it says is grounded.
	guess := modelFunc(func([]chat.Message, []chat.Function) (llm.Response, error) {
		return llm.Response{Message: chat.Message{Role: "assistant", Content: "Acme revenue is 0"}}, nil
	})
	var judged []string
	judge := ModelJudge{Model: modelFunc(func(msgs []chat.Message, _ []chat.Function) (llm.Response, error) {
		judged = append(judged, msgs[1].Content)
		return llm.Response{Message: chat.Message{Role: "assistant", Content: "0.5"}}, nil
	})}
	rep, err = Bench(ctx, BenchOptions{Config: c, Modes: []string{Autonomous}, Agent: guess, Judge: ContainsJudge{}, KB: kb, Exec: exec, Queries: qs[:1]})
	if err != nil || rep.Modes[0].Metrics.TaskCompletion != 0 {
		t.Fatalf("an ungrounded answer: task completion %v (%v), want 0", rep.Modes[0].Metrics.TaskCompletion, err)
	}
	if _, err = Bench(ctx, BenchOptions{Config: c, Modes: []string{Autonomous}, Agent: oracleFor(kb, qs), Judge: judge, KB: kb, Exec: exec, Queries: qs[:2]}); err != nil {
		t.Fatal(err)
	}
	if len(judged) != 2 || !strings.Contains(judged[1], "delta_stock_price returns Delta stock price is 301") {
		t.Fatalf("the model judge was told %q", judged)
	}
	// A tool may not shadow a meta-tool.
	bad := append(slices.Clone(upstream), agent.Tool{Function: chat.Function{Name: SearchTools}})
	if _, _, err := Upstream(ctx, embed.NewHashing(256, []int{3, 4}), bad); err == nil || !strings.Contains(err.Error(), "meta-tool") {
		t.Fatalf("an upstream SYS_SEARCH_TOOLS: %v", err)
	}
}

// An MCP client behind the gateway sees only the meta-tools until it
// searches; the tools found appear (with a list_changed notification),
// their calls reach the upstream server, removal takes them away, the
// limit refuses a search that would pass it, and working sets are apart.
func TestGatewayWorkingSet(t *testing.T) {
	url, _ := financeServer(t)
	ctx := context.Background()
	upstream, closeAll, err := agent.ConnectAll(ctx, []agent.MCPServer{{Name: "finance", URL: url}})
	if err != nil {
		t.Fatal(err)
	}
	defer closeAll()
	c := DefaultConfig()
	c.Limit, c.TopK = 6, 2
	g, err := NewGateway(ctx, embed.NewHashing(256, []int{3, 4}), upstream, c)
	if err != nil {
		t.Fatal(err)
	}
	alice, changed := gatewayClient(t, g, "alice")
	if got := listNames(t, alice); !slices.Equal(got, []string{RemoveTools, SearchTools}) {
		t.Fatalf("before a search the client sees %v", got)
	}
	out, isErr := callText(t, alice, SearchTools, map[string]any{"keywords": []string{"Acme revenue"}})
	if isErr || !strings.HasPrefix(out, "2 tools added: ") || !strings.Contains(out, "acme_revenue") {
		t.Fatalf("search: %q", out)
	}
	waitFor(t, "tools/list_changed", func() bool { return changed.Load() > 0 })
	if got := listNames(t, alice); len(got) != 4 || !slices.Contains(got, "acme_revenue") {
		t.Fatalf("after the search: %v", got)
	}
	if out, isErr := callText(t, alice, "acme_revenue", map[string]any{}); isErr || out != "Acme revenue is 0" {
		t.Fatalf("a working-set tool's call: %q (error %v)", out, isErr)
	}
	// Two more tools would make 6 with the meta-tools; four more pass L.
	if out, isErr := callText(t, alice, SearchTools, map[string]any{"keywords": []string{"Bolt stock price", "Crane net income"}}); !isErr || !strings.Contains(out, "Hit L limit, remove tools.") {
		t.Fatalf("over the limit: %q", out)
	}
	n := changed.Load()
	if out, _ := callText(t, alice, RemoveTools, map[string]any{"tool_names": g.WorkingSet("alice")}); !strings.HasPrefix(out, "2 tools removed") {
		t.Fatalf("remove: %q", out)
	}
	waitFor(t, "tools/list_changed after the removal", func() bool { return changed.Load() > n })
	if got := listNames(t, alice); len(got) != 2 {
		t.Fatalf("after the removal: %v", got)
	}
	if out, _ := callText(t, alice, RemoveTools, map[string]any{"tool_names": []string{SearchTools}}); !strings.HasPrefix(out, "0 tools removed") {
		t.Fatalf("the meta-tools cannot be removed: %q", out)
	}
	// Bob's working set is his own.
	callText(t, alice, SearchTools, map[string]any{"keywords": []string{"Delta revenue"}})
	bob, _ := gatewayClient(t, g, "bob")
	if got := listNames(t, bob); len(got) != 2 || len(g.WorkingSet("alice")) != 2 {
		t.Fatalf("bob sees %v, alice has %v", got, g.WorkingSet("alice"))
	}
	if _, err := NewGateway(ctx, embed.NewHashing(64, nil), []agent.Tool{{Function: chat.Function{Name: SearchTools}}}, c); err == nil {
		t.Fatal("an upstream tool named SYS_SEARCH_TOOLS was accepted")
	}
}

// A third-party MCP server from npm (the reference "memory" server, over
// stdio) behind the gateway: its tools are found by search and run.
func TestGatewayWithThirdPartyServer(t *testing.T) {
	node, err := exec.LookPath("node")
	if err != nil {
		t.Skip("node is not installed")
	}
	server := filepath.Join(testkit.NPM(t), "node_modules", "@modelcontextprotocol", "server-memory", "dist", "index.js")
	graph := filepath.Join(t.TempDir(), "graph.jsonl")
	ctx := context.Background()
	mc, err := agent.ConnectMCP(ctx, agent.MCPServer{Name: "memory", Command: []string{node, server}, Env: map[string]string{"MEMORY_FILE_PATH": graph}})
	if err != nil {
		t.Fatal(err)
	}
	defer mc.Close()
	upstream, err := mc.Tools(ctx)
	if err != nil {
		t.Fatal(err)
	}
	c := DefaultConfig()
	c.TopK = 1
	g, err := NewGateway(ctx, embed.NewHashing(384, []int{3, 4}), upstream, c)
	if err != nil {
		t.Fatal(err)
	}
	sess, changed := gatewayClient(t, g, "")
	for _, kw := range []string{"create multiple new entities in the knowledge graph", "read the entire knowledge graph"} {
		if out, isErr := callText(t, sess, SearchTools, map[string]any{"keywords": []string{kw}}); isErr || !strings.HasPrefix(out, "1 tools added") {
			t.Fatalf("search %q: %q", kw, out)
		}
	}
	waitFor(t, "tools/list_changed", func() bool { return changed.Load() > 0 })
	if got := listNames(t, sess); !slices.Contains(got, "create_entities") || !slices.Contains(got, "read_graph") || len(got) != 4 {
		t.Fatalf("tools after the searches: %v (of %d upstream)", got, len(upstream))
	}
	if _, isErr := callText(t, sess, "create_entities", map[string]any{"entities": []any{map[string]any{"name": "Ada", "entityType": "person", "observations": []string{"is the user's sister"}}}}); isErr {
		t.Fatal("create_entities failed")
	}
	if out, _ := callText(t, sess, "read_graph", map[string]any{}); !strings.Contains(out, "is the user's sister") {
		t.Fatalf("read_graph: %q", out)
	}
	if raw, err := os.ReadFile(graph); err != nil || !strings.Contains(string(raw), "Ada") {
		t.Fatalf("the upstream server's file: %v", err)
	}
}
