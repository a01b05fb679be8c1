// Package serve is the HTTP server that puts a trained AgeMem policy in
// front of users: an OpenAI-compatible chat endpoint that runs the memory
// agent loop against each user's long-term memory, a memory API, an MCP
// endpoint exposing the memory tools, health checks and Prometheus metrics.
package serve

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"sync/atomic"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/agemem/agemem/embed"
	"github.com/agemem/agemem/llm"
	"github.com/agemem/agemem/llm/native"
	"github.com/agemem/agemem/memtools"
	"github.com/agemem/agemem/memtools/ltm"
	"github.com/agemem/agemem/memtools/stm"
	"github.com/agemem/agemem/model/chat"
	"github.com/agemem/agemem/model/engine"
	"github.com/agemem/agemem/papers/memtool"
)

// prefillChunk bounds the prompt tokens a request feeds in one decoding
// step, so that a long new prompt delays the answers already streaming by
// at most one chunk.
const prefillChunk = 512

// Options assemble a server.
type Options struct {
	Config Config // the serve section
	// Agent and Tools are the agent loop's and the tools' sections;
	// Namespace is memory.namespace, the open server's namespace.
	Agent     memtools.Agent
	Tools     memtools.Options
	Namespace string
	// Backend is the policy; or Native, a checkpoint New serves on the
	// native engine (serve.max_batch, prefix_cache, kv_budget).
	Backend  Backend
	Native   *native.Checkpoint
	Store    ltm.DB
	Embedder embed.Embedder
	// Summarizer, if set, replaces the extractive summariser of
	// Summary_context (tools.summarizer ollama).
	Summarizer memtools.Summarizer
	// ToolGateway, if set, is served at /mcp/tools: MemTool's working set
	// of tools in front of the config's MCP servers, one per namespace.
	ToolGateway *memtool.Gateway
	Logger      *slog.Logger
}

// Server is the HTTP server. Handler serves it; Serve runs it on a
// listener until its context ends, then shuts down gracefully.
type Server struct {
	cfg      Config
	agent    memtools.Agent
	tools    memtools.Options
	ns       string
	be       Backend
	db       ltm.DB
	enc      embed.Embedder
	sum      memtools.Summarizer
	log      *slog.Logger
	keys     *keyring
	sessions *sessions
	journal  *journal // recent turns, for the console
	lists    *lists   // memory lists, for the console
	admit    *admission
	metrics  *metrics
	system   string
	ready    atomic.Bool
	handler  http.Handler
	health   http.Handler // health and readiness alone, for refused connections
	trusted  proxies      // serve.trusted_proxies
	created  int64
	// stopping ends when Serve begins to shut down: MCP streams, which
	// would otherwise stay open until the shutdown timeout, end with it.
	stopping context.Context
	stop     context.CancelFunc
}

