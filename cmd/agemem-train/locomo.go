package main

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"

	"github.com/mattn/go-isatty"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/agemem/agemem/bench/locomo"
	"github.com/agemem/agemem/model/train"
	"github.com/agemem/agemem/setup"
)

func locomoCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "locomo",
		Short: "LoCoMo: synthetic conversations in its format, and its QA scoring",
	}
	cmd.AddCommand(locomoSynthCmd(), locomoScoreCmd(), locomoRunCmd(g))
	return cmd
}

func locomoSynthCmd() *cobra.Command {
	var samples, sessions int
	var seed uint64
	var out string
	synth := &cobra.Command{
		Use:   "synth",
		Short: "Write synthetic conversations in locomo10.json's layout",
		Long: `Writes conversations between two speakers over dated sessions, with
questions of all five LoCoMo categories and their evidence dialogue ids, in
exactly the layout of LoCoMo's locomo10.json, for tests and demos; every
locomo command reads the real file the same way.`,
		Example: `  agemem-train locomo synth --samples 10 --sessions 8 --out data/locomo-synth.json`,
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if out == "" {
				return fmt.Errorf("--out is required")
			}
			if samples < 1 || sessions < 1 {
				return fmt.Errorf("--samples and --sessions must be at least 1")
			}
			raw, err := locomo.Synth(samples, sessions, seed)
			if err != nil {
				return err
			}
			return writeFile(out, raw)
		},
	}
	synth.Flags().IntVar(&samples, "samples", 10, "conversations")
	synth.Flags().IntVar(&sessions, "sessions", 8, "sessions per conversation")
	synth.Flags().Uint64Var(&seed, "seed", 1, "generator seed")
	synth.Flags().StringVar(&out, "out", "", "the JSON file to write")
	return synth
}

func locomoScoreCmd() *cobra.Command {
	var data, predictions, scores string
	var asJSON bool
	score := &cobra.Command{
		Use:   "score",
		Short: "Score predictions as LoCoMo's evaluation does",
		Long: `Scores predictions (JSONL: {"sample_id", "qa_index", "prediction",
"context"?: [dia_id or "S<n>"]}) against a LoCoMo file as LoCoMo's own
evaluation does: answers normalised (commas, case, punctuation, a/an/the/and),
Porter-stemmed (NLTK's stemmer) token F1; multi-hop answers split on commas;
open-domain answers up to their first ';'; adversarial questions correct
when the prediction says "no information available" or "not mentioned";
evidence recall of the context. Prints F1 per category and overall; --out
writes each question's score as JSONL, --json the table.`,
		Example: `  agemem-train locomo score --data locomo10.json --predictions preds.jsonl --out scores.jsonl`,
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if data == "" || predictions == "" {
				return fmt.Errorf("--data and --predictions are required")
			}
			ss, err := locomo.Load(data)
			if err != nil {
				return err
			}
			ps, err := locomo.ReadPredictions(predictions)
			if err != nil {
				return err
			}
			rep, scored, err := locomo.Score(ss, ps)
			if err != nil {
				return fmt.Errorf("%s: %w", predictions, err)
			}
			if scores != "" {
				if err := writeJSONL(scores, scored); err != nil {
					return err
				}
			}
			if asJSON {
				return writeJSON(cmd.OutOrStdout(), rep)
			}
			rep.Print(cmd.OutOrStdout())
			return nil
		},
	}
	score.Flags().StringVar(&data, "data", "", "the LoCoMo file (locomo10.json or locomo synth's)")
	score.Flags().StringVar(&predictions, "predictions", "", "predictions JSONL")
	score.Flags().StringVar(&scores, "out", "", "write each question's score here (JSONL)")
	score.Flags().BoolVar(&asJSON, "json", false, "print the table as JSON")
	return score
}

const locomoRunLong = `Runs a method over every question of a LoCoMo file and writes predictions
JSONL for locomo score. Methods: rag (the k turns most similar to the
question by the configured embedder, embed.backend, then the model answers
from them) and full-context (the model reads the whole conversation).
--retrieval-only skips the model: the predictions carry only the retrieved
turns, and score reports their evidence recall@k. With ta-mem it measures
the multi-index database with no model: pages of --window messages (people,
capitalised keywords, each message a fact of its speaker) searched by a
fixed query plan (facts by similarity, the same per person the question
names, each keyword it contains; fused by reciprocal rank), k turns. The model is the
OpenAI-compatible server's (--model, openai.base_url) or a local checkpoint
(--native DIR); the prompt is LoCoMo's short-answer instruction. ta-mem is
TA-Mem (the tamem section): the model extracts each session's notes (one
call a session) into the multi-index database (--db, SQLite; kept and
reused when a file), then answers each question by querying it with the
ten tools (at most 7 turns); the predictions' context is the dialogue of
the pages it retrieved. agemem plays the conversation through AgeMem's
memory runtime: each session's turns, --chunk at a time, are user
messages the policy may store from (the context reset at each session),
then each question is asked in a fresh context where the policy retrieves
and answers (--native DIR, --model NAME on openai.base_url in
openai.format, or --model ollama:NAME).

--chunking is TA-Mem's chunking ablation: llm (the extraction agent
segments each session itself, the paper's method), fixed (chunks of
--chunk-tokens words overlapping by --chunk-overlap, the paper's 512 and
25%) or semantic (split where neighbouring messages' similarity falls below
--split-percentile of the session's, the paper's 8th); each chunk is then
extracted into one note. A database keeps each chunking's pages apart.

TA-Mem's options and --device are config keys (their flags' help names
them); a flag that is given wins over its key.`

