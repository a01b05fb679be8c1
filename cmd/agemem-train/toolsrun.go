package main

import (
	"fmt"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/agemem/agemem/bench/nestful"
	"github.com/agemem/agemem/bench/workbench"
	"github.com/agemem/agemem/setup"
)

const toolsRunLong = `Plays WorkBench (--env workbench, the workbench section): the sandbox of a
workplace (emails, calendar, web analytics, project tasks, customers,
company directory; the published data is embedded, --data DIR reads
another copy) and its 27 tools, on the queries of --tasks files
(WorkBench's *_queries_and_answers.csv; default: the embedded analytics,
calendar and email sets). Each query is played by the function-calling
agent (the model on openai.base_url with --model, or a local checkpoint
with --native DIR) in a fresh sandbox and scored as WorkBench scores it:
correct when the state after its calls equals the state after the gold
calls.

--memory on is MemToolAgent (the memtoolagent section): one query per
template is held out, played, scored, and stored with its calls and
feedback, a failure with the memory extractor's reflection
(--extractor-model, default the agent's model); every test query recalls
the entries most similar to it, as many as the adaptive count of the
similarity curve gives (--radius, --peak, --fallback), in its system
prompt; --recall top-K or gap recalls a fixed K or the entries above the
largest drop of similarity instead (the paper's baselines). --memory off
plays the same test queries without; both plays both. Prints accuracy per
domain with standard errors, exact match, wrong side effects, the
memory's size and the entries recalled; writes report.json (every run's
calls and scores) and accuracy.png to --out.

--env nestful plays NESTFUL (the nestful section: nested call sequences;
--data its nestful_data.jsonl) as MemToolAgent does: the model answers
each query with a JSON list of calls under the paper's prompt (Figure
18); the first --limit samples (nestful.test_size, the paper's 500) are
the test set and the next --memory-size (500) populate the memory, a
failure stored with the extractor's critique. Prints NESTFUL's metrics
(function and parameter F1, partial and full sequence accuracy, and with
--functions DIR, NESTFUL's executable_functions folder, the win rate: the
calls executed by python3 return the gold answer) and writes report.json.

--agent dfsdt plays FitText's agent instead (fittext section, dfsdt keys):
ToolLLM's depth-first search-based decision tree over the model's turns,
each branch in its own sandbox (its calls replayed into a fresh one), a
state retried with a diversity prompt when what followed it failed, a
path pruned at a function it was never given, a failing call or giving
up. With --retrieval STRATEGY (single, ibi, dbd, scattershot, memetic,
memetic-v2; comma-separated for several runs) it starts with Finish
alone and the pseudo-tools it writes retrieve WorkBench's functions;
--retrieval none gives it every function from the start (plain DFSDT).
The memory options are the function-calling loop's and do not apply.

Every option but --env, --agent, --model and --native is a config key
(its flag's help names it), so a run can be written down in a config
file; a flag that is given wins over its key.`

func toolsRunCmd(g *globals) *cobra.Command {
	var envName, agentKind, model, native string
	cmd := &cobra.Command{
		Use:   "run",
		Short: "Play a tool-use benchmark with and without MemToolAgent's memory (WorkBench, NESTFUL)",
		Long:  toolsRunLong,
		Example: `  agemem-train tools run --env workbench --memory both --set openai.base_url=http://127.0.0.1:11434/v1 --model qwen3:8b
  agemem-train tools run --env workbench --memory on --native runs/qwen2.5-7b-instruct --tasks analytics_queries_and_answers.csv --limit 20
  agemem-train tools run --env nestful --data NESTFUL/data_v2/nestful_data.jsonl --functions NESTFUL/data_v2/executable_functions --set openai.base_url=http://127.0.0.1:11434/v1 --model qwen3:8b
  agemem-train tools run --env workbench --agent dfsdt --retrieval none,single,memetic --set openai.base_url=http://127.0.0.1:11434/v1 --model qwen3:8b
  agemem-train tools run --config my-run.yaml --env nestful --set memtoolagent.recall=top-3`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			f := cmd.Flags()
			if err := checkToolsRun(f, envName, agentKind); err != nil {
				return err
			}
			// --data, --limit, --parallel and --out set the keys of the
			// benchmark --env names.
			for flag, key := range map[string]string{"data": "data", "limit": "limit", "parallel": "parallel", "out": "out"} {
				if envName == "nestful" && flag == "limit" {
					key = "test_size"
				}
				g.Bind(f, flag, envName+"."+key)
			}
			cfg, err := g.load()
			if err != nil {
				return err
			}
			ctx, log, stdout := cmd.Context(), cmd.ErrOrStderr(), cmd.OutOrStdout()
			m := setup.Models{Model: model, Native: native}
			if envName == "nestful" {
				if cfg.Nestful.Data == "" {
					return fmt.Errorf("--env nestful needs --data (nestful.data): NESTFUL's nestful_data.jsonl (its GitHub release's data_v2, or the Hugging Face export)")
				}
				rs, err := setup.Nestful(ctx, cfg, m, log)
				if err != nil {
					return err
				}
				nestful.Print(stdout, rs)
				path, err := nestful.WriteReport(cfg.Nestful.Out, rs)
				if err != nil {
					return err
				}
				fmt.Fprintf(stdout, "wrote %s\n", path)
				return nil
			}
			rs, err := setup.WorkBench(ctx, cfg, agentKind, m, log)
			if err != nil {
				return err
			}
			workbench.Print(stdout, rs)
			paths, err := workbench.WriteReport(cfg.WorkBench.Out, rs)
			if err != nil {
				return err
			}
			fmt.Fprintf(stdout, "wrote %s and %s\n", paths[0], paths[1])
			return nil
		},
	}
	toolsRunFlags(g, cmd.Flags(), &envName, &agentKind, &model, &native)
	return cmd
}

