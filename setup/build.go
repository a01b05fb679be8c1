// Package roles builds, from the config, what every command runs with:
// the models that play the runtime's supporting roles (the embedder enc(.)
// — feature hashing, a BERT-family encoder or an Ollama model — the
// summariser and the judges), the runtime of an episode, AgeMem's
// environment and its reward. Training, evaluation, episodes and serve
// all wire them here, so what is evaluated is what was trained.
package setup

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sync"

	"github.com/agemem/agemem/agent"
	"github.com/agemem/agemem/bench/stabletoolbench"
	"github.com/agemem/agemem/console"
	"github.com/agemem/agemem/embed"
	"github.com/agemem/agemem/env"
	"github.com/agemem/agemem/env/pretrain"
	"github.com/agemem/agemem/kernels"
	"github.com/agemem/agemem/kernels/cpu"
	"github.com/agemem/agemem/kernels/device"
	"github.com/agemem/agemem/llm"
	"github.com/agemem/agemem/llm/native"
	"github.com/agemem/agemem/llm/ollama"
	"github.com/agemem/agemem/llm/openai"
	"github.com/agemem/agemem/memtools"
	"github.com/agemem/agemem/memtools/ltm"
	"github.com/agemem/agemem/memtools/stm"
	"github.com/agemem/agemem/model/bert"
	"github.com/agemem/agemem/model/qwen"
	"github.com/agemem/agemem/model/sft"
	"github.com/agemem/agemem/model/tokenizer"
	"github.com/agemem/agemem/model/train"
	"github.com/agemem/agemem/papers/memtool"
	"github.com/agemem/agemem/rl"
	"github.com/agemem/agemem/rl/reward"
	"github.com/agemem/agemem/rl/rollout"
)

// Embedder is embed.backend: hashing, encoder (embed.path), ollama or
// openai (embed.model on that server). An encoder or Ollama model is loaded (and probed) here,
// so a missing model fails at start-up.
func Embedder(ctx context.Context, cfg Config) (embed.Embedder, error) {
	e := cfg.Embed
	switch e.Backend {
	case "encoder":
		be, err := device.Open(e.Device, os.Stderr)
		if err != nil {
			return nil, fmt.Errorf("embed.device: %w", err)
		}
		enc, err := bert.LoadEncoder(e.Path, e.Pooling, e.BatchTokens, be)
		if err != nil {
			return nil, fmt.Errorf("embed.path: %w", err)
		}
		return enc, nil
	case "ollama":
		c, err := cfg.Ollama.Connect()
		if err != nil {
			return nil, err
		}
		oe, err := ollama.NewEmbedder(ctx, c, e.Model, cfg.Ollama.KeepAlive)
		if err != nil {
			return nil, fmt.Errorf("embed.model: %w", err)
		}
		return oe, nil
	case "openai":
		c, err := cfg.OpenAI.Connect()
		if err != nil {
			return nil, err
		}
		oe, err := openai.NewEmbedder(ctx, c, e.Model)
		if err != nil {
			return nil, fmt.Errorf("embed.model: %w", err)
		}
		return oe, nil
	}
	return embed.NewHashing(e.Dim, e.CharNgrams), nil
}

// OpenStore opens the durable long-term store memory.store names: the
// SQLite file memory.path, or the PostgreSQL database memory.dsn (the
// password from PGPASSWORD or ~/.pgpass). memory.store "memory" keeps
// nothing between runs, so a command that needs a store refuses it.
func OpenStore(ctx context.Context, cfg Config) (ltm.DB, error) { return openStore(ctx, cfg, false) }

// OpenServingStore is OpenStore for a server: a PostgreSQL database that
// cannot be reached yet is not an error (ltm.PostgresOptions.Lazy), so a
// replica started during an outage comes up not ready and serves once the
// database answers.
func OpenServingStore(ctx context.Context, cfg Config) (ltm.DB, error) {
	return openStore(ctx, cfg, true)
}

func openStore(ctx context.Context, cfg Config, lazy bool) (ltm.DB, error) {
	m := cfg.Memory
	switch m.Store {
	case "sqlite":
		return ltm.OpenSQLite(m.Path, StoreOptions(cfg))
	case "postgres":
		return ltm.OpenPostgres(ctx, ltm.PostgresOptions{DSN: m.DSN, MaxConns: m.MaxConns, HNSW: m.HNSW, Metadata: m.Limits(), Lazy: lazy})
	}
	return nil, fmt.Errorf("memory.store is %q, which keeps nothing between runs: this command needs sqlite or postgres", m.Store)
}

