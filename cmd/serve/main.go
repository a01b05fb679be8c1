// Command serve puts a trained AgeMem policy in front of users: an
// OpenAI-compatible HTTP API that runs the memory agent loop against each
// user's persistent long-term memory, a memory API, an MCP endpoint, and
// `serve memory` to administer the store from the shell.
package main

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"syscall"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/spf13/cobra"

	"github.com/agemem/agemem/agent"
	"github.com/agemem/agemem/embed"
	"github.com/agemem/agemem/kernels/device"
	"github.com/agemem/agemem/llm/native"
	"github.com/agemem/agemem/papers/memtool"
	"github.com/agemem/agemem/serve"
	"github.com/agemem/agemem/setup"
)

type globals struct {
	setup.Flags
	namespace string
}

func (g *globals) load() (setup.Config, error) {
	cfg, err := g.Load()
	if err != nil {
		return cfg, err
	}
	if g.namespace != "" {
		cfg.Memory.Namespace = g.namespace
	}
	return cfg, nil
}

func main() {
	if err := newRoot().Execute(); err != nil {
		fmt.Fprintln(os.Stderr, "serve:", err)
		os.Exit(1)
	}
}

func newRoot() *cobra.Command {
	g := &globals{}
	var addr, backend, pol, adapter string
	var maxBatch int
	root := &cobra.Command{
		Use:   "serve",
		Short: "Serve an AgeMem policy with persistent per-user memory",
		Long: `Starts the HTTP server (config section serve): POST /v1/chat/completions
(OpenAI-compatible, streaming with server-sent events), GET /v1/models, the
memory API under /v1/memories, MCP at /mcp, /healthz, /readyz, /metrics.
SIGINT or SIGTERM finishes the requests in flight and stops.`,
		Example: `  serve --config configs/tiny.yaml
  AGEMEM_API_KEYS="sk-alice-0001=alice,sk-admin-0001=*" serve --config configs/tiny.yaml --addr :8080`,
		Args:          cobra.NoArgs,
		SilenceUsage:  true,
		SilenceErrors: true,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg, err := g.load()
			if err != nil {
				return err
			}
			f := cmd.Flags()
			if f.Changed("addr") {
				cfg.Serve.Addr = addr
			}
			if f.Changed("backend") {
				cfg.Serve.Backend = backend
			}
			if f.Changed("policy") {
				cfg.Serve.Policy = pol
			}
			if f.Changed("adapter") {
				cfg.Serve.Adapter = adapter
			}
			if f.Changed("max-batch") {
				cfg.Serve.MaxBatch = maxBatch
			}
			if err := cfg.Validate(); err != nil {
				return err
			}
			ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			return run(ctx, cfg, nil)
		},
	}
	g.Register(root.PersistentFlags())
	root.Flags().StringVar(&addr, "addr", "", "listen address (serve.addr)")
	root.Flags().StringVar(&backend, "backend", "", "native | ollama (serve.backend)")
	root.Flags().StringVar(&pol, "policy", "", "policy directory, or the Ollama model with --backend ollama (serve.policy)")
	root.Flags().StringVar(&adapter, "adapter", "", "LoRA adapter directory on top of the policy (serve.adapter)")
	root.Flags().IntVar(&maxBatch, "max-batch", 0, "sequences per decoding step; 1 turns batching off (serve.max_batch)")
	root.AddCommand(memoryCmd(g), mcpCmd(g), loadtestCmd(), docsCmd())
	return root
}

func logger(cfg setup.Config) *slog.Logger {
	if cfg.Serve.LogFormat == "text" {
		return slog.New(slog.NewTextHandler(os.Stderr, nil))
	}
	return slog.New(slog.NewJSONHandler(os.Stderr, nil))
}

// run serves until ctx ends. be, if not nil, replaces the configured policy
// (tests serve a scripted one).
func run(ctx context.Context, cfg setup.Config, be serve.Backend) error {
	log := logger(cfg)
	db, err := setup.OpenStore(ctx, cfg)
	if err != nil {
		return err
	}
	defer db.Close()
	helpers, err := setup.NewHelpers(ctx, cfg)
	if err != nil {
		return err
	}
	enc := helpers.Embedder
	if enc == nil {
		enc = cfg.Embed.Hashing()
	}
	o := serve.Options{Config: cfg.Serve, Agent: cfg.Agent, Tools: cfg.Tools, Namespace: cfg.Memory.Namespace, Backend: be, Store: db, Embedder: enc, Summarizer: helpers.Summarizer, Logger: log}
	switch {
	case be != nil:
	case cfg.Serve.Backend == "ollama":
		if o.Backend, err = ollamaBackend(ctx, cfg); err != nil {
			return err
		}
	default:
		dev, err := device.Open(cfg.Model.Device, os.Stderr)
		if err != nil {
			return err
		}
		o.Native, err = native.Open(dev, cfg.Serve.Policy, cfg.Serve.Adapter, cfg.Model.Generation())
		if err != nil {
			return fmt.Errorf("serve.policy %s: %w", cfg.Serve.Policy, err)
		}
	}
	if cfg.Serve.ToolGateway {
		gw, closeAll, err := toolGateway(ctx, cfg, enc)
		if err != nil {
			return err
		}
		defer closeAll()
		o.ToolGateway = gw
		log.Info("tool gateway at /mcp/tools", "servers", len(cfg.MCP.Servers), "tools", gw.Len(), "limit", cfg.MemTool.Limit)
	}
	s, err := serve.New(o)
	if err != nil {
		return err
	}
	return listenAndServe(ctx, cfg, s, log)
}

