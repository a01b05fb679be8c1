package main

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/spf13/cobra"

	"github.com/agemem/agemem/agent"
	"github.com/agemem/agemem/bench/workbench"
	"github.com/agemem/agemem/embed"
	"github.com/agemem/agemem/internal/chart"
	"github.com/agemem/agemem/llm"
	"github.com/agemem/agemem/memtools/ltm"
	"github.com/agemem/agemem/papers/fittext"
	"github.com/agemem/agemem/papers/memtoolagent"
	"github.com/agemem/agemem/setup"
)

func toolsRunCmd(g *globals) *cobra.Command {
	var envName, dataDir, memory, model, native, dev, extractor, out, memDB, agentKind, retrieval, recall, functions, python string
	var taskFiles []string
	var online, hard bool
	var maxSteps, limit, parallel, memorySize int
	ad := memtoolagent.DefaultAdaptive()
	cmd := &cobra.Command{
		Use:   "run",
		Short: "Play a tool-use benchmark with and without MemToolAgent's memory (WorkBench, NESTFUL)",
		Long: `Plays WorkBench (--env workbench): the sandbox of a workplace (emails,
calendar, web analytics, project tasks, customers, company directory; the
published data is embedded, --data DIR reads another copy) and its 27 tools,
on the queries of --tasks files (WorkBench's *_queries_and_answers.csv;
default: the embedded analytics, calendar and email sets). Each query is
played by the function-calling agent (the model on openai.base_url with
--model, or a local checkpoint with --native DIR) in a fresh sandbox and
scored as WorkBench scores it: correct when the state after its calls
equals the state after the gold calls.

--memory on is MemToolAgent: one query per template is held out, played,
scored, and stored with its calls and feedback, a failure with the memory
extractor's reflection (--extractor-model, default the agent's model);
every test query recalls the entries most similar to it, as many as the
adaptive count of the similarity curve gives (--radius, --peak, --fallback),
in its system prompt; --recall top-K or gap recalls a fixed K or the
entries above the largest drop of similarity instead (the paper's
baselines). --memory off plays the same test queries without;
both plays both. Prints accuracy per domain with standard errors, exact
match, wrong side effects, the memory's size and the entries recalled;
writes report.json (every run's calls and scores) and accuracy.png to --out.

--env nestful plays NESTFUL (nested call sequences; --data its
nestful_data.jsonl) as MemToolAgent does: the model answers each query
with a JSON list of calls under the paper's prompt (Figure 18); the first
--limit samples (default 500) are the test set and the next --memory-size
(500) populate the memory, a failure stored with the extractor's critique.
Prints NESTFUL's metrics (function and parameter F1, partial and full
sequence accuracy, and with --functions DIR, NESTFUL's
executable_functions folder, the win rate: the calls executed by python3
return the gold answer) and writes report.json.

--agent dfsdt plays FitText's agent instead (fittext section, dfsdt keys):
ToolLLM's depth-first search-based decision tree over the model's turns,
each branch in its own sandbox (its calls replayed into a fresh one), a
state retried with a diversity prompt when what followed it failed, a
path pruned at a function it was never given, a failing call or giving
up. With --retrieval STRATEGY (single, ibi, dbd, scattershot, memetic,
memetic-v2; comma-separated for several runs) it starts with Finish
alone and the pseudo-tools it writes retrieve WorkBench's functions;
--retrieval none gives it every function from the start (plain DFSDT).
The memory options are the function-calling loop's and do not apply.`,
		Example: `  agemem-train tools run --env workbench --memory both --set openai.base_url=http://127.0.0.1:11434/v1 --model qwen3:8b
  agemem-train tools run --env workbench --memory on --native runs/qwen2.5-7b-instruct --tasks analytics_queries_and_answers.csv --limit 20
  agemem-train tools run --env nestful --data NESTFUL/data_v2/nestful_data.jsonl --functions NESTFUL/data_v2/executable_functions --set openai.base_url=http://127.0.0.1:11434/v1 --model qwen3:8b
  agemem-train tools run --env workbench --agent dfsdt --retrieval none,single,memetic --set openai.base_url=http://127.0.0.1:11434/v1 --model qwen3:8b`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if envName != "workbench" && envName != "nestful" {
				return fmt.Errorf("--env %q: want workbench or nestful", envName)
			}
			switch {
			case maxSteps < 1:
				return fmt.Errorf("--max-steps %d: the model needs at least one turn", maxSteps)
			case limit < 0:
				return fmt.Errorf("--limit %d: want 0 (all queries) or more", limit)
			case parallel < 1:
				return fmt.Errorf("--parallel %d: want at least 1", parallel)
			}
			if err := ad.Check(); err != nil {
				return fmt.Errorf("--radius, --peak, --fallback: %w", err)
			}
			var counter memtoolagent.Counter = ad
			switch k, isTop := strings.CutPrefix(recall, "top-"); {
			case recall == "dynamic":
			case recall == "gap":
				counter = memtoolagent.Gap{}
			case isTop:
				n, err := strconv.Atoi(k)
				if err != nil || n < 1 {
					return fmt.Errorf("--recall %q: top-K needs a count K of 1 or more", recall)
				}
				counter = memtoolagent.TopK(n)
			default:
				return fmt.Errorf("--recall %q: want dynamic (the paper's), top-K or gap", recall)
			}
			modes := map[string][]bool{"on": {true}, "off": {false}, "both": {false, true}}[memory]
			if modes == nil {
				return fmt.Errorf("--memory %q: want on, off or both", memory)
			}
			var retrievals []string
			switch agentKind {
			case "react":
				if cmd.Flags().Changed("retrieval") {
					return fmt.Errorf("--retrieval is the dfsdt agent's (--agent dfsdt)")
				}
			case "dfsdt":
				if cmd.Flags().Changed("memory") && memory != "off" {
					return fmt.Errorf("--memory %s: MemToolAgent's memory is the react agent's; --agent dfsdt plays without it", memory)
				}
				for _, r := range strings.Split(retrieval, ",") {
					r = strings.TrimSpace(r)
					if r != "none" {
						if err := fittext.CheckStrategy(r); err != nil || r == "query" {
							return fmt.Errorf("--retrieval %q: want none or a strategy that reads pseudo-tools (%s)", r, strings.Join(fittext.Strategies[1:], ", "))
						}
					}
					if slices.Contains(retrievals, r) {
						return fmt.Errorf("--retrieval: %s is named twice", r)
					}
					retrievals = append(retrievals, r)
				}
			default:
				return fmt.Errorf("--agent %q: want react or dfsdt", agentKind)
			}
			if envName == "nestful" {
				for _, f := range []string{"tasks", "online", "hard-preference", "max-steps"} {
					if cmd.Flags().Changed(f) {
						return fmt.Errorf("--%s is WorkBench's; --env nestful asks for a call sequence in one turn", f)
					}
				}
				if agentKind != "react" {
					return fmt.Errorf("--agent %s: --env nestful plays the function-calling agent (react)", agentKind)
				}
				if dataDir == "" {
					return fmt.Errorf("--env nestful needs --data: NESTFUL's nestful_data.jsonl (its GitHub release's data_v2, or the Hugging Face export)")
				}
			} else if cmd.Flags().Changed("functions") || cmd.Flags().Changed("memory-size") {
				return fmt.Errorf("--functions and --memory-size are NESTFUL's (--env nestful)")
			}
			cfg, err := g.load()
			if err != nil {
				return err
			}
			ctx := cmd.Context()
			// newMemory is MemToolAgent's memory for one run: in memory, or in
			// --memory-db's namespace, which must be empty.
			newMemory := func(emb embed.Embedder) (*memtoolagent.Memory, func(), error) {
				var st ltm.Store = ltm.NewMemStore(uint64(cfg.Seed))
				done := func() {}
				if memDB != "" {
					db, err := ltm.OpenSQLite(memDB, setup.StoreOptions(cfg))
					if err != nil {
						return nil, nil, err
					}
					done = func() { db.Close() }
					if st, err = db.Namespace(cfg.Memory.Namespace); err != nil {
						db.Close()
						return nil, nil, err
					}
					if n, _ := st.Count(ctx); n > 0 {
						db.Close()
						return nil, nil, fmt.Errorf("--memory-db %s: namespace %q already holds %d entries; a benchmark builds its memory from nothing (set memory.namespace)", memDB, cfg.Memory.Namespace, n)
					}
				}
				return &memtoolagent.Memory{Store: st, Embedder: emb, Count: counter}, done, nil
			}
			if envName == "nestful" {
				if !cmd.Flags().Changed("out") {
					out = "runs/nestful"
				}
				return nestfulRun(cmd, cfg, nestfulOptions{data: dataDir, functions: functions, python: python, model: model, native: native, dev: dev,
					extractor: extractor, out: out, limit: limit, memorySize: memorySize, parallel: parallel, modes: modes}, newMemory)
			}
			data := workbench.Default()
			if dataDir != "" {
				if data, err = workbench.Load(dataDir); err != nil {
					return err
				}
			}
			var tasks []workbench.Task
			if len(taskFiles) == 0 {
				for _, f := range []string{"analytics", "calendar", "email"} {
					ts, err := workbench.EmbeddedTasks(f)
					if err != nil {
						return err
					}
					tasks = append(tasks, ts...)
				}
			}
			for _, f := range taskFiles {
				ts, err := workbench.LoadTasks(f)
				if err != nil {
					return err
				}
				tasks = append(tasks, ts...)
			}
			if limit > 0 && len(tasks) > limit {
				tasks = tasks[:limit]
			}
			if agentKind == "dfsdt" {
				results, err := searchBench(cmd, cfg, data, tasks, retrievals, model, native, dev, parallel)
				if err != nil {
					return err
				}
				return writeBench(cmd, out, results)
			}
			m, ext, emb, err := memoryAgent(cmd, cfg, model, native, dev, extractor, parallel)
			if err != nil {
				return err
			}
			var results []workbench.Result
			for _, on := range modes {
				o := memtoolagent.WorkBenchOptions{Model: m, Extractor: ext, Online: online, HardPreference: hard, Limits: agent.Limits{MaxSteps: maxSteps}, Log: cmd.ErrOrStderr(), Parallel: parallel}
				if on {
					mem, done, err := newMemory(emb)
					if err != nil {
						return err
					}
					defer done()
					o.Memory = mem
				}
				r, err := memtoolagent.WorkBench(ctx, data, tasks, o)
				if err != nil {
					return err
				}
				results = append(results, r)
			}
			return writeBench(cmd, out, results)
		},
	}
	f := cmd.Flags()
	f.StringVar(&envName, "env", "workbench", "the benchmark: workbench or nestful")
	f.StringVar(&dataDir, "data", "", "workbench: a sandbox directory (default: the embedded one); nestful: NESTFUL's nestful_data.jsonl (required)")
	f.StringVar(&functions, "functions", "", "nestful: NESTFUL's executable_functions folder, for the win rate (run with python3)")
	f.StringVar(&python, "python", "python3", "nestful: the Python interpreter that runs --functions")
	f.IntVar(&memorySize, "memory-size", 500, "nestful: the samples after the test set that populate the memory (the paper's 500)")
	f.StringArrayVar(&taskFiles, "tasks", nil, "a queries-and-answers CSV file (repeatable; default: the embedded analytics, calendar and email sets)")
	f.StringVar(&memory, "memory", "both", "on (MemToolAgent's memory), off, or both")
	f.StringVar(&model, "model", "", "the agent's model on openai.base_url (default openai.model), or ollama:NAME (Ollama, native tools)")
	f.StringVar(&native, "native", "", "a local Qwen checkpoint directory as the agent (the built-in engine)")
	f.StringVar(&dev, "device", "auto", "the native engine's device: auto, cpu, cuda:N")
	f.StringVar(&extractor, "extractor-model", "", "the memory extractor's model on openai.base_url (default: the agent's)")
	f.BoolVar(&online, "online", false, "also store every test query's entry as it is scored")
	f.BoolVar(&hard, "hard-preference", false, "Hard Preference Guiding: drop from the agent's tools those only the recalled failures used")
	f.IntVar(&maxSteps, "max-steps", 10, "model turns per query")
	f.IntVar(&limit, "limit", 0, "play only the first N queries (0: all; nestful: the test set, default the paper's first 500)")
	f.IntVar(&parallel, "parallel", 4, "test queries played at once (on the native engine their calls decode together)")
	f.StringVar(&agentKind, "agent", "react", "react (the function-calling loop) or dfsdt (FitText's tree search)")
	f.StringVar(&retrieval, "retrieval", "memetic", "dfsdt: the FitText strategies its pseudo-tools retrieve with, comma-separated, or none")
	f.StringVar(&memDB, "memory-db", "", "keep the memory in this SQLite file (namespace memory.namespace, which must be empty) instead of in memory")
	f.StringVar(&out, "out", "runs/workbench", "folder for report.json and accuracy.png")
	f.StringVar(&recall, "recall", "dynamic", "how many entries a query recalls: dynamic (the paper's adaptive count), top-K (a fixed K) or gap (Adaptive-k: above the largest drop)")
	f.IntVar(&ad.R, "radius", ad.R, "adaptive recall: the slope's half window R")
	f.IntVar(&ad.PeakNumber, "peak", ad.PeakNumber, "adaptive recall: the peak that sets the count (1 or 2)")
	f.IntVar(&ad.Fallback, "fallback", ad.Fallback, "adaptive recall: entries recalled when the curve has no peak (0: all)")
	return cmd
}