// StoreOptions are the SQLite memory store's options: memory.sync, the
// metadata limits, and embed.device for the top-k of large namespaces
// (IndexDevice).
func StoreOptions(cfg Config) ltm.SQLiteOptions {
	return ltm.SQLiteOptions{SyncFull: cfg.Memory.Sync == "full", Device: IndexDevice(cfg), Metadata: cfg.Memory.Limits()}
}

// IndexDevice is embed.device for the top-k of large indexes (memory
// namespaces, tool knowledge bases), opened when the first one needs it;
// nil when it is the CPU (whose own scan beats a CPU top-k kernel).
func IndexDevice(cfg Config) func() kernels.TopKer {
	var (
		once sync.Once
		be   kernels.TopKer
	)
	return func() kernels.TopKer {
		once.Do(func() {
			d, err := device.Open(cfg.Embed.Device, os.Stderr)
			if err != nil {
				fmt.Fprintf(os.Stderr, "embed.device: %v; top-k stays on the CPU\n", err)
				return
			}
			if t, ok := d.(kernels.TopKer); ok && d.Name() != "cpu" {
				be = t
			}
		})
		return be
	}
}

// Helpers are the runtime's embedder and summariser when the config asks
// for more than the built-in ones (hashing, extractive); a nil field keeps
// the built-in one.
type Helpers struct {
	Embedder   embed.Embedder
	Summarizer memtools.Summarizer
}

// NewHelpers loads the configured helpers once, for every runtime of a run.
func NewHelpers(ctx context.Context, cfg Config) (Helpers, error) {
	var h Helpers
	if cfg.Embed.Backend != "hashing" {
		var err error
		if h.Embedder, err = Embedder(ctx, cfg); err != nil {
			return h, err
		}
	}
	if cfg.Tools.Summarizer == "ollama" {
		c, err := cfg.Ollama.Connect()
		if err != nil {
			return h, err
		}
		if err := c.HasModel(ctx, cfg.Tools.SummarizerModel); err != nil {
			return h, fmt.Errorf("tools.summarizer_model: %w", err)
		}
		m := cfg.Ollama.ChatModel(c, cfg.Tools.SummarizerModel, false, cfg.Agent.ContextBudget, cfg.Agent.ResponseBudget)
		m.Sampling.Temperature = 0
		h.Summarizer = memtools.ModelSummarizer{Model: m}
	}
	if cfg.Tools.Summarizer == "openai" {
		c, err := cfg.OpenAI.Connect()
		if err != nil {
			return h, err
		}
		m := cfg.OpenAI.ChatModel(c, cfg.Tools.SummarizerModel, cfg.Agent.ResponseBudget)
		m.Sampling.Temperature = 0
		h.Summarizer = memtools.ModelSummarizer{Model: m}
	}
	return h, nil
}

// Apply puts the helpers into a runtime built with the built-in ones.
func (h Helpers) Apply(rt *memtools.Runtime) *memtools.Runtime {
	if h.Embedder != nil {
		rt.Embedder = h.Embedder
	}
	if h.Summarizer != nil {
		rt.Summarizer = h.Summarizer
	}
	return rt
}

// Runtime returns the factory of fresh runtimes for episodes: an
// in-memory long-term store (its ids drawn from the seed: a rollout's M),
// an empty context counted with tok (the model's tokenizer; nil counts
// words), the configured embedder and summariser.
func Runtime(cfg Config, h Helpers, tok stm.Tokenizer) func(seed uint64) *memtools.Runtime {
	if tok == nil {
		tok = stm.Words{}
	}
	return func(seed uint64) *memtools.Runtime {
		return h.Apply(&memtools.Runtime{
			Store:      ltm.NewMemStore(seed),
			Context:    stm.New(tok),
			Embedder:   cfg.Embed.Hashing(),
			Summarizer: memtools.Extractive{MaxTokens: cfg.Tools.SummaryMaxTokens, Tokenizer: tok},
			Options:    cfg.Tools,
		})
	}
}

// AgeMem is the paper's environment over tasks as training and evaluation
// both play it: the episode and agent sections, runtimes from Runtime.
func AgeMem(cfg Config, h Helpers, tasks []env.Task, tok stm.Tokenizer) *env.AgeMem {
	return &env.AgeMem{Tasks: tasks, Episode: cfg.EpisodeConfig(), NewRuntime: Runtime(cfg, h, tok)}
}

