package serve

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"math"
	"net/http"
	"slices"
	"strconv"
	"strings"

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
	Store    ltm.DB
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
		name, props := sc.Name, sc.Parameters.Properties
		srv.AddTool(&mcp.Tool{Name: name, Description: sc.Description, InputSchema: schema, OutputSchema: outputSchema,
			Annotations: annotations[name]},
			func(ctx context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
				args := req.Params.Arguments
				if len(args) == 0 {
					args = json.RawMessage("{}")
				}
				// MCP clients send typed JSON: a type the schema does not
				// allow is refused here (the agent loop, which reads what a
				// small model wrote, is lenient: "2" for 2).
				if msg := wrongType(args, props); msg != "" {
					return toolResult(`{"status":"error","message":`+strconv.Quote(msg)+`}`, false), nil
				}
				st, err := t.Store.Namespace(t.Namespace(ctx, req))
				if err != nil {
					return nil, err
				}
				rt := &memtools.Runtime{Store: st, Context: stm.New(nil), Embedder: t.Embedder, Options: t.Options}
				res, err := rt.Execute(ctx, memtools.Call{Name: name, Arguments: args})
				if err != nil {
					return nil, err // the store failed: a protocol error
				}
				// A bad argument is a tool error the calling model can read
				// and correct, as in the agent loop.
				return toolResult(res.Content, res.OK), nil
			})
	}
	return srv
}

// outputSchema is what every memory tool returns: a status ("success" or
// "error") and the tool's fields (memory_id, message, memories).
var outputSchema = map[string]any{"type": "object", "required": []string{"status"}, "properties": map[string]any{
	"status":    map[string]any{"type": "string", "enum": []string{"success", "error"}},
	"memory_id": map[string]any{"type": "string"},
	"message":   map[string]any{"type": "string"},
	"memories": map[string]any{"type": "array", "items": map[string]any{"type": "object", "properties": map[string]any{
		"memory_id": map[string]any{"type": "string"}, "content": map[string]any{"type": "string"},
		"memory_type": map[string]any{"type": "string"}, "metadata": map[string]any{"type": "object"}, "score": map[string]any{"type": "number"}}}},
}}

// annotations tell clients what each tool does to the store: retrieval
// reads; adding only adds; updating and deleting overwrite (idempotent).
var annotations = map[string]*mcp.ToolAnnotations{
	memtools.ToolAdd:      {Title: "Add a memory", DestructiveHint: ptr(false), OpenWorldHint: ptr(false)},
	memtools.ToolUpdate:   {Title: "Update a memory", DestructiveHint: ptr(true), IdempotentHint: true, OpenWorldHint: ptr(false)},
	memtools.ToolDelete:   {Title: "Delete a memory", DestructiveHint: ptr(true), IdempotentHint: true, OpenWorldHint: ptr(false)},
	memtools.ToolRetrieve: {Title: "Retrieve memories", ReadOnlyHint: true, OpenWorldHint: ptr(false)},
}

func ptr[T any](v T) *T { return &v }

// toolResult is a tool's JSON result as text and as structured content.
func toolResult(content string, ok bool) *mcp.CallToolResult {
	var structured map[string]any
	json.Unmarshal([]byte(content), &structured)
	return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: content}}, StructuredContent: structured, IsError: !ok}
}

// wrongType names the first argument whose JSON type the schema does not
// allow ("" if none).
func wrongType(args json.RawMessage, props map[string]memtools.Property) string {
	var a map[string]json.RawMessage
	if json.Unmarshal(args, &a) != nil {
		return "the arguments must be a JSON object"
	}
	for _, name := range slices.Sorted(maps.Keys(a)) {
		p, ok := props[name]
		raw := a[name]
		if !ok || string(raw) == "null" {
			continue
		}
		var v any
		json.Unmarshal(raw, &v)
		okType := false
		switch x := v.(type) {
		case string:
			okType = p.Type == "string"
		case float64:
			okType = p.Type == "number" || p.Type == "integer" && x == math.Trunc(x)
		case bool:
			okType = p.Type == "boolean"
		case map[string]any:
			okType = p.Type == "object"
		case []any:
			okType = p.Type == "array"
		}
		if !okType && p.Type != "" {
			return fmt.Sprintf("argument %q must be of type %s, not %s", name, p.Type, strings.TrimSpace(string(raw)))
		}
	}
	return ""
}