// New checks the options and builds the routes.
func New(o Options) (*Server, error) {
	if (o.Backend == nil && o.Native == nil) || o.Store == nil || o.Embedder == nil {
		return nil, errors.New("serve: a policy, a store and an embedder are required")
	}
	sys, err := memtools.SystemPromptWith(o.Agent.SystemPrompt, o.Tools.Offered())
	if err != nil {
		return nil, err
	}
	kr, err := newKeyring(o.Config, o.Namespace)
	if err != nil {
		return nil, err
	}
	trusted, err := parseProxies(o.Config.TrustedProxies)
	if err != nil {
		return nil, err
	}
	log := o.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	sv := o.Config
	s := &Server{cfg: o.Config, agent: o.Agent, tools: o.Tools, ns: o.Namespace, be: o.Backend, db: o.Store, enc: o.Embedder, sum: o.Summarizer, log: log, keys: kr,
		sessions: newSessions(sv.SessionTTL, sv.MaxSessions, sv.MaxSessionsPerNamespace),
		journal:  newJournal(sv.Console.Turns, sv.Console.TurnsPerNamespace), lists: newLists(sv.Console.ListRefresh),
		system: sys, created: time.Now().Unix(), trusted: trusted}
	s.stopping, s.stop = context.WithCancel(context.Background())
	s.metrics = newMetrics(s)
	s.admit = newAdmission(sv, func(limit string) { s.metrics.refused.WithLabelValues(limit).Inc() })
	if s.be == nil {
		prompt, resp := sv.MaxPromptTokens, sv.MaxTokens
		if prompt == 0 {
			prompt = s.agent.ContextBudget
		}
		if resp == 0 {
			resp = s.agent.ResponseBudget
		}
		if sv.KVBudget > 0 && sv.KVBudget < prompt+resp {
			return nil, fmt.Errorf("serve.kv_budget %d is below a request's largest prompt (%d: serve.max_prompt_tokens, else agent.context_budget) plus its max tokens (%d: serve.max_tokens, else agent.response_budget): such a request could never run; raise kv_budget or lower those", sv.KVBudget, prompt, resp)
		}
		budget := sv.PrefixCache
		if budget == 0 {
			budget = -1
		}
		e := o.Native.Start(native.Options{Sampling: llm.Sampling{MaxTokens: s.agent.ResponseBudget},
			Engine: engine.Options{MaxBatch: sv.MaxBatch, PrefillChunk: prefillChunk, PrefixBudget: budget, KVBudget: sv.KVBudget, OnStep: s.metrics.step}})
		if err := e.SharePrefix([]chat.Message{{Role: stm.System, Content: sys}}); err != nil {
			e.Close()
			return nil, err
		}
		s.be = e
	}
	if len(kr.keys) == 0 {
		log.Warn("no API keys configured: the server is open and every request uses one namespace",
			"namespace", o.Namespace, "hint", "set serve.keys or $"+sv.KeysEnv)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", healthz)
	mux.HandleFunc("GET /readyz", s.readyz)
	health := http.NewServeMux()
	health.HandleFunc("GET /healthz", healthz)
	health.HandleFunc("GET /readyz", s.readyz)
	s.health = health
	mux.Handle("GET /metrics", promhttp.HandlerFor(s.metrics.reg, promhttp.HandlerOpts{}))
	mux.HandleFunc("GET /openapi.json", serveOpenAPI)
	api := func(pattern string, h func(http.ResponseWriter, *http.Request) *apiError) {
		mux.Handle(pattern, s.authed(h))
	}
	api("GET /v1/models", s.models)
	api("GET /v1/models/{model}", s.model)
	api("POST /v1/chat/completions", s.chat)
	api("POST /v1/embeddings", s.embeddings)
	api("DELETE /v1/sessions/{id}", s.deleteSession)
	api("GET /v1/memories", s.listMemories)
	api("POST /v1/memories", s.addMemory)
	api("POST /v1/memories/search", s.searchMemories)
	api("GET /v1/memories/export", s.exportMemories)
	api("POST /v1/memories/import", s.importMemories)
	api("GET /v1/memories/{id}", s.getMemory)
	api("PATCH /v1/memories/{id}", s.updateMemory)
	api("DELETE /v1/memories/{id}", s.deleteMemory)
	api("GET /v1/namespaces", s.namespaces)
	mux.Handle("/mcp", s.mcpHandler())
	if o.ToolGateway != nil {
		gw := o.ToolGateway
		mux.Handle("/mcp/tools", s.mcpHTTP(func(r *http.Request) *mcp.Server { return gw.Server(mcpNamespace(r.Context(), s.ns)) }))
	}
	if sv.Console.Enabled {
		if err := s.mountConsole(mux); err != nil {
			s.be.Close()
			return nil, err
		}
	}
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeError(w, &apiError{Status: http.StatusNotFound, Type: "invalid_request_error", Code: "not_found",
			Message: fmt.Sprintf("no route for %s %s", r.Method, r.URL.Path)})
	})
	s.handler = s.observe(clientLimit(cleanPaths(mux)))
	s.ready.Store(true)
	return s, nil
}

// Handler is the server's http.Handler.
func (s *Server) Handler() http.Handler { return s.handler }

// Close stops the backend (call after the HTTP server has drained).
func (s *Server) Close() { s.be.Close() }

// Serve serves on ln until ctx ends, then stops taking connections, marks
// itself not ready, ends open MCP streams (a client's GET for what the
// server sends unasked never finishes by itself), waits up to
// serve.shutdown_timeout for requests in flight to finish and returns. The store is left to the caller, which
// closes it after Serve returns: every write went through a transaction,
// so the file is consistent whenever the process stops.
func (s *Server) Serve(ctx context.Context, ln net.Listener) error {
	sv := s.cfg
	hs := &http.Server{Handler: s.handler, ReadHeaderTimeout: sv.ReadHeaderTimeout, ReadTimeout: sv.ReadTimeout,
		WriteTimeout: sv.RequestTimeout + time.Minute, IdleTimeout: sv.IdleTimeout, MaxHeaderBytes: sv.MaxHeaderBytes,
		ErrorLog: slog.NewLogLogger(s.log.Handler(), slog.LevelWarn)}
	hs.ConnContext = withConn
	lim := newLimitListener(ln, sv.MaxConnections, sv.MaxConnectionsPerClient, s.trusted, s.health,
		func(reason string) { s.metrics.refused.WithLabelValues(reason).Inc() })
	hs.RegisterOnShutdown(s.stop)
	errc := make(chan error, 1)
	go func() { errc <- hs.Serve(lim) }()
	s.log.Info("serving", "addr", ln.Addr().String(), "model", s.cfg.ModelName,
		"max_batch", s.cfg.MaxBatch, "max_concurrent", s.cfg.MaxConcurrent, "max_queue", s.cfg.MaxQueue)
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	s.ready.Store(false)
	s.log.Info("shutting down: finishing requests in flight", "timeout", s.cfg.ShutdownTimeout.String(), "active", s.admit.active())
	sctx, cancel := context.WithTimeout(context.Background(), s.cfg.ShutdownTimeout)
	defer cancel()
	err := hs.Shutdown(sctx)
	if err != nil {
		s.log.Warn("shutdown timed out; closing connections", "err", err)
		hs.Close()
	}
	s.Close()
	s.log.Info("stopped")
	return nil
}

