package serve

import (
	"fmt"
	"strings"
	"time"

	"github.com/agemem/agemem/console"
	"github.com/agemem/agemem/internal/valid"
)

// Config is the server (config section "serve").
type Config struct {
	// Addr is the listen address.
	Addr string `yaml:"addr"`
	// Backend runs the policy: native (the built-in engine, continuous
	// batching) or ollama (the model named by Policy on the ollama server).
	Backend string `yaml:"backend"`
	// Policy is the model served: with backend native a directory (a
	// Hugging Face directory, the output of sft or train, or a PEFT adapter
	// directory; Adapter optionally names a LoRA adapter applied on top),
	// with backend ollama an Ollama model name.
	Policy  string `yaml:"policy"`
	Adapter string `yaml:"adapter"`
	// ModelName is the model id of /v1/models; requests must name it.
	ModelName string `yaml:"model_name"`
	// Keys map API keys to namespaces; KeysEnv names an environment variable
	// with more ("key=namespace,key2=namespace2"; namespace * is an admin).
	// With no key at all the server is open and uses memory.namespace.
	Keys    []APIKey `yaml:"keys"`
	KeysEnv string   `yaml:"keys_env"`
	// MaxBatch sequences decode in the same step (continuous batching); 1
	// decodes one at a time.
	MaxBatch int `yaml:"max_batch"`
	// MaxConcurrent agent loops run at once; MaxQueue more wait; beyond
	// that a request gets 429.
	MaxConcurrent int `yaml:"max_concurrent"`
	MaxQueue      int `yaml:"max_queue"`
	// One key runs at most MaxConcurrentPerKey agent loops and queues
	// MaxQueuePerKey more (429 beyond), so no tenant starves the others.
	MaxConcurrentPerKey int `yaml:"max_concurrent_per_key"`
	MaxQueuePerKey      int `yaml:"max_queue_per_key"`
	// RateLimit is each key's API requests per second (0: no limit), with
	// bursts of RateBurst; beyond it 429 with Retry-After.
	RateLimit float64 `yaml:"rate_limit"`
	RateBurst int     `yaml:"rate_burst"`
	// Request limits: body bytes, messages, prompt tokens of one policy call
	// (0: agent.context_budget), max_tokens a request may ask for (0:
	// agent.response_budget).
	MaxBodyBytes    int64 `yaml:"max_body_bytes"`
	MaxMessages     int   `yaml:"max_messages"`
	MaxPromptTokens int   `yaml:"max_prompt_tokens"`
	MaxTokens       int   `yaml:"max_tokens"`
	// Temperature and TopP when a request gives none.
	Temperature float64 `yaml:"temperature"`
	TopP        float64 `yaml:"top_p"`
	// RequestTimeout bounds one request; ShutdownTimeout bounds the wait for
	// requests in flight on SIGINT/SIGTERM.
	RequestTimeout  time.Duration `yaml:"request_timeout"`
	ShutdownTimeout time.Duration `yaml:"shutdown_timeout"`
	// A client must send its request's headers within ReadHeaderTimeout and
	// the whole request within ReadTimeout; a kept-alive connection idle
	// for IdleTimeout is closed. Writing a response may take
	// request_timeout plus a minute.
	ReadHeaderTimeout time.Duration `yaml:"read_header_timeout"`
	ReadTimeout       time.Duration `yaml:"read_timeout"`
	IdleTimeout       time.Duration `yaml:"idle_timeout"`
	// MaxHeaderBytes bounds a request's headers (431 beyond).
	MaxHeaderBytes int `yaml:"max_header_bytes"`
	// MaxConnections are open at once, MaxConnectionsPerClient from one
	// client address; a connection beyond either gets 503 and is closed.
	MaxConnections          int `yaml:"max_connections"`
	MaxConnectionsPerClient int `yaml:"max_connections_per_client"`
	// TrustedProxies are the load balancers' addresses (CIDRs or single
	// addresses) whose word on who the client is the server takes: a PROXY
	// protocol header (v1 or v2) opening a connection, else each request's
	// X-Forwarded-For. A trusted proxy's connections are capped only by
	// max_connections; each client it names is held to
	// max_connections_per_client (connections, or requests in flight
	// through an HTTP proxy). Health and readiness checks are never held
	// back by the per-client cap. Empty: every peer is a client.
	TrustedProxies []string `yaml:"trusted_proxies"`
	// Sessions keep short-term contexts for SessionTTL after their last
	// request, at most MaxSessions (least recently used go first).
	SessionTTL  time.Duration `yaml:"session_ttl"`
	MaxSessions int           `yaml:"max_sessions"`
	// MaxSessionsPerNamespace bounds one tenant's sessions: at it, the
	// tenant's own least recently used session goes (and at max_sessions,
	// one of the tenant holding the most).
	MaxSessionsPerNamespace int `yaml:"max_sessions_per_namespace"`
	// PrefixCache is how many positions of finished requests' key/value
	// caches the native backend keeps, so that a conversation's next turn
	// (which resends everything before it) prefills only what is new; 0
	// keeps only the system prompt's.
	PrefixCache int `yaml:"prefix_cache"`
	// KVBudget, when positive, is the key/value positions the native
	// backend holds for the requests decoding at once, in one paged pool
	// allocated at start: requests join as blocks free up, the last to
	// join gives its blocks back (and is recomputed later) when the
	// running ones need more, and a request whose prompt plus max_tokens
	// exceed it is refused (400). 0: each sequence's cache grows as it
	// needs, bounded only by max_batch.
	KVBudget int `yaml:"kv_budget"`
	// ToolGateway serves MemTool's tool gateway at /mcp/tools: the tools
	// of the config's mcp.servers behind SYS_SEARCH_TOOLS and
	// SYS_REMOVE_TOOLS, a working set per namespace (memtool.limit, top_k).
	ToolGateway bool `yaml:"tool_gateway"`
	// LogFormat is json or text (structured logs on stderr).
	LogFormat string `yaml:"log_format"`
	// Console is the web console at /ui.
	Console console.Config `yaml:"console"`
}

