package main

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/mattn/go-isatty"
	"github.com/spf13/cobra"

	"github.com/agemem/agemem/agent"
	"github.com/agemem/agemem/bench/toolret"
	"github.com/agemem/agemem/internal/chart"
	"github.com/agemem/agemem/model/train"
	"github.com/agemem/agemem/papers/fittext"
	"github.com/agemem/agemem/setup"
)

func toolsRetrieveCmd(g *globals) *cobra.Command {
	var strategies, data, corpus, stb, model, refineModel, native, dev, out, runPath, qrelsPath string
	var k, first, parallel int
	cmd := &cobra.Command{
		Use:   "retrieve",
		Short: "FitText: retrieve tools for queries with each strategy and measure the rankings",
		Long: `Runs FitText's strategies (fittext section) on a retrieval dataset and prints
NDCG@k, Precision@k, Recall@k and Comprehensiveness@k (×100, as the paper's
tables) per strategy and subset, and over all queries:
  query        the user's query (the static baseline; no model)
  single       the model's pseudo-tool descriptions, retrieved once
  ibi          all refined together T times against everything retrieved
               (fittext.turns; fittext.ibi_judge may stop it early)
  dbd          each refined T times against what it retrieves (fittext.turns)
  scattershot  S probes sampled from each, voted on (fittext.scatter)
  memetic      a population evolved by crossover, mutation and refinement,
               with a memory of what was tried (fittext.population, .generations)
  memetic-v2   the paper's extension: a judge's score and crowding in the
               fitness, annealed temperatures, tournaments, guided mutation
               (fittext.memetic_v2)
Data: ToolRet's layout (--data queries, --corpus tools; JSON list or JSONL)
or StableToolBench's solvable_queries (--stb FILE: the corpus is every API
of the api_lists). The knowledge base is indexed with embed.backend. The
model writes the pseudo-tools: --native DIR (the built-in engine) or
--model on openai.base_url (--refine-model for every other call, as the
paper pairs GPT-4.1 with GPT-4.1-mini). --out writes report.json (the table
and each query's ranking) and retrieval.png; --run writes the rankings as a
TREC run file (tag = strategy; with several strategies, one file each:
run.query.txt, run.memetic.txt) and --qrels the judgments, for tools score.`,
		Example: `  agemem-train tools synth --out data/fittext
  agemem-train tools retrieve --data data/fittext/queries.jsonl --corpus data/fittext/tools.jsonl --strategy query
  agemem-train tools retrieve --data data/fittext/queries.jsonl --corpus data/fittext/tools.jsonl \
    --strategy query,single,memetic --native runs/tiny/rl/policy --out runs/fittext
  agemem-train tools retrieve --stb G1_instruction.json --strategy query,dbd,memetic \
    --set openai.base_url=http://127.0.0.1:11434/v1 --model qwen3:4b --run run.txt`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg, err := g.load()
			if err != nil {
				return err
			}
			switch {
			case parallel < 1:
				return fmt.Errorf("--parallel %d: run at least one query at a time", parallel)
			case k < 0:
				return fmt.Errorf("--k %d: want a cutoff of 1 or more (0: fittext.k)", k)
			case first < 0:
				return fmt.Errorf("--first %d: want 0 (every query) or more", first)
			}
			ss := strings.Split(strategies, ",")
			needModel := false
			for i, s := range ss {
				ss[i] = strings.TrimSpace(s)
				if err := fittext.CheckStrategy(ss[i]); err != nil {
					return fmt.Errorf("--strategy: %w", err)
				}
				if slices.Contains(ss[:i], ss[i]) {
					return fmt.Errorf("--strategy: %s is named twice", ss[i])
				}
				needModel = needModel || ss[i] != "query"
			}
			var ds toolret.Dataset
			switch {
			case stb != "" && data == "":
				ds, err = toolret.LoadStableToolBench(stb)
			case data != "" && corpus != "" && stb == "":
				ds, err = toolret.LoadToolRet(data, corpus)
			default:
				return fmt.Errorf("give --data and --corpus (ToolRet's layout) or --stb (StableToolBench's)")
			}
			if err != nil {
				return err
			}
			if first > 0 && first < len(ds.Queries) {
				ds.Queries = ds.Queries[:first]
			}
			ctx := cmd.Context()
			emb, err := setup.Embedder(ctx, cfg)
			if err != nil {
				return err
			}
			kb, err := agent.NewCatalog(ctx, emb, ds.Tools)
			if err != nil {
				return err
			}
			kb.UseDevice(setup.IndexDevice(cfg))
			fc := cfg.FitText
			if k > 0 {
				fc.K = k
			}
			r := &fittext.Retriever{Config: fc, KB: kb, Seed: uint64(cfg.Seed)}
			if needModel {
				if native == "" && model == "" && cfg.OpenAI.Model == "" {
					return fmt.Errorf("strategies other than query need a model: --native DIR or --model (openai.base_url)")
				}
				m, err := chatModels(cmd, cfg, model, native, dev, parallel)
				if err != nil {
					return err
				}
				r.LLM = &fittext.ModelLLM{Model: m}
				if refineModel != "" {
					rm, err := chatModel(cmd, cfg, refineModel, "", dev)
					if err != nil {
						return err
					}
					r.Refiner = &fittext.ModelLLM{Model: rm}
				}
			}
			pr := train.NewProgress(cmd.ErrOrStderr(), len(ss)*len(ds.Queries), isatty.IsTerminal(os.Stderr.Fd()))
			done := 0
			ev, err := fittext.Evaluate(ctx, r, ds, ss, fc.K, parallel, func(s string, _, _ int) { done++; pr.Update(done, s) })
			if err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "%d tools, %d queries, embed.backend %s\n", len(ds.Tools), len(ds.Queries), cfg.Embed.Backend)
			fittext.WriteTable(cmd.OutOrStdout(), ev.Rows)
			if runPath != "" {
				for _, s := range ss {
					if err := writeRunFile(runFileFor(runPath, s, len(ss)), ev.Runs[s], s); err != nil {
						return err
					}
				}
			}
			if qrelsPath != "" {
				qr := map[string]toolret.Qrels{}
				for _, q := range ds.Queries {
					qr[q.ID] = q.Gold
				}
				f, err := create(qrelsPath)
				if err != nil {
					return err
				}
				if err := toolret.WriteQrels(f, qr); err != nil {
					f.Close()
					return err
				}
				if err := f.Close(); err != nil {
					return err
				}
			}
			if out != "" {
				return writeRetrieval(out, ev, ss)
			}
			return nil
		},
	}
	cmd.Flags().StringVar(&strategies, "strategy", "query", "strategies, comma-separated: "+strings.Join(fittext.Strategies, ", "))
	cmd.Flags().StringVar(&data, "data", "", "ToolRet-layout queries (JSON list or JSONL)")
	cmd.Flags().StringVar(&corpus, "corpus", "", "ToolRet-layout tool corpus (JSON list or JSONL)")
	cmd.Flags().StringVar(&stb, "stb", "", "a StableToolBench solvable_queries file")
	cmd.Flags().IntVar(&k, "k", 0, "cutoff and RET's top-k (default fittext.k)")
	cmd.Flags().IntVar(&first, "first", 0, "only the first N queries")
	cmd.Flags().IntVar(&parallel, "parallel", 8, "queries run at once (their model calls batch on the native engine)")
	cmd.Flags().StringVar(&model, "model", "", "the model on openai.base_url that writes the pseudo-tools (default openai.model)")
	cmd.Flags().StringVar(&refineModel, "refine-model", "", "a model on openai.base_url for every call but the first")
	cmd.Flags().StringVar(&native, "native", "", "a local Qwen checkpoint instead of a server")
	cmd.Flags().StringVar(&dev, "device", "auto", "the --native model's device")
	cmd.Flags().StringVar(&out, "out", "", "directory for report.json and retrieval.png")
	cmd.Flags().StringVar(&runPath, "run", "", "write the rankings as a TREC run file (one per strategy: FILE.<strategy>.ext when several)")
	cmd.Flags().StringVar(&qrelsPath, "qrels", "", "write the judgments as TREC qrels (for tools score)")
	return cmd
}

