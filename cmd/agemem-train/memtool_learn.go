package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"strings"

	"github.com/spf13/cobra"

	"github.com/agemem/agemem/agent"
	"github.com/agemem/agemem/bench/stabletoolbench"
	"github.com/agemem/agemem/llm"
	"github.com/agemem/agemem/model/chat"
	"github.com/agemem/agemem/papers/memtool"
	"github.com/agemem/agemem/setup"
)

func memtoolTokenizerCmd(g *globals) *cobra.Command {
	var data, out, tmpl, pretok string
	var vocab int
	cmd := &cobra.Command{
		Use:   "tokenizer",
		Short: "Learn a tokenizer for a MemTool policy on its SFT data",
		Long: `Learns a byte-level BPE (NFC) on the messages of chat JSONL (what memtool data
writes: the system message with the tools as the chat template lays them
out, the queries, the calls and the tool results), each distinct message
once, with the ChatML special tokens and the tool-call tags as added
tokens, and writes tokenizer.json and tokenizer_config.json with --template's
chat template. agemem-train init-model --tokenizer makes a model of it.`,
		Example: `  agemem-train memtool tokenizer --data data/memtool/sft.jsonl --vocab-size 2048 --out runs/memtool/tok`,
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg, err := g.load()
			if err != nil {
				return err
			}
			if data == "" || out == "" {
				return fmt.Errorf("--data and --out are required")
			}
			text, pattern, err := tokenizerSpec(tmpl, pretok)
			if err != nil {
				return err
			}
			texts, records, err := chatTexts(data)
			if err != nil {
				return err
			}
			tok, err := writeTokenizer(texts, vocab, text, pattern, out, cfg.Agent.ContextBudget)
			if err != nil {
				return err
			}
			fmt.Fprintf(cmd.ErrOrStderr(), "wrote %s: %d tokens, learned on %d distinct messages of %d records\n", out, tok.VocabSize(), len(texts), records)
			return nil
		},
	}
	cmd.Flags().StringVar(&data, "data", "", "chat JSONL (memtool data's output)")
	cmd.Flags().StringVar(&out, "out", "", "output directory")
	cmd.Flags().IntVar(&vocab, "vocab-size", 2048, "vocabulary size, byte and added tokens included")
	cmd.Flags().StringVar(&tmpl, "template", "qwen2.5", "chat template written to tokenizer_config.json: qwen2.5 or qwen3 (as memtool data --chat)")
	cmd.Flags().StringVar(&pretok, "pretokenizer", "words", "how text is cut before BPE: words, names or qwen (as agemem-train tokenizer train)")
	return cmd
}

// chatTexts are the distinct message contents of a chat JSONL file, in
// order of first appearance, and the number of records.
func chatTexts(path string) ([]string, int, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, 0, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 0, 1<<20), 64<<20)
	seen := map[string]bool{}
	var texts []string
	n := 0
	for line := 1; sc.Scan(); line++ {
		if strings.TrimSpace(sc.Text()) == "" {
			continue
		}
		var rec struct {
			Messages []chat.Message `json:"messages"`
		}
		if err := json.Unmarshal(sc.Bytes(), &rec); err != nil {
			return nil, 0, fmt.Errorf("%s:%d: not a chat record: %w", path, line, err)
		}
		n++
		for _, m := range rec.Messages {
			if !seen[m.Content] {
				seen[m.Content] = true
				texts = append(texts, m.Content)
			}
		}
	}
	if err := sc.Err(); err != nil {
		return nil, 0, fmt.Errorf("%s: %w", path, err)
	}
	if n == 0 {
		return nil, 0, fmt.Errorf("%s: no records", path)
	}
	return texts, n, nil
}