// Reward is the reward section with its judges, built the same way for
// training and evaluation: HotpotQA F1 or EM, token-F1 storage and cosine
// relevance with the configured embedder by default; judges set to ollama
// ask reward.judge_model on the server; judges set to policy ask the
// starting policy (rl.init), loaded here on the CPU and frozen, so a judge
// never drifts with what it judges.
func Reward(ctx context.Context, cfg Config, h Helpers) (reward.Composite, error) {
	r := cfg.Reward
	emb := h.Embedder
	if emb == nil {
		emb = cfg.Embed.Hashing()
	}
	j := reward.Judges{Task: reward.F1Judge{}, Storage: reward.F1Storage{Threshold: r.StorageF1Threshold},
		Relevance: reward.CosineRelevance{Embedder: emb}}
	if r.Judge == "em" {
		j.Task = reward.EMJudge{}
	}
	set := func(p llm.Model, name string) {
		if r.Judge == name {
			j.Task = reward.LLMJudge{Policy: p}
		}
		if r.StorageJudge == name {
			j.Storage = reward.LLMStorage{Policy: p}
		}
		if r.RelevanceJudge == name {
			j.Relevance = reward.LLMRelevance{Policy: p}
		}
	}
	if r.Uses("policy") {
		pol, err := native.Load(cpu.New(), cfg.RL.Init, "", native.Options{Sampling: llm.Sampling{MaxTokens: 16}}, qwen.Options{})
		if err != nil {
			return reward.Composite{}, fmt.Errorf("reward: a judge is policy: rl.init: %w", err)
		}
		set(pol, "policy")
	}
	if r.Uses("ollama") {
		c, err := cfg.Ollama.Connect()
		if err != nil {
			return reward.Composite{}, err
		}
		if err := c.HasModel(ctx, r.JudgeModel); err != nil {
			return reward.Composite{}, fmt.Errorf("reward.judge_model: %w", err)
		}
		m := cfg.Ollama.ChatModel(c, r.JudgeModel, false, cfg.Agent.ContextBudget, cfg.Agent.ResponseBudget)
		m.Sampling.Temperature, m.Sampling.MaxTokens = 0, 64
		set(m, "ollama")
	}
	if r.Uses("openai") {
		c, err := cfg.OpenAI.Connect()
		if err != nil {
			return reward.Composite{}, err
		}
		m := cfg.OpenAI.ChatModel(c, r.JudgeModel, 64)
		m.Sampling.Temperature = 0
		set(m, "openai")
	}
	return reward.Composite{Weights: r.Weights, Judges: j}, nil
}

// GRPO is everything rl.Train needs to train rl.init in the AgeMem
// environment over data.train with the reward section's reward, built as
// evaluation builds them; the caller adds YAML, Resume, Log and TTY.
func GRPO(ctx context.Context, cfg Config, log io.Writer) (rl.Options[env.Outcome], error) {
	var o rl.Options[env.Outcome]
	tasks, err := env.LoadScored(cfg.Data.Train)
	if err != nil {
		return o, fmt.Errorf("data.train: %w", err)
	}
	tok, err := tokenizer.Load(filepath.Join(cfg.RL.Init, "tokenizer.json"))
	if err != nil {
		return o, err
	}
	h, err := NewHelpers(ctx, cfg)
	if err != nil {
		return o, err
	}
	rew, err := Reward(ctx, cfg, h)
	if err != nil {
		return o, err
	}
	return grpoOptions[env.Outcome](cfg, AgeMem(cfg, h, tasks, tok), transcribed{rew}, log)
}

// transcribed is the composite reward with each rollout's trajectory (its
// three stages of turns: the user's messages, the policy's replies, the
// tool calls and their results, clipped) added to its line of
// rollouts.jsonl, for the console's rollout browser: a group's K
// trajectories side by side show why one rollout beat its siblings.
type transcribed struct{ reward.Composite }

func (t transcribed) Score(ctx context.Context, o env.Outcome) (rollout.Score, error) {
	sc, err := t.Composite.Score(ctx, o)
	if err == nil {
		sc.Info["trajectory"] = console.EpisodeOf(o.Result)
	}
	return sc, err
}