// memoryAgent is MemToolAgent's cast for a benchmark run: the acting
// model, the memory extractor (--extractor-model, else the agent's own)
// and the embedder of the memory's queries (embed.backend's, else feature
// hashing).
func memoryAgent(cmd *cobra.Command, cfg setup.Config, model, native, dev, extractor string, parallel int) (m, ext llm.Model, emb embed.Embedder, err error) {
	if m, err = chatModels(cmd, cfg, model, native, dev, parallel); err != nil {
		return nil, nil, nil, err
	}
	ext = m
	if extractor != "" {
		if ext, err = chatModel(cmd, cfg, extractor, "", dev); err != nil {
			return nil, nil, nil, err
		}
	}
	h, err := setup.NewHelpers(cmd.Context(), cfg)
	if err != nil {
		return nil, nil, nil, err
	}
	emb = cfg.Embed.Hashing()
	if h.Embedder != nil {
		emb = h.Embedder
	}
	return m, ext, emb, nil
}

// writeBench prints the results and writes report.json and accuracy.png.
func writeBench(cmd *cobra.Command, out string, results []workbench.Result) error {
	workbench.Print(cmd.OutOrStdout(), results)
	if err := os.MkdirAll(out, 0o755); err != nil {
		return err
	}
	raw, _ := json.MarshalIndent(results, "", "  ")
	if err := os.WriteFile(filepath.Join(out, "report.json"), append(raw, '\n'), 0o644); err != nil {
		return err
	}
	if err := accuracyChart(filepath.Join(out, "accuracy.png"), results); err != nil {
		return err
	}
	fmt.Fprintf(cmd.OutOrStdout(), "wrote %s and %s\n", filepath.Join(out, "report.json"), filepath.Join(out, "accuracy.png"))
	return nil
}