func healthz(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, 200, map[string]string{"status": "ok"})
}

func (s *Server) readyz(w http.ResponseWriter, _ *http.Request) {
	if !s.ready.Load() {
		writeJSON(w, http.StatusServiceUnavailable, map[string]string{"status": "shutting down"})
		return
	}
	if err := s.db.Ping(); err != nil {
		writeJSON(w, http.StatusServiceUnavailable, map[string]string{"status": "store unavailable", "error": err.Error()})
		return
	}
	writeJSON(w, 200, map[string]any{"status": "ready", "active": s.admit.active(), "queued": s.admit.queued()})
}

// statusWriter records the status for logs and metrics; it forwards
// Flush so streaming works through it.
type statusWriter struct {
	http.ResponseWriter
	code int
}

func (w *statusWriter) WriteHeader(code int) {
	if w.code == 0 {
		w.code = code
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusWriter) Write(b []byte) (int, error) {
	if w.code == 0 {
		w.code = 200
	}
	return w.ResponseWriter.Write(b)
}

func (w *statusWriter) Flush() {
	if f, ok := w.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// observe logs every request and counts it by route pattern (not raw path,
// which would make a series per memory id).
func (s *Server) observe(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		sw := &statusWriter{ResponseWriter: w}
		next.ServeHTTP(sw, r)
		route := r.Pattern
		if route == "" || route == "/" {
			route = "other"
		}
		if sw.code == 0 {
			sw.code = 200
		}
		d := time.Since(start)
		s.metrics.observe(route, sw.code, d.Seconds())
		if route == "GET /healthz" || route == "GET /readyz" || route == "GET /metrics" {
			return
		}
		p := principalFrom(r.Context())
		s.log.Info("request", "method", r.Method, "path", r.URL.Path, "status", sw.code,
			"duration_ms", float64(d.Microseconds())/1000, "key", p.KeyID, "remote", r.RemoteAddr)
	})
}

// authed wraps an API handler: the key is checked, the body bounded by
// serve.max_body_bytes, the request by serve.request_timeout, and a
// returned error written as JSON.
func (s *Server) authed(h func(http.ResponseWriter, *http.Request) *apiError) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		p, aerr := s.keys.authenticate(r)
		if aerr != nil {
			writeError(w, aerr)
			return
		}
		// observe reads the principal for its log line from the same
		// request value, so store it in place.
		*r = *r.WithContext(withPrincipal(r.Context(), p))
		if aerr := s.admit.allow(p.KeyID); aerr != nil {
			writeError(w, aerr)
			return
		}
		ctx, cancel := context.WithTimeout(r.Context(), s.cfg.RequestTimeout)
		defer cancel()
		r.Body = http.MaxBytesReader(w, r.Body, s.cfg.MaxBodyBytes)
		if aerr := h(w, r.WithContext(ctx)); aerr != nil {
			if aerr.Status >= 500 {
				var cause any = aerr.Message
				if aerr.cause != nil {
					cause = aerr.cause.Error()
				}
				s.log.Error("request failed", "path", r.URL.Path, "status", aerr.Status, "code", aerr.Code, "err", cause)
			}
			writeError(w, aerr)
		}
	})
}

// contextError maps a context error of a request to its response.
func contextError(err error) *apiError {
	if errors.Is(err, context.DeadlineExceeded) {
		return &apiError{Status: http.StatusGatewayTimeout, Type: "timeout", Code: "request_timeout",
			Message: "the request took longer than serve.request_timeout"}
	}
	return &apiError{Status: 499, Type: "invalid_request_error", Code: "cancelled", Message: "the client went away"}
}
