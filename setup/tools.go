package setup

import (
	"context"
	"fmt"
	"io"

	"github.com/agemem/agemem/bench/nestful"
	"github.com/agemem/agemem/bench/workbench"
	"github.com/agemem/agemem/memtools/ltm"
	"github.com/agemem/agemem/papers/fittext"
	"github.com/agemem/agemem/papers/memtoolagent"
)

// WorkBench plays the queries of the workbench section with an agent:
// react, the function-calling loop with MemToolAgent's memory (the
// memtoolagent section), or dfsdt, FitText's tree search (fittext), on the
// model m names (on model.device).
func WorkBench(ctx context.Context, cfg Config, agentKind string, m Models, log io.Writer) ([]workbench.Result, error) {
	d, tasks, err := cfg.WorkBench.Load()
	if err != nil {
		return nil, err
	}
	par := cfg.WorkBench.Parallel
	switch agentKind {
	case "dfsdt":
		// The agent's and the strategies' calls decode together.
		model, err := ChatModel(ctx, cfg, m, cfg.Model.Device, max(par, 2), log)
		if err != nil {
			return nil, err
		}
		emb, err := Embedder(ctx, cfg)
		if err != nil {
			return nil, err
		}
		return fittext.WorkBenchRuns(ctx, cfg.FitText, model, emb, uint64(cfg.Seed), d, tasks, par, log)
	case "react":
		cast, err := toolMemoryCast(ctx, cfg, m, par, log)
		if err != nil {
			return nil, err
		}
		return memtoolagent.WorkBenchRuns(ctx, cfg.MemToolAgent, cast, d, tasks, par, log)
	}
	return nil, fmt.Errorf("agent %q: want react or dfsdt", agentKind)
}

// Nestful plays the test set of the nestful section with MemToolAgent's
// memory (the memtoolagent section) on the model m names.
func Nestful(ctx context.Context, cfg Config, m Models, log io.Writer) ([]nestful.Result, error) {
	samples, ex, err := cfg.Nestful.Load()
	if err != nil {
		return nil, err
	}
	test, rest := cfg.Nestful.Split(samples)
	memory, err := cfg.MemToolAgent.NestfulMemory(test, rest)
	if err != nil {
		return nil, fmt.Errorf("nestful.data %s: %w", cfg.Nestful.Data, err)
	}
	cast, err := toolMemoryCast(ctx, cfg, m, cfg.Nestful.Parallel, log)
	if err != nil {
		return nil, err
	}
	return memtoolagent.NestfulRuns(ctx, cfg.MemToolAgent, cast, test, memory, ex, cfg.Nestful.Parallel, log)
}

// toolMemoryCast is MemToolAgent's cast: the acting model, the memory
// extractor (memtoolagent.extractor_model, else the agent's own), the
// embedder of the memory's queries (embed.backend's, else feature
// hashing) and its store: in memory, or memtoolagent.memory_db's
// namespace memory.namespace, which must be empty.
func toolMemoryCast(ctx context.Context, cfg Config, m Models, parallel int, log io.Writer) (memtoolagent.Cast, error) {
	var cast memtoolagent.Cast
	var err error
	if cast.Model, err = ChatModel(ctx, cfg, m, cfg.Model.Device, parallel, log); err != nil {
		return cast, err
	}
	cast.Extractor = cast.Model
	if name := cfg.MemToolAgent.ExtractorModel; name != "" {
		if cast.Extractor, err = ChatModel(ctx, cfg, Models{Model: name}, cfg.Model.Device, 1, log); err != nil {
			return cast, err
		}
	}
	h, err := NewHelpers(ctx, cfg)
	if err != nil {
		return cast, err
	}
	cast.Embedder = cfg.Embed.Hashing()
	if h.Embedder != nil {
		cast.Embedder = h.Embedder
	}
	cast.NewStore = func() (ltm.Store, func(), error) {
		path := cfg.MemToolAgent.MemoryDB
		if path == "" {
			return ltm.NewMemStore(uint64(cfg.Seed)), func() {}, nil
		}
		db, err := ltm.OpenSQLite(path, StoreOptions(cfg))
		if err != nil {
			return nil, nil, err
		}
		st, err := db.Namespace(cfg.Memory.Namespace)
		if err != nil {
			db.Close()
			return nil, nil, err
		}
		if n, _ := st.Count(ctx); n > 0 {
			db.Close()
			return nil, nil, fmt.Errorf("memtoolagent.memory_db %s: namespace %q already holds %d entries; a benchmark builds its memory from nothing (set memory.namespace)", path, cfg.Memory.Namespace, n)
		}
		return st, func() { db.Close() }, nil
	}
	return cast, nil
}