func locomoRunCmd(g *globals) *cobra.Command {
	var data, out string
	var retrievalOnly bool
	r := setup.LoCoMoRun{}
	cmd := &cobra.Command{
		Use:   "run",
		Short: "Answer LoCoMo's questions with a method and write predictions for score",
		Long:  locomoRunLong,
		Example: `  agemem-train locomo run --data data/locomo-synth.json --method rag --k 5 --retrieval-only --out preds.jsonl
  agemem-train locomo run --data data/locomo-synth.json --method ta-mem --k 5 --retrieval-only --out preds.jsonl
  agemem-train locomo run --data locomo10.json --method rag --set openai.base_url=http://127.0.0.1:11434/v1 --model qwen3:4b --out preds.jsonl
  agemem-train locomo run --data locomo10.json --method ta-mem --db runs/tamem.db --set openai.base_url=http://127.0.0.1:11434/v1 --model qwen3:8b --out preds.jsonl`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg, err := g.load()
			if err != nil {
				return err
			}
			r.RetrievalOnly = retrievalOnly
			if err := checkLoCoMoRun(cmd.Flags(), r, data, out); err != nil {
				return err
			}
			// The predictions are written after the run: their directory
			// is made now, so a run does not end unable to save.
			if err := os.MkdirAll(filepath.Dir(out), 0o755); err != nil {
				return err
			}
			samples, err := locomo.Load(data)
			if err != nil {
				return err
			}
			if !retrievalOnly {
				total := 0
				for _, s := range samples {
					total += len(s.QA)
				}
				pr := train.NewProgress(cmd.ErrOrStderr(), total, isatty.IsTerminal(os.Stderr.Fd()))
				r.Progress = func(done int) { pr.Update(done, r.Method) }
			}
			preds, err := setup.LoCoMo(cmd.Context(), cfg, samples, r, cmd.ErrOrStderr())
			if err != nil {
				return err
			}
			if err := writeJSONL(out, preds); err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "wrote %d predictions to %s\n", len(preds), out)
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&data, "data", "", "the LoCoMo file")
	f.StringVar(&r.Method, "method", "rag", "rag, full-context, ta-mem or agemem")
	f.IntVar(&r.Chunk, "chunk", 4, "agemem: dialogue turns a user message carries")
	f.IntVar(&r.K, "k", 5, "turns retrieved per question (rag; ta-mem with --retrieval-only)")
	f.BoolVar(&retrievalOnly, "retrieval-only", false, "no model: write the retrieved turns only (evidence recall@k)")
	f.StringVar(&out, "out", "", "predictions JSONL to write")
	f.StringVar(&r.Models.Model, "model", "", "the model on the OpenAI-compatible server (default openai.model), or ollama:NAME (Ollama, native tools)")
	f.StringVar(&r.Models.Native, "native", "", "a local Qwen checkpoint directory instead of a server")
	g.Flag(f, "device", "model.device", "the --native model's device")
	g.Flag(f, "parallel", "tamem.parallel", "ta-mem: questions answered at once (on the native engine their calls decode together)")
	g.Flag(f, "db", "tamem.db", "ta-mem: the memory database (SQLite); a conversation it already holds is not extracted again")
	g.Flag(f, "window", "tamem.window", "ta-mem --retrieval-only: messages a page holds (pages are fixed windows, no model extracts notes)")
	g.Flag(f, "max-turns", "tamem.max_turns", "ta-mem: the retrieval agent's tool-calling turns a question (the paper's 7; its Figure 3 sweeps 1 and up)")
	g.Flag(f, "chunking", "tamem.chunking.kind", "ta-mem: llm (the agent segments), fixed or semantic (the chunking ablation)")
	g.Flag(f, "chunk-tokens", "tamem.chunking.tokens", "ta-mem --chunking fixed: words a chunk holds")
	g.Flag(f, "chunk-overlap", "tamem.chunking.overlap", "ta-mem --chunking fixed: the share of a chunk the next repeats")
	g.Flag(f, "split-percentile", "tamem.chunking.percentile", "ta-mem --chunking semantic: split below this percentile of neighbour similarity")
	return cmd
}

// checkLoCoMoRun refuses a run the command line cannot mean.
func checkLoCoMoRun(f *pflag.FlagSet, r setup.LoCoMoRun, data, out string) error {
	if data == "" || out == "" {
		return fmt.Errorf("--data and --out are required")
	}
	if r.Method != "rag" && r.Method != "full-context" && r.Method != "ta-mem" && r.Method != "agemem" {
		return fmt.Errorf("--method %q: want rag, full-context, ta-mem or agemem", r.Method)
	}
	if r.RetrievalOnly && r.Method != "rag" && r.Method != "ta-mem" {
		return fmt.Errorf("--retrieval-only measures a retriever: use it with --method rag or ta-mem")
	}
	if f.Changed("chunking") && (r.Method != "ta-mem" || r.RetrievalOnly) {
		return fmt.Errorf("--chunking is TA-Mem's extraction: use it with --method ta-mem and a model")
	}
	for _, c := range []struct {
		name string
		v    int
	}{{"--k", r.K}, {"--chunk", r.Chunk}} {
		if c.v < 1 {
			return fmt.Errorf("%s %d: want at least 1", c.name, c.v)
		}
	}
	return nil
}

// writeJSONL writes one JSON value a line to path.
func writeJSONL[T any](path string, vs []T) error {
	f, err := create(path)
	if err != nil {
		return err
	}
	enc := json.NewEncoder(f)
	for _, v := range vs {
		if err := enc.Encode(v); err != nil {
			f.Close()
			return err
		}
	}
	return f.Close()
}
