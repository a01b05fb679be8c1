package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/mattn/go-isatty"
	"github.com/spf13/cobra"

	"github.com/agemem/agemem/bench/stabletoolbench"
	"github.com/agemem/agemem/internal/chart"
	"github.com/agemem/agemem/llm"
	"github.com/agemem/agemem/model/chat"
	"github.com/agemem/agemem/papers/memtool"
	"github.com/agemem/agemem/rl"
	"github.com/agemem/agemem/setup"
)

func memtoolCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "memtool",
		Short: "MemTool: an agent's working set of tools (generate a benchmark, run it, train a policy for it)",
	}
	cmd.AddCommand(memtoolSynthCmd(), memtoolBenchCmd(g), memtoolTrainCmd(g), memtoolDataCmd(g), memtoolTokenizerCmd(g), memtoolEvalCmd(g), memtoolAgentCmd(g))
	return cmd
}

func memtoolSynthCmd() *cobra.Command {
	var out string
	var seed, querySeed uint64
	var companies, perCompany, queries int
	cmd := &cobra.Command{
		Use:   "synth",
		Short: "Generate a ScaleMCP-style benchmark: a tool collection and queries with gold tools",
		Long: `Writes DIR/tools.json (a JSON list of MCP servers and their tools, the layout
public MCP tool collections use) and DIR/queries.json (StableToolBench's
solvable_queries layout, with "relevant APIs"): fictional companies, each a
server of financial-metric tools, and questions about one to four of them,
some following up on the previous question's company. ScaleMCP has 5,000
tools (the defaults: 1,000 companies × 5).`,
		Example: `  agemem-train memtool synth --out data/memtool
  agemem-train memtool synth --companies 100 --queries 50 --out /tmp/mt`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			sb, err := stabletoolbench.SynthQuestions(seed, querySeed, companies, perCompany, queries)
			if err != nil {
				return err
			}
			if err := os.MkdirAll(out, 0o755); err != nil {
				return err
			}
			for name, b := range map[string][]byte{"tools.json": sb.Collection, "queries.json": sb.Queries} {
				if err := os.WriteFile(filepath.Join(out, name), b, 0o644); err != nil {
					return err
				}
			}
			fmt.Fprintf(cmd.OutOrStdout(), "wrote %d tools of %d servers and %d queries to %s\n", companies*perCompany, companies, queries, out)
			return nil
		},
	}
	cmd.Flags().StringVar(&out, "out", "data/memtool", "directory to write tools.json and queries.json to")
	cmd.Flags().Uint64Var(&seed, "seed", 1, "generator seed")
	cmd.Flags().Uint64Var(&querySeed, "query-seed", 0, "draw the queries from this seed instead (0: --seed's): the same tools with other questions, a held-out set for a policy trained on --seed's")
	cmd.Flags().IntVar(&companies, "companies", 1000, "companies (MCP servers)")
	cmd.Flags().IntVar(&perCompany, "per-company", 5, "tools per company (at most 10)")
	cmd.Flags().IntVar(&queries, "queries", 200, "queries")
	return cmd
}

