package agent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os/exec"
	"strings"
	"sync"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// MCPServer is an MCP server whose tools join a run's tools (config
// section agent.mcp_servers): a command started with stdio, or a URL of a
// streamable-HTTP endpoint with headers (for example Authorization).
type MCPServer struct {
	Name    string            `yaml:"name"`
	Command []string          `yaml:"command"`
	URL     string            `yaml:"url"`
	Headers map[string]string `yaml:"headers"`
}

// MCPClient is a connection to one MCP server.
type MCPClient struct {
	server  MCPServer
	session *mcp.ClientSession
	mu      sync.Mutex
	changed bool // the server said its tool list changed
}

// ConnectMCP starts or dials the server and opens a session with the
// official SDK's client.
func ConnectMCP(ctx context.Context, s MCPServer) (*MCPClient, error) {
	c := &MCPClient{server: s}
	client := mcp.NewClient(&mcp.Implementation{Name: "agemem", Version: "1"}, &mcp.ClientOptions{
		ToolListChangedHandler: func(context.Context, *mcp.ToolListChangedRequest) {
			c.mu.Lock()
			c.changed = true
			c.mu.Unlock()
		}})
	var t mcp.Transport
	switch {
	case len(s.Command) > 0 && s.URL == "":
		t = &mcp.CommandTransport{Command: exec.Command(s.Command[0], s.Command[1:]...)}
	case s.URL != "" && len(s.Command) == 0:
		t = &mcp.StreamableClientTransport{Endpoint: s.URL, MaxRetries: -1, HTTPClient: &http.Client{Transport: headers{s.Headers, http.DefaultTransport}}}
	default:
		return nil, fmt.Errorf("MCP server %q: give either a command (stdio) or a url (streamable HTTP)", s.Name)
	}
	sess, err := client.Connect(ctx, t, nil)
	if err != nil {
		return nil, fmt.Errorf("MCP server %q: %w", s.Name, err)
	}
	c.session = sess
	return c, nil
}

type headers struct {
	h    map[string]string
	next http.RoundTripper
}

func (h headers) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	for k, v := range h.h {
		r.Header.Set(k, v)
	}
	return h.next.RoundTrip(r)
}

// Close ends the session (and stops a stdio server).
func (c *MCPClient) Close() error { return c.session.Close() }

// Changed reports, once, that the server announced a new tool list
// (notifications/tools/list_changed): the caller lists the tools again.
func (c *MCPClient) Changed() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	ch := c.changed
	c.changed = false
	return ch
}

// Tools lists the server's tools as Tools whose Call goes to the server. A
// server that fails or dies mid-run makes the call fail, which the loop
// reports to the model; a result the server marks as an error likewise.
func (c *MCPClient) Tools(ctx context.Context) ([]Tool, error) {
	var out []Tool
	for t, err := range c.session.Tools(ctx, nil) {
		if err != nil {
			return nil, fmt.Errorf("MCP server %q: listing tools: %w", c.server.Name, err)
		}
		schema, err := json.Marshal(t.InputSchema)
		if err != nil {
			return nil, fmt.Errorf("MCP server %q: tool %q: %w", c.server.Name, t.Name, err)
		}
		name := t.Name
		out = append(out, Tool{Spec: Spec{Name: name, Description: t.Description, Parameters: schema},
			Call: func(ctx context.Context, args json.RawMessage) (string, error) {
				res, err := c.session.CallTool(ctx, &mcp.CallToolParams{Name: name, Arguments: args})
				if err != nil {
					return "", fmt.Errorf("MCP server %q: %w", c.server.Name, err)
				}
				text := resultText(res)
				if res.IsError {
					return "", errors.New(text)
				}
				return text, nil
			}})
	}
	return out, nil
}

// resultText is a call result as the model reads it: the text parts, or
// the structured content as JSON when there is no text.
func resultText(res *mcp.CallToolResult) string {
	var parts []string
	for _, c := range res.Content {
		if t, ok := c.(*mcp.TextContent); ok {
			parts = append(parts, t.Text)
		}
	}
	if len(parts) == 0 && res.StructuredContent != nil {
		raw, _ := json.Marshal(res.StructuredContent)
		return string(raw)
	}
	return strings.Join(parts, "\n")
}
