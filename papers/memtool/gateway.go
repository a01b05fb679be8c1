package memtool

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"sync"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/agemem/agemem/agent"
	"github.com/agemem/agemem/embed"
	"github.com/agemem/agemem/model/chat"
)

// Gateway is MemTool's Autonomous mode as an MCP server in front of many
// MCP servers: a client (any MCP host with hundreds of tools behind it)
// sees SYS_SEARCH_TOOLS, SYS_REMOVE_TOOLS and its current working set,
// never the whole catalogue. A search adds the tools found, a removal drops
// tools; either way the client is told with notifications/tools/list_changed.
// Calls of working-set tools go to the server that owns them. Each working
// set has an id (serve gives one per API key's namespace), so tenants do
// not share tools.
type Gateway struct {
	kb          *agent.Catalog
	exec        Executor
	limit, topK int

	mu   sync.Mutex
	sets map[string]*gatewaySet
}

type gatewaySet struct {
	srv   *mcp.Server
	mu    sync.Mutex
	tools []string // the working set, in the order added
}

// NewGateway indexes the upstream tools (agent.MCPClient.Tools of each
// server; their Call goes to the server) with emb (Upstream).
func NewGateway(ctx context.Context, emb embed.Embedder, upstream []agent.Tool, c Config) (*Gateway, error) {
	if c.Limit < 3 || c.TopK < 1 {
		return nil, fmt.Errorf("memtool gateway: limit %d (at least 3) or top_k %d (at least 1)", c.Limit, c.TopK)
	}
	kb, exec, err := Upstream(ctx, emb, upstream)
	if err != nil {
		return nil, fmt.Errorf("memtool gateway: %w", err)
	}
	return &Gateway{kb: kb, exec: exec, limit: c.Limit, topK: c.TopK, sets: map[string]*gatewaySet{}}, nil
}

// Upstream makes live tools (MCP servers' tools, agent.ConnectAll) a
// knowledge base and an Executor that calls each on its server. Names two
// servers share are qualified with the server's (agent.Qualify: server__name); a
// call still reaches the tool by its own name. A tool may not take a
// meta-tool's name.
func Upstream(ctx context.Context, emb embed.Embedder, upstream []agent.Tool) (*agent.Catalog, Executor, error) {
	tools := make([]agent.CatalogTool, len(upstream))
	for i, t := range upstream {
		tools[i] = agent.CatalogTool{Function: t.Function, Server: t.Server}
		tools[i].Parameters = agent.ParametersOrEmpty(t.Parameters)
	}
	agent.Qualify(tools)
	calls := map[string]func(context.Context, json.RawMessage) (string, error){}
	for i, t := range tools {
		if t.Name == SearchTools || t.Name == RemoveTools {
			return nil, nil, fmt.Errorf("an upstream tool is named %s, a meta-tool's name", t.Name)
		}
		calls[t.Name] = upstream[i].Call
	}
	kb, err := agent.NewCatalog(ctx, emb, tools)
	if err != nil {
		return nil, nil, err
	}
	exec := func(ctx context.Context, t agent.CatalogTool, args json.RawMessage) (string, error) {
		call, ok := calls[t.Name]
		if !ok {
			return "", fmt.Errorf("no upstream tool %q", t.Name)
		}
		return call(ctx, args)
	}
	return kb, exec, nil
}

// Len is the number of upstream tools.
func (g *Gateway) Len() int { return g.kb.Len() }

// WorkingSet is the tools loaded in working set id.
func (g *Gateway) WorkingSet(id string) []string {
	s := g.set(id)
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.tools)
}

// Server is the MCP server of working set id (made on first use).
func (g *Gateway) Server(id string) *mcp.Server { return g.set(id).srv }

func (g *Gateway) set(id string) *gatewaySet {
	g.mu.Lock()
	defer g.mu.Unlock()
	if s, ok := g.sets[id]; ok {
		return s
	}
	s := &gatewaySet{srv: mcp.NewServer(&mcp.Implementation{Name: "agemem-memtool", Version: "1"}, nil)}
	// The meta-tools a Conversation's agent has, their text and results
	// the same, so that a policy trained there meets them here unchanged.
	schema := func(f chat.Function) map[string]any {
		var m map[string]any
		json.Unmarshal(f.Parameters, &m)
		return m
	}
	search, remove := searchSpec(), removeSpec()
	s.srv.AddTool(&mcp.Tool{Name: SearchTools, InputSchema: schema(search), Description: search.Description},
		func(ctx context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
			var a struct{ Keywords []string }
			if err := json.Unmarshal(rawArgs(req), &a); err != nil || len(a.Keywords) == 0 {
				return textResult("error: give keywords, a list of strings", true), nil
			}
			return g.search(ctx, s, a.Keywords)
		})
	s.srv.AddTool(&mcp.Tool{Name: RemoveTools, InputSchema: schema(remove), Description: remove.Description},
		func(_ context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
			var a struct {
				ToolNames []string `json:"tool_names"`
			}
			if err := json.Unmarshal(rawArgs(req), &a); err != nil {
				return textResult("error: give tool_names, a list of strings", true), nil
			}
			s.mu.Lock()
			var gone []string
			s.tools = slices.DeleteFunc(s.tools, func(n string) bool {
				if slices.Contains(a.ToolNames, n) {
					gone = append(gone, n)
					return true
				}
				return false
			})
			s.mu.Unlock()
			if len(gone) > 0 {
				s.srv.RemoveTools(gone...)
			}
			return textResult(removedText(gone, a.ToolNames), false), nil
		})
	g.sets[id] = s
	return s
}

func (g *Gateway) search(ctx context.Context, s *gatewaySet, keywords []string) (*mcp.CallToolResult, error) {
	found, err := g.kb.Search(ctx, keywords, g.topK)
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	var fresh []agent.CatalogTool
	for _, t := range found {
		if !slices.Contains(s.tools, t.Name) {
			fresh = append(fresh, t)
		}
	}
	if len(s.tools)+len(fresh)+2 > g.limit {
		s.mu.Unlock()
		return textResult(limitHit, true), nil
	}
	for _, t := range fresh {
		s.tools = append(s.tools, t.Name)
	}
	s.mu.Unlock()
	for _, t := range fresh {
		var schema map[string]any
		if err := json.Unmarshal(t.Parameters, &schema); err != nil || schema == nil {
			schema = map[string]any{"type": "object"}
		}
		s.srv.AddTool(&mcp.Tool{Name: t.Name, Description: t.Description, InputSchema: schema},
			func(ctx context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
				out, err := g.exec(ctx, t, rawArgs(req))
				if err != nil {
					return textResult(err.Error(), true), nil
				}
				return textResult(out, false), nil
			})
	}
	return textResult(addedText(names(fresh)), false), nil
}

func rawArgs(req *mcp.CallToolRequest) json.RawMessage {
	if len(req.Params.Arguments) == 0 {
		return json.RawMessage("{}")
	}
	return req.Params.Arguments
}

func textResult(text string, isErr bool) *mcp.CallToolResult {
	return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: text}}, IsError: isErr}
}