func toolsSynthCmd() *cobra.Command {
	var out string
	var seed uint64
	var providers, queries int
	cmd := &cobra.Command{
		Use:   "synth",
		Short: "Generate a tool-retrieval dataset in ToolRet's layout, with the semantic gap",
		Long: `Writes DIR/tools.jsonl (id, documentation) and DIR/queries.jsonl (id, query,
subset, labels as ToolRet stores them): fictional providers each offering
most of 24 capabilities in three subsets (web, code, customized); tools are
described in a database's words, queries state a goal in a user's and name
the provider, whose other tools (and the other providers' same tool) are
the distractors.`,
		Example: `  agemem-train tools synth --out data/fittext`,
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, q, err := fittext.Synth(seed, providers, queries)
			if err != nil {
				return err
			}
			if err := os.MkdirAll(out, 0o755); err != nil {
				return err
			}
			if err := os.WriteFile(filepath.Join(out, "tools.jsonl"), c, 0o644); err != nil {
				return err
			}
			if err := os.WriteFile(filepath.Join(out, "queries.jsonl"), q, 0o644); err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "wrote %d tools and %d queries to %s\n", strings.Count(string(c), "\n"), queries, out)
			return nil
		},
	}
	cmd.Flags().StringVar(&out, "out", "data/fittext", "directory")
	cmd.Flags().Uint64Var(&seed, "seed", 1, "generator seed")
	cmd.Flags().IntVar(&providers, "providers", 40, "providers (at most 80)")
	cmd.Flags().IntVar(&queries, "queries", 300, "queries")
	return cmd
}