func memtoolEvalCmd(g *globals) *cobra.Command {
	var agents, diffs []string
	var out, dev string
	cmd := &cobra.Command{
		Use:   "eval",
		Short: "Compare agents on held-out sessions: each metric's mean and standard error, and paired differences",
		Long: `Cuts the first memtool.eval.sessions × memtool.eval.turns queries of
memtool.bench.queries into sessions, each played from an empty working set in
memtool.mode by every --agent, with the tools simulated, and prints per agent
the mean over sessions and its standard error of: RR3T (Eq. 2), Resid3T
(Eq. 3), tool correctness (Eq. 5), task completion (memtool.bench.judge
contains), the share of turns whose search hit memtool.limit and the share
of the agent's calls that never reached a tool (format errors). Each --diff
A,B prints B − A per session, averaged, with its standard error (the
sessions are the same, so the difference is paired). --out writes it all
as JSON, every session's scores included.

An agent is oracle (knows each query's gold tools; the ceiling),
never-removing (the oracle without SYS_REMOVE_TOOLS: the habit the paper
finds in small models), LABEL=DIR (a local checkpoint, decoded greedily,
the sessions' calls batched together) or LABEL=openai:MODEL (MODEL on
openai.base_url).`,
		Example: `  agemem-train memtool eval --config configs/memtool.yaml --agent oracle --agent never-removing \
    --agent "before GRPO=checkpoints/memtool" --agent "after GRPO=runs/memtool/rl/policy" --diff "before GRPO,after GRPO"`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg, err := g.load()
			if err != nil {
				return err
			}
			c := cfg.MemTool
			ctx := cmd.Context()
			if len(agents) == 0 {
				return fmt.Errorf("name at least one --agent")
			}
			qs, err := stabletoolbench.LoadQueries(c.Bench.Queries)
			if err != nil {
				return err
			}
			kb, err := setup.MemToolKB(ctx, cfg, qs)
			if err != nil {
				return err
			}
			if err := stabletoolbench.ResolveGold(qs, kb); err != nil {
				return fmt.Errorf("%s: %w", c.Bench.Queries, err)
			}
			sessions, err := memtool.EvalSessions(qs, c.Eval.Sessions, c.Eval.Turns)
			if err != nil {
				return fmt.Errorf("%s: %w", c.Bench.Queries, err)
			}
			gold := map[string][]string{}
			for _, q := range qs {
				gold[q.Text] = q.Gold
			}
			rep := evalReport{Queries: c.Bench.Queries, Sessions: len(sessions), Turns: c.Eval.Turns, Tools: kb.Len(), Limit: c.Limit, TopK: c.TopK, Mode: c.Mode}
			scores := map[string][]memtool.SessionScore{}
			for _, a := range agents {
				label, spec, named := strings.Cut(a, "=")
				var m llm.Model
				switch {
				case !named && a == "oracle":
					m = memtool.Oracle{Gold: gold, KB: kb, TopK: c.TopK}
				case !named && a == "never-removing":
					m = memtool.Oracle{Gold: gold, KB: kb, TopK: c.TopK, SkipRemoval: 1}
				case named && strings.HasPrefix(spec, "openai:"):
					if m, err = chatModel(cmd, cfg, strings.TrimPrefix(spec, "openai:"), "", dev); err != nil {
						return err
					}
				case named && spec != "":
					if m, err = chatModels(cmd, cfg, "", spec, dev, len(sessions)); err != nil {
						return fmt.Errorf("--agent %q: %w", a, err)
					}
				default:
					return fmt.Errorf("--agent %q: want oracle, never-removing, LABEL=DIR or LABEL=openai:MODEL", a)
				}
				if !named {
					label = a
				}
				if _, dup := scores[label]; dup {
					return fmt.Errorf("--agent %q: two agents are labelled %q", a, label)
				}
				fmt.Fprintf(cmd.ErrOrStderr(), "memtool eval: %s plays %d sessions\n", label, len(sessions))
				sc, err := memtool.Evaluate(ctx, memtool.EvalOptions{Config: c, KB: kb, Sessions: sessions, Agent: m, Judge: memtool.ContainsJudge{}, Parallel: len(sessions)})
				if closer, ok := m.(interface{ Close() }); ok {
					closer.Close()
				}
				if err != nil {
					return fmt.Errorf("%s: %w", label, err)
				}
				scores[label] = sc
				rep.Agents = append(rep.Agents, evalAgent{Name: label, Summary: memtool.Summarize(sc), Sessions: sc})
			}
			for _, d := range diffs {
				a, b, ok := strings.Cut(d, ",")
				if !ok || scores[a] == nil || scores[b] == nil {
					return fmt.Errorf("--diff %q: want A,B, two of the agents' labels", d)
				}
				st, err := memtool.Paired(scores[a], scores[b])
				if err != nil {
					return err
				}
				rep.Diffs = append(rep.Diffs, evalDiff{From: a, To: b, Stats: st})
			}
			printEval(cmd.OutOrStdout(), rep)
			if out == "" {
				return nil
			}
			b, err := json.MarshalIndent(rep, "", " ")
			if err != nil {
				return err
			}
			if err := os.MkdirAll(filepath.Dir(out), 0o755); err != nil {
				return err
			}
			return os.WriteFile(out, b, 0o644)
		},
	}
	cmd.Flags().StringArrayVar(&agents, "agent", nil, "an agent: oracle, never-removing, LABEL=DIR or LABEL=openai:MODEL (repeatable)")
	cmd.Flags().StringArrayVar(&diffs, "diff", nil, "A,B: print the paired difference B − A of two agents' labels (repeatable)")
	cmd.Flags().StringVar(&out, "out", "", "write the report (every session's scores) as JSON to this file")
	cmd.Flags().StringVar(&dev, "device", "auto", "the native models' device")
	return cmd
}

type evalReport struct {
	Queries  string      `json:"queries"`
	Sessions int         `json:"sessions"`
	Turns    int         `json:"turns"`
	Tools    int         `json:"tools"`
	Limit    int         `json:"limit"`
	TopK     int         `json:"top_k"`
	Mode     string      `json:"mode"`
	Agents   []evalAgent `json:"agents"`
	Diffs    []evalDiff  `json:"diffs,omitempty"`
}

type evalAgent struct {
	Name     string                 `json:"name"`
	Summary  []memtool.Stat         `json:"summary"` // in memtool.EvalMeasures' order
	Sessions []memtool.SessionScore `json:"sessions"`
}

