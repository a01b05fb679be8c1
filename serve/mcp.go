package serve

import (
	"context"
	"encoding/json"
	"net/http"

	"github.com/modelcontextprotocol/go-sdk/auth"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/agemem/agemem/embed"
	"github.com/agemem/agemem/memtools"
	"github.com/agemem/agemem/memtools/ltm"
	"github.com/agemem/agemem/memtools/stm"
)

// MCPTools are the tools the MCP server exposes: the long-term memory
// tools of Figure 7, with the schemas the policy sees, so other agents use
// the same memory with the same semantics. (The context tools act on the
// policy's own context and are not exposed.)
var MCPTools = []string{memtools.ToolAdd, memtools.ToolUpdate, memtools.ToolDelete, memtools.ToolRetrieve}

// MemoryTools is the runtime the MCP tools act on.
type MemoryTools struct {
	Store    *ltm.SQLite
	Embedder embed.Embedder
	Options  memtools.Options
	// Namespace gives the namespace of a call: the caller's key's over
	// HTTP, a fixed one over stdio.
	Namespace func(ctx context.Context, req *mcp.CallToolRequest) string
}

// NewMCPServer returns an MCP server with the memory tools.
func NewMCPServer(t MemoryTools, version string) *mcp.Server {
	srv := mcp.NewServer(&mcp.Implementation{Name: "agemem-memory", Version: version}, nil)
	for _, sc := range memtools.Schemas() {
		if !contains(MCPTools, sc.Name) {
			continue
		}
		schema := map[string]any{"type": "object", "properties": sc.Parameters.Properties, "required": sc.Parameters.Required}
		if sc.Parameters.Required == nil {
			schema["required"] = []string{}
		}
		name := sc.Name
		srv.AddTool(&mcp.Tool{Name: name, Description: sc.Description, InputSchema: schema},
			func(ctx context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
				st, err := t.Store.Namespace(t.Namespace(ctx, req))
				if err != nil {
					return nil, err
				}
				rt := &memtools.Runtime{Store: st, Context: stm.New(nil), Embedder: t.Embedder, Options: t.Options}
				args := req.Params.Arguments
				if len(args) == 0 {
					args = json.RawMessage("{}")
				}
				res, err := rt.Execute(ctx, memtools.Call{Name: name, Arguments: args})
				if err != nil {
					return nil, err // the store failed: a protocol error
				}
				// A bad argument is a tool error the calling model can read
				// and correct, as in the agent loop.
				return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: res.Content}}, IsError: !res.OK}, nil
			})
	}
	return srv
}

func contains(xs []string, x string) bool {
	for _, y := range xs {
		if y == x {
			return true
		}
	}
	return false
}

// mcpHandler serves MCP over streamable HTTP at /mcp. The API key is
// checked by the SDK's bearer-token middleware; the token's UserID binds
// each MCP session to its key, so a session id cannot be used with
// another key.
func (s *Server) mcpHandler() http.Handler {
	srv := NewMCPServer(MemoryTools{Store: s.db, Embedder: s.enc, Options: s.tools,
		Namespace: func(_ context.Context, req *mcp.CallToolRequest) string {
			if ti := req.Extra.TokenInfo; ti != nil {
				if ns, ok := ti.Extra["namespace"].(string); ok {
					return ns
				}
			}
			return s.ns
		}}, "1")
	h := http.Handler(mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return srv },
		&mcp.StreamableHTTPOptions{MaxRequestBodyBytes: s.cfg.MaxBodyBytes, SessionTimeout: s.cfg.SessionTTL}))
	if len(s.keys.keys) == 0 {
		return h // open server: every MCP call uses memory.namespace
	}
	verify := func(_ context.Context, token string, r *http.Request) (*auth.TokenInfo, error) {
		p, aerr := s.keys.lookup(token)
		if aerr != nil {
			return nil, auth.ErrInvalidToken
		}
		ns, aerr := namespace(r, p)
		if aerr != nil {
			return nil, auth.ErrInvalidToken
		}
		*r = *r.WithContext(withPrincipal(r.Context(), p))
		return &auth.TokenInfo{UserID: p.KeyID + "/" + ns, Extra: map[string]any{"namespace": ns}}, nil
	}
	sdk := auth.RequireBearerToken(verify, &auth.RequireBearerTokenOptions{AllowMissingExpiration: true})(h)
	// The key and the namespace are checked here first, so that a refusal
	// is the same JSON error (401, or 403 for a key naming another
	// namespace) as on every other route, not the SDK's plain-text 401.
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		p, aerr := s.keys.authenticate(r)
		if aerr == nil {
			_, aerr = namespace(r, p)
		}
		if aerr != nil {
			writeError(w, aerr)
			return
		}
		sdk.ServeHTTP(w, r)
	})
}