func contains(xs []string, x string) bool {
	for _, y := range xs {
		if y == x {
			return true
		}
	}
	return false
}

// mcpHandler serves the memory tools over MCP (streamable HTTP) at /mcp.
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
	return s.mcpHTTP(func(*http.Request) *mcp.Server { return srv })
}

// mcpNamespace is the namespace of an MCP HTTP request (the context the
// bearer-token middleware filled): its key's, or open's on a server
// without keys.
func mcpNamespace(ctx context.Context, open string) string {
	if ti := auth.TokenInfoFromContext(ctx); ti != nil {
		if ns, ok := ti.Extra["namespace"].(string); ok {
			return ns
		}
	}
	return open
}

// mcpHTTP serves the MCP server server picks over streamable HTTP. The API
// key is checked by the SDK's bearer-token middleware; the token's UserID
// binds each MCP session to its key, so a session id cannot be used with
// another key.
func (s *Server) mcpHTTP(server func(*http.Request) *mcp.Server) http.Handler {
	sdkHandler := mcp.NewStreamableHTTPHandler(server,
		// Behind a trusted proxy on the same host, every request arrives on
		// loopback with the public Host: the SDK's DNS-rebinding guard for
		// loopback servers would refuse them all, and the proxy is the
		// server's public face, where Host is checked.
		&mcp.StreamableHTTPOptions{MaxRequestBodyBytes: s.cfg.MaxBodyBytes, SessionTimeout: s.cfg.SessionTTL,
			DisableLocalhostProtection: len(s.trusted) > 0})
	// A GET is the stream of what the server sends unasked: it lasts as
	// long as the client stays, so shutdown ends it instead of waiting.
	h := http.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodGet {
			ctx, cancel := context.WithCancel(r.Context())
			defer cancel()
			defer context.AfterFunc(s.stopping, cancel)()
			r = r.WithContext(ctx)
		}
		jw := &mcpErrorWriter{ResponseWriter: w}
		sdkHandler.ServeHTTP(jw, r)
		jw.finish()
	}))
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

// mcpErrorWriter turns the plain-text errors the MCP SDK writes with
// http.Error (a wrong Accept or Content-Type, an unknown session, a body
// too large) into the API's JSON errors; JSON-RPC answers and streams pass
// through.
type mcpErrorWriter struct {
	http.ResponseWriter
	status int
	plain  *strings.Builder // the SDK's text, once it began a plain-text error
}

func (w *mcpErrorWriter) WriteHeader(code int) {
	if code >= 400 && strings.HasPrefix(w.Header().Get("Content-Type"), "text/plain") {
		w.status, w.plain = code, &strings.Builder{}
		return
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *mcpErrorWriter) Write(b []byte) (int, error) {
	if w.plain != nil {
		return w.plain.Write(b)
	}
	return w.ResponseWriter.Write(b)
}

func (w *mcpErrorWriter) Flush() {
	if f, ok := w.ResponseWriter.(http.Flusher); ok && w.plain == nil {
		f.Flush()
	}
}

func (w *mcpErrorWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// mcpCodes name the SDK's statuses.
var mcpCodes = map[int]string{http.StatusBadRequest: "invalid_mcp_request", http.StatusForbidden: "forbidden", http.StatusNotFound: "mcp_session_not_found",
	http.StatusMethodNotAllowed: "method_not_allowed", http.StatusConflict: "mcp_stream_conflict", http.StatusRequestEntityTooLarge: "body_too_large",
	http.StatusUnsupportedMediaType: "unsupported_media_type"}

func (w *mcpErrorWriter) finish() {
	if w.plain == nil {
		return
	}
	h := w.ResponseWriter.Header()
	h.Del("X-Content-Type-Options")
	typ, code := "invalid_request_error", mcpCodes[w.status]
	if w.status >= 500 {
		typ, code = "server_error", "mcp_error"
	} else if code == "" {
		code = "mcp_error"
	}
	writeError(w.ResponseWriter, &apiError{Status: w.status, Type: typ, Code: code, Message: "MCP: " + strings.TrimSpace(w.plain.String())})
}