func memtoolTrainCmd(g *globals) *cobra.Command {
	var resume string
	cmd := &cobra.Command{
		Use:   "train",
		Short: "Train a policy to manage its working set of tools with GRPO (the Autonomous mode)",
		Long: `Starts from rl.init and trains it with the GRPO trainer of agemem-train train
in MemTool's Autonomous mode: each rollout is a session of memtool.train.turns
user queries from an empty working set, the policy the agent with
SYS_SEARCH_TOOLS, SYS_REMOVE_TOOLS and the tools it loaded (at most
memtool.limit, meta-tools included), the tools simulated. The reward is
memtool.train.w_correct × tool correctness (the share of each query's gold
tools called) + w_removal × the removal ratio (tools removed per tool added,
at most 1) + w_limit × the share of turns that never hit the limit; a model
call whose tool calls failed (malformed, an unknown tool, arguments outside
the schema, a search refused at the limit) has w_failed_call subtracted
from its own advantage, not the episode's; a turn's answering call has
w_missed_tool times the share of the turn's gold tools not called, and a
call that ran a tool the question did not ask for w_wrong_tool. The
queries are memtool.train.queries, or those of memtool.bench.queries after
the benchmark's first memtool.bench.turns. The rl section sets the rest
(k, batch_tasks, steps, lr, beta, out); rl.out receives what
agemem-train train writes. Evaluate with memtool bench --policy native
--native RL_OUT/policy.`,
		Example: `  agemem-train memtool synth --out data/memtool --queries 400
  agemem-train memtool train --config configs/tiny.yaml --set memtool.limit=12 --set rl.out=runs/memtool-rl
  agemem-train memtool bench --policy native --native runs/memtool-rl/policy --modes autonomous --set memtool.limit=12`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg, err := g.load()
			if err != nil {
				return err
			}
			o, err := setup.MemToolGRPO(cmd.Context(), cfg, cmd.ErrOrStderr())
			if err != nil {
				return err
			}
			o.Resume, o.TTY = resume, isatty.IsTerminal(os.Stderr.Fd())
			res, err := rl.Train(cmd.Context(), o)
			if err != nil {
				return err
			}
			if n := len(res.Steps); n > 0 {
				first, last := res.Steps[0], res.Steps[n-1]
				fmt.Fprintf(cmd.OutOrStdout(), "mean reward: step 1 %.3f, step %d %.3f (tool correctness %.3f -> %.3f, removal ratio %.3f -> %.3f, under the limit %.3f -> %.3f)\n",
					first.Reward, last.Step, last.Reward, first.Parts["tool_correctness"], last.Parts["tool_correctness"],
					first.Parts["removal_ratio"], last.Parts["removal_ratio"], first.Parts["under_limit"], last.Parts["under_limit"])
			}
			fmt.Fprintf(cmd.OutOrStdout(), "policy written to %s\n", res.Policy)
			return nil
		},
	}
	cmd.Flags().StringVar(&resume, "resume", "", "checkpoint directory to continue from")
	return cmd
}

func memtoolDataCmd(g *globals) *cobra.Command {
	var out, family, text string
	var skip float64
	cmd := &cobra.Command{
		Use:   "data",
		Short: "Write SFT data for memtool train: the oracle's calls in the Autonomous mode",
		Long: `Plays every training session of memtool train (memtool.train.turns queries from
an empty working set, the queries memtool train uses) with the scripted
oracle as the agent, through the same text a policy reads and writes
there (the tools in the system message, calls as <tool_call> blocks, as
--chat's template writes them), and writes one chat record per call:
the conversation the agent saw and the oracle's reply, the only message
of the record learned (earlier replies have "weight": 0; OpenAI's
fine-tuning JSONL, what agemem-train sft reads). The oracle removes what
the next query does not need, searches with what finds each tool (the
query's own phrases where they do) and calls the gold tools.

--skip-removal gives the teacher a habit for GRPO to unlearn: in that
share of the queries (drawn per query with the config's seed) it leaves
the tools the query does not need loaded, and when a search then hits
memtool.limit it answers with what it has. A policy that decodes
greedily does what its teacher did most often, so above one half it
never removes.

--text also writes the world's sentences, one a line, for copy
pretraining (pretrain.text): every line of the records (the tools as the
template lists them, queries, calls, results, answers) and each query's
phrases, once each.`,
		Example: `  agemem-train memtool data --set memtool.limit=16 --set memtool.top_k=3 --out data/memtool-sft.jsonl
  agemem-train memtool data --config configs/memtool.yaml --skip-removal 0.6 --out data/memtool/sft.jsonl
  agemem-train sft --config configs/tiny.yaml --set sft.data=data/memtool-sft.jsonl --set sft.out=runs/memtool-sft`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg, err := g.load()
			if err != nil {
				return err
			}
			tmpl, err := chatTemplate(family)
			if err != nil {
				return err
			}
			if out == "" {
				return fmt.Errorf("--out is required")
			}
			if !(skip >= 0 && skip <= 1) {
				return fmt.Errorf("--skip-removal %v: want a share in [0, 1]", skip)
			}
			if err := os.MkdirAll(filepath.Dir(out), 0o755); err != nil {
				return err
			}
			e, err := setup.MemToolEnv(cmd.Context(), cfg)
			if err != nil {
				return err
			}
			oracle := memtool.Oracle{Gold: map[string][]string{}, KB: e.KB, TopK: cfg.MemTool.TopK, SkipRemoval: skip, Seed: uint64(cfg.Seed)}
			for _, s := range e.Sessions {
				for _, q := range s {
					oracle.Gold[q.Text] = q.Gold
				}
			}
			rec := &recordingPolicy{m: oracle, template: tmpl}
			for t := range e.Len() {
				if _, err := e.Play(cmd.Context(), rec, t, 0); err != nil {
					return err
				}
			}
			f, err := create(out)
			if err != nil {
				return err
			}
			enc := json.NewEncoder(f)
			for _, r := range rec.records {
				if err := enc.Encode(r); err != nil {
					f.Close()
					return err
				}
			}
			if err := f.Close(); err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "wrote %d records from %d sessions to %s\n", len(rec.records), e.Len(), out)
			if text == "" {
				return nil
			}
			var queries []string
			for _, s := range e.Sessions {
				for _, q := range s {
					queries = append(queries, q.Text)
				}
			}
			n, err := writeWorldText(text, rec.records, queries)
			if err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "wrote %d sentences to %s\n", n, text)
			return nil
		},
	}
	cmd.Flags().StringVar(&out, "out", "", "chat JSONL to write")
	cmd.Flags().StringVar(&family, "chat", "qwen3", "the policy's chat template: qwen3 or qwen2.5 (how the tools and calls are laid out)")
	cmd.Flags().Float64Var(&skip, "skip-removal", 0, "share of queries in which the teacher leaves unneeded tools loaded (a habit for GRPO to unlearn)")
	cmd.Flags().StringVar(&text, "text", "", "also write the world's sentences, one a line, to this .txt file (pretrain.text)")
	return cmd
}

