package agent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"sync"

	"github.com/agemem/agemem/internal/valid"
	"github.com/agemem/agemem/model/chat"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// MCPServer is an MCP server whose tools join a run's tools (config
// section mcp.servers, or agemem-train agent's --mcp-url/--mcp-command): a
// command started over stdio (with env added to ours), or a URL of a
// streamable-HTTP endpoint with headers (for example Authorization).
// Header and env values may name environment variables as ${NAME}, read
// when the server is connected, so a config file need not hold secrets.
type MCPServer struct {
	Name    string            `yaml:"name"`
	Command []string          `yaml:"command"`
	Env     map[string]string `yaml:"env"`
	URL     string            `yaml:"url"`
	Headers map[string]string `yaml:"headers"`
}

// MCPConfig is the config section mcp.
type MCPConfig struct {
	// Servers are connected by agemem-train agent; their tools join the
	// loop's.
	Servers []MCPServer `yaml:"servers"`
}

// Validate checks every server: a unique name, a command or an http(s)
// url (not both), env only with a command, headers only with a url.
func (c MCPConfig) Validate() error {
	var e valid.Errors
	seen := map[string]bool{}
	for i, s := range c.Servers {
		key := fmt.Sprintf("servers[%d]", i)
		switch {
		case s.Name == "":
			e.Add(key+".name", "is required (it names the server in errors and traces)")
		case seen[s.Name]:
			e.Add(key+".name", "%q names two servers", s.Name)
		}
		seen[s.Name] = true
		switch {
		case len(s.Command) > 0 && s.URL != "":
			e.Add(key, "gives both a command and a url: one server is one or the other")
		case len(s.Command) == 0 && s.URL == "":
			e.Add(key, "needs a command (stdio, e.g. [npx, -y, \"@modelcontextprotocol/server-memory\"]) or a url (streamable HTTP)")
		case s.URL != "":
			if u, err := url.Parse(s.URL); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
				e.Add(key+".url", "%q is not an http(s) URL", s.URL)
			}
			if len(s.Env) > 0 {
				e.Add(key+".env", "is for command servers; a url server takes headers")
			}
		default:
			if strings.TrimSpace(s.Command[0]) == "" {
				e.Add(key+".command", "starts with an empty program name")
			}
			if len(s.Headers) > 0 {
				e.Add(key+".headers", "are for url servers; a command server takes env")
			}
		}
	}
	return e.Err()
}

// envRef is ${NAME}; any other $ in a value is literal.
var envRef = regexp.MustCompile(`\$\{([A-Za-z_][A-Za-z0-9_]*)\}`)

// expand replaces ${NAME} in each value by the environment variable,
// failing on one that is not set (a missing API key would otherwise be
// sent as an empty header).
func expand(server, what string, m map[string]string) (map[string]string, error) {
	out := make(map[string]string, len(m))
	for k, v := range m {
		var missing string
		out[k] = envRef.ReplaceAllStringFunc(v, func(ref string) string {
			name := ref[2 : len(ref)-1]
			val, ok := os.LookupEnv(name)
			if !ok && missing == "" {
				missing = name
			}
			return val
		})
		if missing != "" {
			return nil, fmt.Errorf("MCP server %q: %s %s names ${%s}, which is not set in the environment", server, what, k, missing)
		}
	}
	return out, nil
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
		env, err := expand(s.Name, "env", s.Env)
		if err != nil {
			return nil, err
		}
		cmd := exec.Command(s.Command[0], s.Command[1:]...)
		if len(env) > 0 {
			cmd.Env = os.Environ()
			for k, v := range env {
				cmd.Env = append(cmd.Env, k+"="+v)
			}
		}
		t = &mcp.CommandTransport{Command: cmd}
	case s.URL != "" && len(s.Command) == 0:
		hdr, err := expand(s.Name, "header", s.Headers)
		if err != nil {
			return nil, err
		}
		t = &mcp.StreamableClientTransport{Endpoint: s.URL, MaxRetries: -1, HTTPClient: &http.Client{Transport: headers{hdr, http.DefaultTransport}}}
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

// ConnectAll connects to every server and lists their tools, in the
// servers' order; closeAll ends every session. On an error the sessions
// opened so far are closed and the error names the server.
func ConnectAll(ctx context.Context, servers []MCPServer) (tools []Tool, closeAll func(), err error) {
	var clients []*MCPClient
	closeAll = func() {
		for _, c := range clients {
			c.Close()
		}
	}
	for _, sv := range servers {
		c, err := ConnectMCP(ctx, sv)
		if err != nil {
			closeAll()
			return nil, nil, err
		}
		clients = append(clients, c)
		ts, err := c.Tools(ctx)
		if err != nil {
			closeAll()
			return nil, nil, err
		}
		tools = append(tools, ts...)
	}
	return tools, closeAll, nil
}

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
		out = append(out, Tool{Function: chat.Function{Name: name, Description: t.Description, Parameters: schema}, Server: c.server.Name,
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