// toolsRunFlags defines tools run's flags: the run's choices, then the
// config keys they override.
func toolsRunFlags(g *globals, f *pflag.FlagSet, envName, agentKind, model, native *string) {
	f.StringVar(envName, "env", "workbench", "the benchmark: workbench or nestful")
	f.StringVar(agentKind, "agent", "react", "react (the function-calling loop) or dfsdt (FitText's tree search)")
	f.StringVar(model, "model", "", "the agent's model on openai.base_url (default openai.model), or ollama:NAME (Ollama, native tools)")
	f.StringVar(native, "native", "", "a local Qwen checkpoint directory as the agent (the built-in engine)")
	g.Flag(f, "device", "model.device", "the native engine's device: auto, cpu, cuda:N")
	// The keys of the benchmark --env names.
	f.String("data", "", "workbench: a sandbox directory (workbench.data; default: the embedded one); nestful: NESTFUL's nestful_data.jsonl (nestful.data, required)")
	f.Int("limit", 0, "workbench: play only the first N queries (workbench.limit; 0: all); nestful: the first N samples are the test set (nestful.test_size; default the paper's 500, 0: all)")
	f.Int("parallel", 4, "test queries played at once; on the native engine their calls decode together (workbench.parallel, nestful.parallel)")
	f.String("out", "", "folder for the report (workbench.out: runs/workbench; nestful.out: runs/nestful)")
	g.Flag(f, "tasks", "workbench.tasks", "a queries-and-answers CSV file (repeatable; default: the embedded analytics, calendar and email sets)")
	g.Flag(f, "functions", "nestful.functions", "nestful: NESTFUL's executable_functions folder, for the win rate (run with python3)")
	g.Flag(f, "python", "nestful.python", "nestful: the Python interpreter that runs --functions")
	// MemToolAgent (--agent react).
	g.Flag(f, "memory", "memtoolagent.memory", "on (MemToolAgent's memory), off, or both")
	g.Flag(f, "recall", "memtoolagent.recall", "how many entries a query recalls: dynamic (the paper's adaptive count), top-K (a fixed K) or gap (Adaptive-k: above the largest drop)")
	g.Flag(f, "radius", "memtoolagent.adaptive.radius", "adaptive recall: the slope's half window R")
	g.Flag(f, "peak", "memtoolagent.adaptive.peak", "adaptive recall: the peak that sets the count (1 or 2)")
	g.Flag(f, "fallback", "memtoolagent.adaptive.fallback", "adaptive recall: entries recalled when the curve has no peak (0: all)")
	g.Flag(f, "extractor-model", "memtoolagent.extractor_model", "the memory extractor's model on openai.base_url (default: the agent's)")
	g.Flag(f, "memory-db", "memtoolagent.memory_db", "keep the memory in this SQLite file (namespace memory.namespace, which must be empty) instead of in memory")
	g.Flag(f, "max-steps", "memtoolagent.max_steps", "workbench: model turns per query")
	g.Flag(f, "online", "memtoolagent.online", "workbench: also store every test query's entry as it is scored")
	g.Flag(f, "hard-preference", "memtoolagent.hard_preference", "workbench: Hard Preference Guiding: drop from the agent's tools those only the recalled failures used")
	g.Flag(f, "memory-size", "memtoolagent.memory_size", "nestful: the samples after the test set that populate the memory (the paper's 500)")
	// FitText (--agent dfsdt).
	f.StringSlice("retrieval", setup.Default().FitText.DFSDT.Retrieval, "dfsdt: the FitText strategies its pseudo-tools retrieve with, comma-separated, or none (fittext.dfsdt.retrieval)")
	g.Bind(f, "retrieval", "fittext.dfsdt.retrieval")
}

// checkToolsRun refuses flags that do not apply to the benchmark and the
// agent the command line names.
func checkToolsRun(f *pflag.FlagSet, envName, agentKind string) error {
	if envName != "workbench" && envName != "nestful" {
		return fmt.Errorf("--env %q: want workbench or nestful", envName)
	}
	switch agentKind {
	case "react":
		if f.Changed("retrieval") {
			return fmt.Errorf("--retrieval is the dfsdt agent's (--agent dfsdt)")
		}
	case "dfsdt":
		if memory, _ := f.GetString("memory"); f.Changed("memory") && memory != "off" {
			return fmt.Errorf("--memory %s: MemToolAgent's memory is the react agent's; --agent dfsdt plays without it", memory)
		}
	default:
		return fmt.Errorf("--agent %q: want react or dfsdt", agentKind)
	}
	if envName == "nestful" {
		for _, name := range []string{"tasks", "online", "hard-preference", "max-steps"} {
			if f.Changed(name) {
				return fmt.Errorf("--%s is WorkBench's; --env nestful asks for a call sequence in one turn", name)
			}
		}
		if agentKind != "react" {
			return fmt.Errorf("--agent %s: --env nestful plays the function-calling agent (react)", agentKind)
		}
	} else if f.Changed("functions") || f.Changed("memory-size") {
		return fmt.Errorf("--functions and --memory-size are NESTFUL's (--env nestful)")
	}
	return nil
}
