package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/mattn/go-isatty"
	"github.com/spf13/cobra"

	"github.com/agemem/agemem/bench/toolret"
	"github.com/agemem/agemem/model/train"
	"github.com/agemem/agemem/papers/fittext"
	"github.com/agemem/agemem/setup"
)

const toolsRetrieveLong = `Runs FitText's strategies (fittext section) on a retrieval dataset and prints
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
paper pairs GPT-4.1 with GPT-4.1-mini). --k is fittext.k. --out writes
report.json (the table and each query's ranking) and retrieval.png; --run
writes the rankings as a TREC run file (tag = strategy; with several
strategies, one file each: run.query.txt, run.memetic.txt) and --qrels the
judgments, for tools score.`

func toolsRetrieveCmd(g *globals) *cobra.Command {
	var strategies, data, corpus, stb, model, refineModel, native, out, runPath, qrelsPath string
	var first, parallel int
	cmd := &cobra.Command{
		Use:   "retrieve",
		Short: "FitText: retrieve tools for queries with each strategy and measure the rankings",
		Long:  toolsRetrieveLong,
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
			case first < 0:
				return fmt.Errorf("--first %d: want 0 (every query) or more", first)
			}
			ss, err := fittext.ParseStrategies(strategies)
			if err != nil {
				return fmt.Errorf("--strategy: %w", err)
			}
			ds, err := loadToolRet(data, corpus, stb)
			if err != nil {
				return err
			}
			if first > 0 && first < len(ds.Queries) {
				ds.Queries = ds.Queries[:first]
			}
			ctx := cmd.Context()
			r, err := setup.FitTextRetriever(ctx, cfg, ds, ss, setup.Models{Model: model, Native: native}, refineModel, parallel, cmd.ErrOrStderr())
			if err != nil {
				return err
			}
			pr := train.NewProgress(cmd.ErrOrStderr(), len(ss)*len(ds.Queries), isatty.IsTerminal(os.Stderr.Fd()))
			done := 0
			ev, err := fittext.Evaluate(ctx, r, ds, ss, cfg.FitText.K, parallel, func(s string, _, _ int) { done++; pr.Update(done, s) })
			if err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "%d tools, %d queries, embed.backend %s\n", len(ds.Tools), len(ds.Queries), cfg.Embed.Backend)
			fittext.WriteTable(cmd.OutOrStdout(), ev.Rows)
			return writeRetrieval(ev, ds, ss, runPath, qrelsPath, out)
		},
	}
	f := cmd.Flags()
	f.StringVar(&strategies, "strategy", "query", "strategies, comma-separated: "+strings.Join(fittext.Strategies, ", "))
	f.StringVar(&data, "data", "", "ToolRet-layout queries (JSON list or JSONL)")
	f.StringVar(&corpus, "corpus", "", "ToolRet-layout tool corpus (JSON list or JSONL)")
	f.StringVar(&stb, "stb", "", "a StableToolBench solvable_queries file")
	g.Flag(f, "k", "fittext.k", "cutoff and RET's top-k")
	f.IntVar(&first, "first", 0, "only the first N queries")
	f.IntVar(&parallel, "parallel", 8, "queries run at once (their model calls batch on the native engine)")
	f.StringVar(&model, "model", "", "the model on openai.base_url that writes the pseudo-tools (default openai.model)")
	f.StringVar(&refineModel, "refine-model", "", "a model on openai.base_url for every call but the first")
	f.StringVar(&native, "native", "", "a local Qwen checkpoint instead of a server")
	g.Flag(f, "device", "model.device", "the --native model's device")
	f.StringVar(&out, "out", "", "directory for report.json and retrieval.png")
	f.StringVar(&runPath, "run", "", "write the rankings as a TREC run file (one per strategy: FILE.<strategy>.ext when several)")
	f.StringVar(&qrelsPath, "qrels", "", "write the judgments as TREC qrels (for tools score)")
	return cmd
}

// loadToolRet reads ToolRet's layout (queries and corpus) or a
// StableToolBench file, whichever the flags name.
func loadToolRet(data, corpus, stb string) (toolret.Dataset, error) {
	switch {
	case stb != "" && data == "":
		return toolret.LoadStableToolBench(stb)
	case data != "" && corpus != "" && stb == "":
		return toolret.LoadToolRet(data, corpus)
	}
	return toolret.Dataset{}, fmt.Errorf("give --data and --corpus (ToolRet's layout) or --stb (StableToolBench's)")
}

// writeRetrieval writes what the flags ask for: the rankings as TREC run
// files, the judgments as TREC qrels, the report.
func writeRetrieval(ev fittext.Evaluation, ds toolret.Dataset, ss []string, runPath, qrelsPath, out string) error {
	if runPath != "" {
		if err := fittext.WriteRuns(runPath, ev, ss); err != nil {
			return err
		}
	}
	if qrelsPath != "" {
		f, err := create(qrelsPath)
		if err != nil {
			return err
		}
		if err := toolret.WriteQrels(f, ds.Qrels()); err != nil {
			f.Close()
			return err
		}
		if err := f.Close(); err != nil {
			return err
		}
	}
	if out != "" {
		return fittext.WriteReport(out, ev, ss)
	}
	return nil
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