type evalDiff struct {
	From  string         `json:"from"`
	To    string         `json:"to"`
	Stats []memtool.Stat `json:"stats"`
}

func printEval(w io.Writer, rep evalReport) {
	fmt.Fprintf(w, "held-out: %d sessions of %d queries (%s), %d tools, %s mode, L = %d, top-%d per keyword\n",
		rep.Sessions, rep.Turns, rep.Queries, rep.Tools, rep.Mode, rep.Limit, rep.TopK)
	width := len("after − before")
	for _, a := range rep.Agents {
		width = max(width, len(a.Name))
	}
	for _, d := range rep.Diffs {
		width = max(width, len(d.To)+len(d.From)+3)
	}
	fmt.Fprintf(w, "%-*s", width+2, "agent")
	for _, m := range memtool.EvalMeasures {
		fmt.Fprintf(w, " %-16s", m.Name)
	}
	fmt.Fprintln(w)
	row := func(name string, st []memtool.Stat, sign bool) {
		fmt.Fprintf(w, "%-*s", width+2, name)
		for i, s := range st {
			prec := 3
			if memtool.EvalMeasures[i].Name == "Resid3T" {
				prec = 2
			}
			v := fmtMetric(s.Mean, prec)
			if sign && !math.IsNaN(s.Mean) {
				v = fmt.Sprintf("%+.*f", prec, s.Mean)
			}
			fmt.Fprintf(w, " %-16s", v+" ± "+fmtMetric(s.SE, prec))
		}
		fmt.Fprintln(w)
	}
	for _, a := range rep.Agents {
		row(a.Name, a.Summary, false)
	}
	for _, d := range rep.Diffs {
		row(d.To+" − "+d.From, d.Stats, true)
	}
}

func memtoolAgentCmd(g *globals) *cobra.Command {
	var prompts []string
	var url, model, native, dev string
	var headers []string
	cmd := &cobra.Command{
		Use:   "agent",
		Short: "Play user queries against a MemTool gateway (serve's /mcp/tools) with a policy, as memtool train trained it",
		Long: `Connects to MemTool's tool gateway (serve with serve.tool_gateway: true serves
it at /mcp/tools; the working set lives there, one per API key) and plays
each --prompt in order as one session in the Autonomous mode: the policy
(--native DIR, greedy, or --model on openai.base_url) reads the system
message memtool train's rollouts show it (memtool.prompt, memtool.limit,
memtool.date and the tool count), the gateway's meta-tools and working set
by name, and the same results, so a policy GRPO taught to prune prunes the
gateway's working set. memtool.max_steps model calls a query;
memtool.history_turns earlier queries are shown. Prints each query's trace.`,
		Example: `  agemem-train memtool agent --config configs/memtool.yaml --native runs/memtool/rl/policy \
    --url http://127.0.0.1:8080/mcp/tools --header "Authorization=Bearer $KEY" \
    --prompt "What is the revenue of Acme Corp?" --prompt "And the stock price of Bolt Foods?"`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg, err := g.load()
			if err != nil {
				return err
			}
			if url == "" || len(prompts) == 0 {
				return fmt.Errorf("--url and at least one --prompt are required")
			}
			hdr := map[string]string{}
			for _, h := range headers {
				k, v, ok := strings.Cut(h, "=")
				if !ok || k == "" {
					return fmt.Errorf("--header %q: want NAME=VALUE", h)
				}
				hdr[k] = v
			}
			m, err := chatModel(cmd, cfg, model, native, dev)
			if err != nil {
				return err
			}
			ctx := cmd.Context()
			mc, err := agent.ConnectMCP(ctx, agent.MCPServer{Name: "gateway", URL: url, Headers: hdr})
			if err != nil {
				return err
			}
			defer mc.Close()
			c := cfg.MemTool
			c.Mode = memtool.Autonomous
			s := &memtool.GatewaySession{Config: c, Agent: m, Client: mc}
			for i, p := range prompts {
				tr, err := s.Turn(ctx, p)
				fmt.Fprintf(cmd.OutOrStdout(), "query %d: %s\n", i+1, p)
				var names []string
				for _, st := range tr.Steps {
					for _, r := range st.Results {
						names = append(names, r.Call.Name)
					}
				}
				printAgentTrace(cmd.OutOrStdout(), names, tr)
				if err != nil {
					return err
				}
			}
			return nil
		},
	}
	cmd.Flags().StringArrayVar(&prompts, "prompt", nil, "a user query (repeatable: one session, in order)")
	cmd.Flags().StringVar(&url, "url", "", "the gateway's streamable HTTP endpoint, e.g. http://127.0.0.1:8080/mcp/tools")
	cmd.Flags().StringArrayVar(&headers, "header", nil, "NAME=VALUE sent with every request, e.g. the API key (repeatable)")
	cmd.Flags().StringVar(&model, "model", "", "the policy on openai.base_url (default openai.model)")
	cmd.Flags().StringVar(&native, "native", "", "a local checkpoint, run by the built-in engine (greedy)")
	cmd.Flags().StringVar(&dev, "device", "auto", "the --native model's device")
	return cmd
}