// grpoOptions are GRPO's options from the config for an environment and
// its reward, rollouts decoding on model.device.
func grpoOptions[R any](cfg Config, e rollout.Env[R], rew rl.Reward[R], log io.Writer) (rl.Options[R], error) {
	be, err := device.Open(cfg.Model.Device, log)
	if err != nil {
		return rl.Options[R]{}, err
	}
	return rl.Options[R]{Config: cfg.RL, LoRA: cfg.LoRA, Optim: cfg.Optim,
		Learner: learnerOptions(cfg), Device: be, Dtype: cfg.Model.SaveDtype(),
		Seed: uint64(cfg.Seed), ResponseBudget: cfg.Agent.ResponseBudget,
		Env: e, Reward: rew, YAML: cfg.YAML(), Log: log}, nil
}

// SFT is sft.Run's options from the config (the caller adds Resume, Log,
// TTY and GenEval).
func SFT(cfg Config) sft.Options {
	return sft.Options{Config: cfg.SFT, Model: cfg.Model.Path, LoRA: cfg.LoRA, Optim: cfg.Optim,
		Learner: learnerOptions(cfg), Dtype: cfg.Model.SaveDtype(), Seed: uint64(cfg.Seed),
		ResponseBudget: cfg.Agent.ResponseBudget, Copies: pretrain.CopySource(cfg.Pretrain), YAML: cfg.YAML(), WellFormed: memtools.WellFormed}
}

// Pretrain is pretrain.Run's options from the config (the caller adds
// Resume, Log and TTY).
func Pretrain(cfg Config) pretrain.Options {
	return pretrain.Options{Config: cfg.Pretrain, Optim: cfg.Optim, Learner: learnerOptions(cfg),
		Dtype: cfg.Model.SaveDtype(), Seed: uint64(cfg.Seed), YAML: cfg.YAML()}
}

// learnerOptions are where training steps run, from the model section.
func learnerOptions(cfg Config) train.LearnerOptions {
	return train.LearnerOptions{Devices: cfg.Model.Devices, BF16: cfg.Model.TrainDtype == "bf16", BaseQ8: cfg.Model.TrainDtype == "q8_0",
		ZeroStage: cfg.Model.ZeroStage, OffloadReference: cfg.Model.OffloadReference}
}

// MemToolKB is MemTool's tool knowledge base: memtool.bench.tools (or, when
// that is "", the tools the queries' api_lists describe) indexed with the
// configured embedder, large indexes searched on embed.device.
func MemToolKB(ctx context.Context, cfg Config, qs []stabletoolbench.Query) (*agent.Catalog, error) {
	tools := stabletoolbench.QueryTools(qs)
	if path := cfg.MemTool.Bench.Tools; path != "" {
		var err error
		if tools, err = stabletoolbench.LoadCollection(path); err != nil {
			return nil, err
		}
	}
	emb, err := Embedder(ctx, cfg)
	if err != nil {
		return nil, err
	}
	kb, err := agent.NewCatalog(ctx, emb, tools)
	if err != nil {
		return nil, err
	}
	kb.UseDevice(IndexDevice(cfg))
	return kb, nil
}

// MemToolLive is the knowledge base of live MCP servers' tools (memtool
// bench --live), indexed with the configured embedder, and the executor
// that calls each on its server; closeAll ends the connections.
func MemToolLive(ctx context.Context, cfg Config, servers []agent.MCPServer) (*agent.Catalog, memtool.Executor, func(), error) {
	if len(servers) == 0 {
		return nil, nil, nil, fmt.Errorf("no MCP server: name them in mcp.servers, or with --mcp-url or --mcp-command")
	}
	emb, err := Embedder(ctx, cfg)
	if err != nil {
		return nil, nil, nil, err
	}
	tools, closeAll, err := agent.ConnectAll(ctx, servers)
	if err != nil {
		return nil, nil, nil, err
	}
	kb, exec, err := memtool.Upstream(ctx, emb, tools)
	if err != nil {
		closeAll()
		return nil, nil, nil, err
	}
	kb.UseDevice(IndexDevice(cfg))
	return kb, exec, closeAll, nil
}