// runFileFor is where strategy s's run goes: path itself for one
// strategy, else path with the strategy before its extension (a run file
// lists a tool once per query, so strategies cannot share one).
func runFileFor(path, s string, n int) string {
	if n == 1 {
		return path
	}
	ext := filepath.Ext(path)
	return strings.TrimSuffix(path, ext) + "." + s + ext
}

// create makes path's directory and the file.
func create(path string) (*os.File, error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return nil, err
	}
	return os.Create(path)
}

// writeFile writes b to path, making its directory.
func writeFile(path string, b []byte) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	return os.WriteFile(path, b, 0o644)
}

func writeRunFile(path string, runs map[string]toolret.Run, tag string) error {
	f, err := create(path)
	if err != nil {
		return err
	}
	if err := toolret.WriteRun(f, runs, tag); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

func writeRetrieval(dir string, ev fittext.Evaluation, strategies []string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	names, ranks := fittext.AvgRank(ev.Rows)
	avg := map[string]float64{}
	for i, n := range names {
		avg[n] = ranks[i]
	}
	b, err := json.MarshalIndent(map[string]any{"rows": ev.Rows, "avg_rank": avg, "results": ev.Results}, "", "  ")
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "report.json"), b, 0o644); err != nil {
		return err
	}
	var rows []string
	var vals [][]float64
	for _, s := range strategies {
		for _, r := range ev.Rows {
			if r.Strategy == s && r.Subset == "all" {
				rows = append(rows, s)
				m := r.Metrics
				vals = append(vals, []float64{100 * m.NDCG, 100 * m.Precision, 100 * m.Recall, 100 * m.Comprehensiveness})
			}
		}
	}
	k := ev.Rows[0].K
	return chart.Bars(filepath.Join(dir, "retrieval.png"), "FitText: tool retrieval over all queries", "×100", rows,
		[]string{fmt.Sprintf("NDCG@%d", k), fmt.Sprintf("P@%d", k), fmt.Sprintf("R@%d", k), fmt.Sprintf("C@%d", k)}, vals, nil)
}