// APIKey maps a key to the namespace it reads and writes; an admin key
// may name any namespace.
type APIKey struct {
	Key       string `yaml:"key"`
	Namespace string `yaml:"namespace"`
	Admin     bool   `yaml:"admin"`
}

// DefaultConfig listens on loopback and serves runs/tiny/rl/policy.
func DefaultConfig() Config {
	return Config{Addr: "127.0.0.1:8080", Backend: "native", Policy: "runs/tiny/rl/policy", ModelName: "agemem", KeysEnv: "AGEMEM_API_KEYS",
		MaxBatch: 16, MaxConcurrent: 64, MaxQueue: 256, MaxConcurrentPerKey: 16, MaxQueuePerKey: 64, RateBurst: 20, MaxBodyBytes: 1 << 20, MaxMessages: 256,
		Temperature: 1, TopP: 1, RequestTimeout: 5 * time.Minute, ShutdownTimeout: 30 * time.Second,
		ReadHeaderTimeout: 10 * time.Second, ReadTimeout: time.Minute, IdleTimeout: 2 * time.Minute, MaxHeaderBytes: 64 << 10,
		MaxConnections: 4096, MaxConnectionsPerClient: 256, TrustedProxies: []string{},
		SessionTTL: time.Hour, MaxSessions: 10000, MaxSessionsPerNamespace: 1000, PrefixCache: 1 << 16, LogFormat: "json", Console: console.DefaultConfig()}
}

// Validate checks every key.
func (sv Config) Validate() error {
	var e valid.Errors
	if sv.Addr == "" {
		e.Add("addr", "must not be empty (host:port)")
	}
	e.OneOf("backend", sv.Backend, "native", "ollama")
	if sv.Backend == "ollama" && sv.Policy == "" {
		e.Add("policy", "must name the Ollama model when serve.backend is ollama")
	}
	if sv.Backend == "ollama" && sv.Adapter != "" {
		e.Add("adapter", "applies to the native backend; export a merged model to Ollama instead")
	}
	if sv.ModelName == "" {
		e.Add("model_name", "must not be empty")
	}
	seen := map[string]bool{}
	for i, k := range sv.Keys {
		key := fmt.Sprintf("keys[%d]", i)
		if len(k.Key) < 8 {
			e.Add(key+".key", "must be at least 8 characters")
		}
		if seen[k.Key] {
			e.Add(key+".key", "repeats an earlier key")
		}
		seen[k.Key] = true
		if k.Namespace == "" && !k.Admin {
			e.Add(key+".namespace", "must name the key's namespace (or set admin: true)")
		}
	}
	e.AtLeast("max_batch", sv.MaxBatch, 1)
	e.AtLeast("max_concurrent", sv.MaxConcurrent, 1)
	e.AtLeast("max_queue", sv.MaxQueue, 0)
	e.AtLeast("max_concurrent_per_key", sv.MaxConcurrentPerKey, 1)
	e.AtLeast("max_queue_per_key", sv.MaxQueuePerKey, 0)
	e.NotNegative("rate_limit", sv.RateLimit)
	e.AtLeast("rate_burst", sv.RateBurst, 1)
	if sv.MaxBodyBytes < 1024 {
		e.Add("max_body_bytes", "%d is below the minimum 1024", sv.MaxBodyBytes)
	}
	e.AtLeast("max_messages", sv.MaxMessages, 1)
	e.AtLeast("max_prompt_tokens", sv.MaxPromptTokens, 0)
	e.AtLeast("max_tokens", sv.MaxTokens, 0)
	e.NotNegative("temperature", sv.Temperature)
	if sv.TopP <= 0 || sv.TopP > 1 {
		e.Add("top_p", "%g is outside (0, 1]", sv.TopP)
	}
	for _, d := range []struct {
		key string
		d   time.Duration
	}{{"request_timeout", sv.RequestTimeout}, {"shutdown_timeout", sv.ShutdownTimeout}, {"session_ttl", sv.SessionTTL},
		{"read_header_timeout", sv.ReadHeaderTimeout}, {"read_timeout", sv.ReadTimeout}, {"idle_timeout", sv.IdleTimeout}} {
		if d.d <= 0 {
			e.Add(d.key, "%s must be positive (a duration such as 30s or 5m)", d.d)
		}
	}
	e.AtLeast("max_header_bytes", sv.MaxHeaderBytes, 1024)
	e.AtLeast("max_connections", sv.MaxConnections, 1)
	e.AtLeast("max_connections_per_client", sv.MaxConnectionsPerClient, 1)
	if _, err := parseProxies(sv.TrustedProxies); err != nil {
		e.Add("trusted_proxies", "%s", strings.TrimPrefix(err.Error(), "serve.trusted_proxies"))
	}
	e.AtLeast("max_sessions", sv.MaxSessions, 1)
	e.AtLeast("max_sessions_per_namespace", sv.MaxSessionsPerNamespace, 1)
	e.AtLeast("prefix_cache", sv.PrefixCache, 0)
	e.AtLeast("kv_budget", sv.KVBudget, 0)
	e.OneOf("log_format", sv.LogFormat, "json", "text")
	e.Section("console", sv.Console.Validate())
	return e.Err()
}