// writeWorldText writes the distinct lines of the records and the queries'
// phrases (as the oracle cuts them) to path, one a line.
func writeWorldText(path string, records []chatRecord, queries []string) (int, error) {
	if !strings.HasSuffix(path, ".txt") {
		return 0, fmt.Errorf("--text %s: name a .txt file (pretrain.text reads one sentence a line from it)", path)
	}
	seen := map[string]bool{}
	var b strings.Builder
	add := func(s string) {
		if s = strings.TrimSpace(s); s != "" && !seen[s] {
			seen[s] = true
			b.WriteString(s + "\n")
		}
	}
	for _, q := range queries {
		add(q)
		for _, p := range memtool.Phrases(q) {
			add(p)
		}
	}
	for _, r := range records {
		for _, m := range r.Messages {
			for _, line := range strings.Split(m.Content, "\n") {
				add(line)
			}
		}
	}
	return len(seen), os.WriteFile(path, []byte(b.String()), 0o644)
}

func chatTemplate(family string) (chat.Template, error) {
	switch family {
	case "qwen3":
		return chat.Qwen3, nil
	case "qwen2.5":
		return chat.Qwen25, nil
	}
	return 0, fmt.Errorf("--chat %q: want qwen3 or qwen2.5", family)
}

// recordingPolicy keeps each call of a model as a chat record in the text
// a native policy of the template reads and writes: the tools in the
// system message, calls as <tool_call> blocks.
type recordingPolicy struct {
	m        llm.Model
	template chat.Template
	records  []chatRecord
}

type chatRecord struct {
	Messages []weighted `json:"messages"`
}

// weighted is a message with OpenAI's fine-tuning weight: 0 on the
// replies a record repeats from its context, so that each call is learned
// once, in its own record.
type weighted struct {
	chat.Message
	Weight *int `json:"weight,omitempty"`
}

func (r *recordingPolicy) Chat(ctx context.Context, req llm.Request) (llm.Response, error) {
	c, err := r.m.Chat(ctx, req)
	if err != nil {
		return c, err
	}
	defs, err := chat.Definitions(req.Tools)
	if err != nil {
		return c, err
	}
	conv, err := chat.InlineTools(append(slices.Clone(req.Messages), c.Message), chat.Options{Template: r.template, Tools: defs})
	if err != nil {
		return c, err
	}
	msgs := make([]weighted, len(conv))
	zero := 0
	for i, m := range conv {
		msgs[i] = weighted{Message: chat.Message{Role: m.Role, Content: m.Content}}
		if m.Role == "assistant" && i < len(conv)-1 {
			msgs[i].Weight = &zero
		}
	}
	r.records = append(r.records, chatRecord{Messages: msgs})
	return c, nil
}