// MemToolEnv is MemTool's Autonomous mode as an environment: the training
// queries are memtool.train.queries, or
// those of memtool.bench.queries after the benchmark's first
// memtool.bench.turns, which stay held out.
func MemToolEnv(ctx context.Context, cfg Config) (*memtool.Env, error) {
	c := cfg.MemTool
	path := c.Train.Queries
	if path == "" {
		path = c.Bench.Queries
	}
	qs, err := stabletoolbench.LoadQueries(path)
	if err != nil {
		return nil, err
	}
	kb, err := MemToolKB(ctx, cfg, qs)
	if err != nil {
		return nil, err
	}
	if err := stabletoolbench.ResolveGold(qs, kb); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	if c.Train.Queries == "" {
		if len(qs) <= c.Bench.Turns {
			return nil, fmt.Errorf("memtool.train.queries is empty and %s has %d queries, all in the benchmark's session (memtool.bench.turns %d): name a training file or generate more queries", path, len(qs), c.Bench.Turns)
		}
		qs = qs[c.Bench.Turns:]
	}
	e, err := memtool.NewEnv(c, kb, qs)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return e, nil
}

// MemToolGRPO is GRPO's options for MemTool's Autonomous mode
// (agemem-train memtool train) on MemToolEnv.
func MemToolGRPO(ctx context.Context, cfg Config, log io.Writer) (rl.Options[memtool.Episode], error) {
	e, err := MemToolEnv(ctx, cfg)
	if err != nil {
		return rl.Options[memtool.Episode]{}, err
	}
	rew := memtool.NewReward(cfg.MemTool.Train)
	o, err := grpoOptions[memtool.Episode](cfg, e, rew, log)
	if err != nil || cfg.MemTool.Train.Val == "" {
		return o, err
	}
	c := cfg.MemTool
	qs, err := stabletoolbench.LoadQueries(c.Train.Val)
	if err != nil {
		return o, fmt.Errorf("memtool.train.val: %w", err)
	}
	if err := stabletoolbench.ResolveGold(qs, e.KB); err != nil {
		return o, fmt.Errorf("memtool.train.val %s: %w", c.Train.Val, err)
	}
	sessions, err := memtool.EvalSessions(qs, min(cfg.RL.ValTasks, len(qs)/c.Eval.Turns), c.Eval.Turns)
	if err != nil {
		return o, fmt.Errorf("memtool.train.val %s: %w", c.Train.Val, err)
	}
	// The policy plays them as memtool eval plays an agent: greedily, in
	// the environment training plays, scored by the training reward.
	o.Validate = func(ctx context.Context, dir string) (float64, float64, error) {
		m, err := ChatModel(ctx, cfg, Models{Native: dir}, "auto", len(sessions), io.Discard)
		if err != nil {
			return 0, 0, err
		}
		if closer, ok := m.(interface{ Close() }); ok {
			defer closer.Close()
		}
		scores, err := memtool.Evaluate(ctx, memtool.EvalOptions{Config: c, KB: e.KB, Sessions: sessions, Agent: m, Judge: memtool.ContainsJudge{}, Parallel: len(sessions)})
		if err != nil {
			return 0, 0, err
		}
		js := make([]float64, len(scores))
		for i, sc := range scores {
			js[i] = rew.Session(sc)
		}
		st := memtool.MeanSE(js)
		return st.Mean, st.SE, nil
	}
	return o, nil
}

// OllamaPolicy is an AgeMem policy on the Ollama server, as the server
// describes it (ollama.format: raw renders AgeMem's text here and keeps it
// as written; tools drives the model's native function calling through
// memtools.FunctionCalling), and the model itself (its context, for
// serve).
func OllamaPolicy(ctx context.Context, cfg Config, name string) (llm.Model, *ollama.Model, error) {
	c, err := cfg.Ollama.Connect()
	if err != nil {
		return nil, nil, err
	}
	m, err := cfg.Ollama.Described(ctx, c, name, cfg.Ollama.Format == "raw", cfg.Agent.ContextBudget, cfg.Agent.ResponseBudget)
	if err != nil {
		return nil, nil, err
	}
	if cfg.Ollama.Format == "tools" {
		return memtools.FunctionCalling{Model: m}, m, nil
	}
	return m, m, nil
}

// OpenAIPolicy is an AgeMem policy on the OpenAI-compatible server,
// sampling as s says (openai.format: raw keeps AgeMem's text in the messages; tools drives
// native function calling through memtools.FunctionCalling).
func OpenAIPolicy(cfg Config, name string, s llm.Sampling) (llm.Model, error) {
	c, err := cfg.OpenAI.Connect()
	if err != nil {
		return nil, err
	}
	m := cfg.OpenAI.ChatModel(c, name, cfg.Agent.ResponseBudget)
	m.Sampling = s
	if cfg.OpenAI.Format == "tools" {
		return memtools.FunctionCalling{Model: m}, nil
	}
	return m, nil
}
