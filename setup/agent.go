package setup

import (
	"context"

	"github.com/agemem/agemem/agent"
	"github.com/agemem/agemem/memtools"
	"github.com/agemem/agemem/memtools/stm"
)

// AgentToolset is the tool set of agemem-train agent: with memory,
// AgeMem's long-term memory tools on the SQLite store at memory.path
// (namespace memory.namespace, the store serve uses); then the tools of
// every MCP server. close closes the store and the servers' connections.
func AgentToolset(ctx context.Context, cfg Config, memory bool, servers []agent.MCPServer) (ts *agent.Toolset, close func(), err error) {
	var closers []func() error
	close = func() {
		for i := len(closers) - 1; i >= 0; i-- {
			closers[i]()
		}
	}
	defer func() {
		if err != nil {
			close()
		}
	}()
	if ts, err = agent.NewToolset(); err != nil {
		return nil, close, err
	}
	if memory {
		db, err := OpenStore(ctx, cfg)
		if err != nil {
			return nil, close, err
		}
		closers = append(closers, db.Close)
		st, err := db.Namespace(cfg.Memory.Namespace)
		if err != nil {
			return nil, close, err
		}
		h, err := NewHelpers(ctx, cfg)
		if err != nil {
			return nil, close, err
		}
		rt := h.Apply(&memtools.Runtime{Store: st, Context: stm.New(nil), Embedder: cfg.Embed.Hashing(), Options: cfg.Tools})
		for _, t := range agent.MemoryTools(rt) {
			if err := ts.Add(t); err != nil {
				return nil, close, err
			}
		}
	}
	for _, s := range servers {
		c, err := agent.ConnectMCP(ctx, s)
		if err != nil {
			return nil, close, err
		}
		closers = append(closers, c.Close)
		if err := ts.AddMCP(ctx, c); err != nil {
			return nil, close, err
		}
	}
	return ts, close, nil
}