func memtoolBenchCmd(g *globals) *cobra.Command {
	var modes, policy, model, native, dev, controller, judgeModel string
	var live bool
	var mf mcpFlags
	cmd := &cobra.Command{
		Use:   "bench",
		Short: "Run the ScaleMCP-style session in each mode and report the paper's metrics",
		Long: `Plays the first memtool.bench.turns queries of memtool.bench.queries as one
session per mode (autonomous, workflow, hybrid; memtool.limit tools at most,
memtool.top_k per search keyword), the knowledge base being
memtool.bench.tools indexed with the configured embedder (embed.backend).
Tools run in a simulator that returns a fixed figure per tool. With --live
the knowledge base is instead the tools of live MCP servers (mcp.servers,
--mcp-url, --mcp-command), each call going to its server, and a query's
relevant APIs [tool_name, api_name] name a server and one of its tools
(servers given by flag are url1, url2, ..., command1, ...); the judge then
compares the answer with what the gold tools returned in the turn
(memtool.bench.judge contains: stated verbatim, which the oracle does and a
model rarely does; model: an LLM's score, --judge-model). Prints, per
mode, Avg Removal Ratio 3T, Avg Residual 3T, Tool Correctness and Task
Completion (the paper's Table 2 columns), and the knowledge base's
recall@top_k of the gold tools (no model involved); writes report.json
(every turn's trace) and tools.png (tool count per turn) to
memtool.bench.out.

The agent: --policy oracle (a scripted agent that knows each query's gold
tools: the ceiling, and a check of the control flow), native (a local Qwen
checkpoint, --native DIR, its own tool-call format) or openai (--model on
openai.base_url: vLLM, llama.cpp, Ollama's /v1, a hosted API).
--controller-model gives the prune and search calls their own (cheaper)
model on the same server.`,
		Example: `  agemem-train memtool synth --out data/memtool
  agemem-train memtool bench --policy oracle
  agemem-train memtool bench --policy native --native runs/tiny/rl/policy --set memtool.bench.turns=20
  agemem-train memtool bench --policy openai --set openai.base_url=http://127.0.0.1:11434/v1 --model qwen3:4b --modes hybrid
  agemem-train memtool bench --live --mcp-url http://127.0.0.1:3000/mcp --set memtool.bench.queries=my-queries.json \
    --policy openai --model qwen3:4b --set memtool.bench.judge=model --judge-model qwen3:8b`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg, err := g.load()
			if err != nil {
				return err
			}
			c := cfg.MemTool
			ctx := cmd.Context()
			qs, err := stabletoolbench.LoadQueries(c.Bench.Queries)
			if err != nil {
				return err
			}
			o := memtool.BenchOptions{Config: c, Queries: qs, Log: cmd.ErrOrStderr(), Judge: memtool.ContainsJudge{}}
			source := c.Bench.Tools
			if source == "" {
				source = "the queries' api_lists"
			}
			if live {
				servers, err := mf.servers(cfg)
				if err != nil {
					return err
				}
				kb, exec, closeAll, err := setup.MemToolLive(ctx, cfg, servers)
				if err != nil {
					return fmt.Errorf("--live: %w", err)
				}
				defer closeAll()
				o.KB, o.Exec, source = kb, exec, "the MCP servers' tools"
			} else if o.KB, err = setup.MemToolKB(ctx, cfg, qs); err != nil {
				return err
			}
			kb := o.KB
			if err := stabletoolbench.ResolveGold(qs, kb); err != nil {
				return fmt.Errorf("%s (knowledge base: %s): %w", c.Bench.Queries, source, err)
			}
			for _, m := range strings.Split(modes, ",") {
				if m = strings.TrimSpace(m); m != memtool.Autonomous && m != memtool.Workflow && m != memtool.Hybrid {
					return fmt.Errorf("--modes: %q is not autonomous, workflow or hybrid", m)
				}
				o.Modes = append(o.Modes, m)
			}
			switch policy {
			case "oracle":
				gold := map[string][]string{}
				for _, q := range qs {
					gold[q.Text] = q.Gold
				}
				o.Agent = memtool.Oracle{Gold: gold, KB: kb, TopK: c.TopK}
			case "native":
				if native == "" {
					return fmt.Errorf("--policy native needs --native DIR")
				}
				if o.Agent, err = chatModel(cmd, cfg, "", native, dev); err != nil {
					return err
				}
			case "openai":
				if o.Agent, err = chatModel(cmd, cfg, model, "", dev); err != nil {
					return err
				}
			default:
				return fmt.Errorf("--policy %q: want oracle, native or openai", policy)
			}
			if controller != "" {
				if o.Controller, err = chatModel(cmd, cfg, controller, "", dev); err != nil {
					return err
				}
			}
			if c.Bench.Judge == "model" {
				if judgeModel == "" {
					return fmt.Errorf("memtool.bench.judge model needs --judge-model (a model on openai.base_url)")
				}
				jm, err := chatModel(cmd, cfg, judgeModel, "", dev)
				if err != nil {
					return err
				}
				o.Judge = memtool.ModelJudge{Model: jm}
			}
			rep, err := memtool.Bench(ctx, o)
			if err != nil {
				return err
			}
			printMemtoolReport(cmd.OutOrStdout(), rep, policy)
			return writeMemtoolReport(c.Bench.Out, rep)
		},
	}
	cmd.Flags().StringVar(&modes, "modes", "autonomous,workflow,hybrid", "modes to run, comma-separated")
	cmd.Flags().StringVar(&policy, "policy", "oracle", "the agent: oracle, native or openai")
	cmd.Flags().StringVar(&model, "model", "", "--policy openai: the model on openai.base_url (default openai.model)")
	cmd.Flags().StringVar(&native, "native", "", "--policy native: a local Qwen checkpoint directory")
	cmd.Flags().StringVar(&dev, "device", "auto", "the native model's device")
	cmd.Flags().StringVar(&controller, "controller-model", "", "a model on openai.base_url for the prune, search and summary calls (default: the agent)")
	cmd.Flags().StringVar(&judgeModel, "judge-model", "", "the judge's model on openai.base_url (memtool.bench.judge model)")
	cmd.Flags().BoolVar(&live, "live", false, "the knowledge base is the tools of live MCP servers (mcp.servers, --mcp-url, --mcp-command), called on them")
	mf.add(cmd)
	return cmd
}

