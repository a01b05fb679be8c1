package agent

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/agemem/agemem/model/chat"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

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
	m := &script{replies: []chat.Message{{ToolCalls: []chat.ToolCall{call("", "b", "{}")}}, {Content: "done"}}}
	tr, err := Run(ctx, m, ts, nil, Limits{MaxSteps: 3})
	if err != nil || tr.Steps[0].Results[0].Result != "from b" || len(m.specs[0]) != 2 {
		t.Fatalf("%v %+v (specs %v)", err, tr, m.specs)
	}
}

// TestMCPHeadersReadTheEnvironment: ${NAME} in a header is the variable's
// value when connecting; an unset one is an error naming server, header and
// variable, before anything is sent.
func TestMCPHeadersReadTheEnvironment(t *testing.T) {
	t.Setenv("AGEMEM_TEST_KEY", "s3cret")
	got, err := expand("srv", "header", map[string]string{"Authorization": "Bearer ${AGEMEM_TEST_KEY}", "X-Plain": "a$b$"})
	if err != nil || got["Authorization"] != "Bearer s3cret" || got["X-Plain"] != "a$b$" {
		t.Fatalf("expand: %v %v", got, err)
	}
	_, err = ConnectMCP(t.Context(), MCPServer{Name: "srv", URL: "http://127.0.0.1:1/mcp", Headers: map[string]string{"Authorization": "Bearer ${AGEMEM_TEST_UNSET}"}})
	if err == nil || !strings.Contains(err.Error(), `MCP server "srv": header Authorization names ${AGEMEM_TEST_UNSET}`) {
		t.Fatalf("unset variable: %v", err)
	}
}