// toolGateway connects to every server of mcp.servers and indexes their
// tools for the gateway; closeAll ends the connections.
func toolGateway(ctx context.Context, cfg setup.Config, enc embed.Embedder) (*memtool.Gateway, func(), error) {
	if len(cfg.MCP.Servers) == 0 {
		return nil, nil, fmt.Errorf("serve.tool_gateway: mcp.servers names no MCP server to put behind the gateway")
	}
	tools, closeAll, err := agent.ConnectAll(ctx, cfg.MCP.Servers)
	if err != nil {
		return nil, nil, fmt.Errorf("serve.tool_gateway: %w", err)
	}
	gw, err := memtool.NewGateway(ctx, enc, tools, cfg.MemTool)
	if err != nil {
		closeAll()
		return nil, nil, err
	}
	return gw, closeAll, nil
}

// ollamaBackend drives serve.policy on the Ollama server in ollama.format;
// raw prompts use the chat family the model was published with (else its
// architecture's), and num_ctx stays within its context length.
func ollamaBackend(ctx context.Context, cfg setup.Config) (serve.Backend, error) {
	pol, m, err := setup.OllamaPolicy(ctx, cfg, cfg.Serve.Policy)
	if err != nil {
		return nil, fmt.Errorf("serve.policy: %w", err)
	}
	return serve.Remote{Model: pol, Context: m.NumCtx}, nil
}

// embedder is the configured enc(.): the server, the MCP server and the
// memory CLI must embed alike, or retrieval compares unlike vectors.
func embedder(ctx context.Context, cfg setup.Config) (embed.Embedder, error) {
	return setup.Embedder(ctx, cfg)
}

func listenAndServe(ctx context.Context, cfg setup.Config, s *serve.Server, log *slog.Logger) error {
	ln, err := net.Listen("tcp", cfg.Serve.Addr)
	if err != nil {
		s.Close()
		return fmt.Errorf("serve.addr: %w", err)
	}
	log.Info("listening", "addr", ln.Addr().String(), "store", cfg.Memory.Path)
	return s.Serve(ctx, ln)
}

func mcpCmd(g *globals) *cobra.Command {
	var stdio bool
	cmd := &cobra.Command{
		Use:   "mcp",
		Short: "Serve the long-term memory tools over MCP on stdin/stdout",
		Long: `Runs an MCP server (the official Go SDK) on stdin/stdout exposing
Add_memory, Update_memory, Delete_memory and Retrieve_memory on one
namespace (--namespace, default memory.namespace) of the store at
memory.path (or memory.dsn with memory.store postgres). Over HTTP the
same tools are at /mcp of the running server.`,
		Example: `  serve mcp --stdio --namespace alice --config configs/tiny.yaml`,
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if !stdio {
				return fmt.Errorf("only --stdio is served here; the HTTP transport is /mcp of the running server")
			}
			cfg, err := g.load()
			if err != nil {
				return err
			}
			db, err := setup.OpenStore(cmd.Context(), cfg)
			if err != nil {
				return err
			}
			defer db.Close()
			enc, err := embedder(cmd.Context(), cfg)
			if err != nil {
				return err
			}
			ns := cfg.Memory.Namespace
			srv := serve.NewMCPServer(serve.MemoryTools{Store: db, Embedder: enc,
				Options:   cfg.Tools,
				Namespace: func(context.Context, *mcp.CallToolRequest) string { return ns }}, "1")
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			return srv.Run(ctx, stdioGuard(os.Stdin, os.Stdout))
		},
	}
	cmd.Flags().BoolVar(&stdio, "stdio", false, "serve on stdin/stdout")
	cmd.PersistentFlags().StringVar(&g.namespace, "namespace", "", "the namespace the tools act on")
	return cmd
}