func fmtMetric(v float64, prec int) string {
	if math.IsNaN(v) {
		return "-"
	}
	return fmt.Sprintf("%.*f", prec, v)
}

func printMemtoolReport(w io.Writer, rep memtool.Report, policy string) {
	fmt.Fprintf(w, "%d tools, %d turns, L = %d, top-%d per keyword; knowledge-base recall@%d of the gold tools: %.3f for the query (NDCG %.3f), %.3f for the oracle's keywords\n",
		rep.Tools, rep.Turns, rep.Limit, rep.TopK, rep.Retrieval.K, rep.Retrieval.Recall, rep.Retrieval.NDCG, rep.Retrieval.OracleRecall)
	fmt.Fprintf(w, "%-8s %-11s %-10s %-10s %-9s %-9s %-9s %-7s %-7s %s\n", "policy", "mode", "RR3T", "Resid3T", "ToolCorr", "TaskComp", "max tools", "L hits", "failed", "answered")
	for _, m := range rep.Modes {
		x := m.Metrics
		fmt.Fprintf(w, "%-8s %-11s %-10s %-10s %-9.3f %-9.3f %-9d %-7d %-7d %.2f\n", policy, m.Mode, fmtMetric(x.AvgRemovalRatio3T, 3),
			fmtMetric(x.AvgResidual3T, 2), x.ToolCorrectness, x.TaskCompletion, x.MaxCount, x.LimitHits, x.Failed, x.Answered)
	}
}

func writeMemtoolReport(dir string, rep memtool.Report) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	b, err := json.MarshalIndent(rep, "", "  ")
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "report.json"), b, 0o644); err != nil {
		return err
	}
	var series []chart.Series
	for _, m := range rep.Modes {
		s := chart.Series{Name: m.Mode}
		for i, c := range m.Counts {
			s.Points = append(s.Points, chart.Point{X: float64(i + 1), Y: float64(c)})
		}
		series = append(series, s)
	}
	return chart.Lines(filepath.Join(dir, "tools.png"), fmt.Sprintf("MemTool: tools loaded after each turn (L = %d)", rep.Limit),
		"user turn", "tools in context", series)
}