// searchBench plays the tasks with FitText's search, once per retrieval
// strategy ("none": every function visible). On the native engine the
// agent's and the strategies' calls decode in shared steps.
func searchBench(cmd *cobra.Command, cfg setup.Config, data *workbench.Data, tasks []workbench.Task, retrievals []string, model, native, dev string, parallel int) ([]workbench.Result, error) {
	ctx := cmd.Context()
	m, err := chatModels(cmd, cfg, model, native, dev, max(parallel, 2))
	if err != nil {
		return nil, err
	}
	strategies := &fittext.ModelLLM{Model: m}
	emb, err := setup.Embedder(ctx, cfg)
	if err != nil {
		return nil, err
	}
	ts, err := data.New().Toolset(nil, nil)
	if err != nil {
		return nil, err
	}
	kb, err := fittext.WorldKB(ctx, emb, ts.Functions())
	if err != nil {
		return nil, err
	}
	var results []workbench.Result
	for _, r := range retrievals {
		s := &fittext.Search{Model: m, Strategy: r, Config: cfg.FitText.DFSDT}
		if r != "none" {
			s.Retriever = &fittext.Retriever{Config: cfg.FitText, KB: kb, LLM: strategies, Seed: uint64(cfg.Seed)}
		}
		res, err := fittext.WorkBench(ctx, data, tasks, s, r, parallel, cmd.ErrOrStderr())
		if err != nil {
			return nil, err
		}
		results = append(results, res)
	}
	return results, nil
}

// accuracyChart draws accuracy per domain, one bar a run.
func accuracyChart(path string, rs []workbench.Result) error {
	doms := append([]string{"all"}, workbench.Domains(rs)...)
	var names []string
	var vals, errs [][]float64
	for _, r := range rs {
		names = append(names, r.Label())
		var v, e []float64
		for _, d := range doms {
			s := r.Accuracy
			if d != "all" {
				s = r.ByDomain[d]
			}
			v, e = append(v, s.Mean), append(e, s.SE)
		}
		vals, errs = append(vals, v), append(errs, e)
	}
	return chart.Bars(path, "WorkBench: accuracy by domain (mean and standard error)", "accuracy (0 to 1)", names, doms, vals, errs)
}
