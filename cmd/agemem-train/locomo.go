package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"

	"github.com/mattn/go-isatty"
	"github.com/spf13/cobra"

	"github.com/agemem/agemem/bench/locomo"
	"github.com/agemem/agemem/embed"
	"github.com/agemem/agemem/env"
	"github.com/agemem/agemem/llm"
	"github.com/agemem/agemem/memtools/stm"
	"github.com/agemem/agemem/model/train"
	"github.com/agemem/agemem/papers/tamem"
	"github.com/agemem/agemem/setup"
)

func locomoCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "locomo",
		Short: "LoCoMo: synthetic conversations in its format, and its QA scoring",
	}
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
				f, err := create(scores)
				if err != nil {
					return err
				}
				enc := json.NewEncoder(f)
				for _, s := range scored {
					enc.Encode(s)
				}
				if err := f.Close(); err != nil {
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
	cmd.AddCommand(synth, score, locomoRunCmd(g))
	return cmd
}

func locomoRunCmd(g *globals) *cobra.Command {
	var data, method, out, model, native, dev, dbPath string
	var k, parallel, chunk, window, budget int
	var retrievalOnly bool
	ch := chunking{Kind: "llm", Tokens: 512, Overlap: 0.25, Percentile: 8}
	cmd := &cobra.Command{
		Use:   "run",
		Short: "Answer LoCoMo's questions with a method and write predictions for score",
		Long: `Runs a method over every question of a LoCoMo file and writes predictions
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
TA-Mem: the model extracts each session's notes (one call a session) into
the multi-index database (--db, SQLite; kept and reused when a file), then
answers each question by querying it with the ten tools (at most 7 turns);
the predictions' context is the dialogue of the pages it retrieved. agemem
plays the conversation through AgeMem's memory runtime: each session's
turns, --chunk at a time, are user messages the policy may store from (the
context reset at each session), then each question is asked in a fresh
context where the policy retrieves and answers (--native DIR, --model NAME
on openai.base_url in openai.format, or --model ollama:NAME).

--chunking is TA-Mem's chunking ablation: llm (the extraction agent
segments each session itself, the paper's method), fixed (chunks of
--chunk-tokens words overlapping by --chunk-overlap, the paper's 512 and
25%) or semantic (split where neighbouring messages' similarity falls below
--split-percentile of the session's, the paper's 8th); each chunk is then
extracted into one note. A database keeps each chunking's pages apart.`,
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
			if data == "" || out == "" {
				return fmt.Errorf("--data and --out are required")
			}
			// The predictions are written after the run: their directory
			// is made now, so a run does not end unable to save.
			if err := os.MkdirAll(filepath.Dir(out), 0o755); err != nil {
				return err
			}
			if method != "rag" && method != "full-context" && method != "ta-mem" && method != "agemem" {
				return fmt.Errorf("--method %q: want rag, full-context, ta-mem or agemem", method)
			}
			if retrievalOnly && method != "rag" && method != "ta-mem" {
				return fmt.Errorf("--retrieval-only measures a retriever: use it with --method rag or ta-mem")
			}
			if cmd.Flags().Changed("chunking") && (method != "ta-mem" || retrievalOnly) {
				return fmt.Errorf("--chunking is TA-Mem's extraction: use it with --method ta-mem and a model")
			}
			if _, _, err := ch.extractor(nil, nil); err != nil {
				return err
			}
			for _, f := range []struct {
				name string
				v    int
			}{{"--k", k}, {"--chunk", chunk}, {"--parallel", parallel}, {"--window", window}, {"--max-turns", budget}} {
				if f.v < 1 {
					return fmt.Errorf("%s %d: want at least 1", f.name, f.v)
				}
			}
			samples, err := locomo.Load(data)
			if err != nil {
				return err
			}
			ctx := cmd.Context()
			var r locomo.Retriever
			switch {
			case method == "rag":
				emb, err := setup.Embedder(ctx, cfg)
				if err != nil {
					return err
				}
				r = &locomo.RAG{Embedder: emb}
			case method == "ta-mem" && retrievalOnly:
				emb, err := setup.Embedder(ctx, cfg)
				if err != nil {
					return err
				}
				db, err := tamem.Open(dbPath, emb)
				if err != nil {
					return err
				}
				defer db.Close()
				r = taMemRetriever{db: db, window: window}
			}
			var preds []locomo.Prediction
			if retrievalOnly {
				preds, err = locomo.RetrievalPredictions(ctx, samples, r, k)
			} else if method == "agemem" {
				preds, err = ageMem(cmd, cfg, samples, model, native, dev, chunk)
			} else {
				var m llm.Model
				if m, err = chatModels(cmd, cfg, model, native, dev, parallel); err != nil {
					return err
				}
				total := 0
				for _, s := range samples {
					total += len(s.QA)
				}
				pr := train.NewProgress(cmd.ErrOrStderr(), total, isatty.IsTerminal(os.Stderr.Fd()))
				if method == "ta-mem" {
					preds, err = taMem(cmd, cfg, m, samples, dbPath, ch, budget, parallel, func(done int) { pr.Update(done, method) })
				} else {
					preds, err = locomo.Answer(ctx, m, samples, r, k, func(done, _ int) { pr.Update(done, method) })
				}
			}
			if err != nil {
				return err
			}
			f, err := create(out)
			if err != nil {
				return err
			}
			enc := json.NewEncoder(f)
			for _, p := range preds {
				enc.Encode(p)
			}
			if err := f.Close(); err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "wrote %d predictions to %s\n", len(preds), out)
			return nil
		},
	}
	cmd.Flags().StringVar(&data, "data", "", "the LoCoMo file")
	cmd.Flags().StringVar(&method, "method", "rag", "rag, full-context, ta-mem or agemem")
	cmd.Flags().IntVar(&chunk, "chunk", 4, "agemem: dialogue turns a user message carries")
	cmd.Flags().IntVar(&parallel, "parallel", 4, "ta-mem: questions answered at once (on the native engine their calls decode together)")
	cmd.Flags().StringVar(&dbPath, "db", ":memory:", "ta-mem: the memory database (SQLite); a conversation it already holds is not extracted again")
	cmd.Flags().IntVar(&k, "k", 5, "turns retrieved per question (rag; ta-mem with --retrieval-only)")
	cmd.Flags().IntVar(&window, "window", 1, "ta-mem --retrieval-only: messages a page holds (pages are fixed windows, no model extracts notes)")
	cmd.Flags().IntVar(&budget, "max-turns", tamem.MaxTurns, "ta-mem: the retrieval agent's tool-calling turns a question (the paper's 7; its Figure 3 sweeps 1 and up)")
	cmd.Flags().StringVar(&ch.Kind, "chunking", ch.Kind, "ta-mem: llm (the agent segments), fixed or semantic (the chunking ablation)")
	cmd.Flags().IntVar(&ch.Tokens, "chunk-tokens", ch.Tokens, "ta-mem --chunking fixed: words a chunk holds")
	cmd.Flags().Float64Var(&ch.Overlap, "chunk-overlap", ch.Overlap, "ta-mem --chunking fixed: the share of a chunk the next repeats")
	cmd.Flags().Float64Var(&ch.Percentile, "split-percentile", ch.Percentile, "ta-mem --chunking semantic: split below this percentile of neighbour similarity")
	cmd.Flags().BoolVar(&retrievalOnly, "retrieval-only", false, "no model: write the retrieved turns only (evidence recall@k)")
	cmd.Flags().StringVar(&out, "out", "", "predictions JSONL to write")
	cmd.Flags().StringVar(&model, "model", "", "the model on the OpenAI-compatible server (default openai.model), or ollama:NAME (Ollama, native tools)")
	cmd.Flags().StringVar(&native, "native", "", "a local Qwen checkpoint directory instead of a server")
	cmd.Flags().StringVar(&dev, "device", "auto", "the --native model's device")
	return cmd
}

// conversation is a LoCoMo sample as TA-Mem's constructor reads it.
func conversation(s locomo.Sample) tamem.Conversation {
	c := tamem.Conversation{ID: s.ID, SpeakerA: s.SpeakerA, SpeakerB: s.SpeakerB}
	for _, ses := range s.Sessions {
		st := tamem.SessionText{N: ses.N, Date: ses.DateTime}
		for _, t := range ses.Turns {
			text := t.Text
			if t.BlipCaption != "" {
				text += " [shares a photo: " + t.BlipCaption + "]"
			}
			st.Lines = append(st.Lines, tamem.Line{DiaID: t.DiaID, Speaker: t.Speaker, Text: text})
		}
		c.Sessions = append(c.Sessions, st)
	}
	return c
}

// taMemRetriever is TA-Mem's database with no model: each conversation
// stored by tamem.Windows, each question answered by the database's fixed
// query plan (tamem.DB.Retrieve).
type taMemRetriever struct {
	db     *tamem.DB
	window int
}

func (r taMemRetriever) Retrieve(ctx context.Context, s locomo.Sample, question string, k int) ([]string, error) {
	if _, err := r.db.Build(ctx, tamem.Windows(r.window), conversation(s), nil); err != nil {
		return nil, err
	}
	return r.db.Retrieve(ctx, s.ID, question, k)
}

// taMem builds each conversation's TA-Mem database and answers its
// questions with the retrieval agent.
// chunking is TA-Mem's chunking ablation: llm (the agent segments each
// session itself), fixed (Tokens-word chunks overlapping by Overlap) or
// semantic (split below the Percentile of neighbour similarity).
type chunking struct {
	Kind                string
	Tokens              int
	Overlap, Percentile float64
}

// extractor is the chunking's extractor on m, and the suffix its pages'
// namespace gets (a database keeps each chunking's pages apart).
func (c chunking) extractor(m llm.Model, emb embed.Embedder) (tamem.Extractor, string, error) {
	switch c.Kind {
	case "llm":
		return tamem.ModelExtractor(m), "", nil
	case "fixed":
		if c.Tokens < 1 || c.Overlap < 0 || c.Overlap >= 1 {
			return nil, "", fmt.Errorf("--chunk-tokens %d, --chunk-overlap %g: want at least 1 token and an overlap in [0, 1)", c.Tokens, c.Overlap)
		}
		return tamem.ChunkExtractor(m, tamem.FixedChunks(c.Tokens, c.Overlap, tamem.Words)), fmt.Sprintf("/fixed-%d-%g", c.Tokens, c.Overlap), nil
	case "semantic":
		if !(c.Percentile >= 0 && c.Percentile <= 100) {
			return nil, "", fmt.Errorf("--split-percentile %g: want a percentile in [0, 100]", c.Percentile)
		}
		return tamem.ChunkExtractor(m, tamem.SemanticChunks(emb, c.Percentile)), fmt.Sprintf("/semantic-%g", c.Percentile), nil
	}
	return nil, "", fmt.Errorf("--chunking %q: want llm, fixed or semantic", c.Kind)
}

func taMem(cmd *cobra.Command, cfg setup.Config, m llm.Model, samples []locomo.Sample, dbPath string, ch chunking, budget, parallel int, progress func(int)) ([]locomo.Prediction, error) {
	ctx := cmd.Context()
	emb, err := setup.Embedder(ctx, cfg)
	if err != nil {
		return nil, err
	}
	extract, suffix, err := ch.extractor(m, emb)
	if err != nil {
		return nil, err
	}
	db, err := tamem.Open(dbPath, emb)
	if err != nil {
		return nil, err
	}
	defer db.Close()
	var preds []locomo.Prediction
	var turns, finalized, failed, tooLong int
	for _, s := range samples {
		c := conversation(s)
		c.ID += suffix
		f, err := db.Build(ctx, extract, c, func(msg string) { fmt.Fprintln(cmd.ErrOrStderr(), msg) })
		if err != nil {
			return nil, fmt.Errorf("%s: %w", s.ID, err)
		}
		failed += f
		// The questions of a conversation are independent: answered
		// parallel at a time, kept in order.
		answers := make([]tamem.Answered, len(s.QA))
		errs := make([]error, len(s.QA))
		next := make(chan int)
		var wg sync.WaitGroup
		var mu sync.Mutex
		done := len(preds)
		for range max(parallel, 1) {
			wg.Go(func() {
				for i := range next {
					answers[i], errs[i] = db.Answer(ctx, m, c.ID, s.SpeakerA, s.SpeakerB, s.QA[i].Question, budget)
					mu.Lock()
					done++
					progress(done)
					mu.Unlock()
				}
			})
		}
		for i := range s.QA {
			next <- i
		}
		close(next)
		wg.Wait()
		for i, a := range answers {
			err := errs[i]
			if errors.Is(err, llm.ErrContextFull) {
				// The question's prompt outgrew the model: unanswered, as
				// an evaluation of many questions should go on.
				tooLong++
				err = nil
			}
			if err != nil {
				return nil, fmt.Errorf("%s qa %d: %w", s.ID, i, err)
			}
			turns += a.Turns
			if a.Finalized {
				finalized++
			}
			preds = append(preds, locomo.Prediction{SampleID: s.ID, QAIndex: i, Prediction: a.Answer, Context: a.Context,
				Tools: a.Tools, Turns: a.Turns, Tokens: a.Tokens})
		}
	}
	if len(preds) > 0 {
		fmt.Fprintf(cmd.ErrOrStderr(), "ta-mem: %.2f turns a question, %.1f%% finalized within %d turns, %d session(s) stored whole after a failed extraction, %d question(s) unanswered: the prompt outgrew the model\n",
			float64(turns)/float64(len(preds)), 100*float64(finalized)/float64(len(preds)), budget, failed, tooLong)
	}
	return preds, nil
}

// ageMem answers with an AgeMem policy on the memory runtime.
func ageMem(cmd *cobra.Command, cfg setup.Config, samples []locomo.Sample, model, dir, dev string, chunk int) ([]locomo.Prediction, error) {
	ctx := cmd.Context()
	var p llm.Model
	var tok stm.Tokenizer
	switch name, isOllama := strings.CutPrefix(model, "ollama:"); {
	case dir != "":
		e, err := nativeEngine(cmd, cfg, dir, dev, 1)
		if err != nil {
			return nil, err
		}
		p, tok = e, e.Tokenizer()
	case isOllama:
		pol, _, err := setup.OllamaPolicy(ctx, cfg, name)
		if err != nil {
			return nil, err
		}
		p = pol
	default:
		if model == "" {
			model = cfg.OpenAI.Model
		}
		if model == "" {
			return nil, fmt.Errorf("--method agemem: name the policy with --native DIR, --model NAME (openai.base_url) or --model ollama:NAME")
		}
		pol, err := setup.OpenAIPolicy(cfg, model, llm.Sampling{Temperature: 1, TopP: 1, MaxTokens: cfg.Agent.ResponseBudget})
		if err != nil {
			return nil, err
		}
		p = pol
	}
	h, err := setup.NewHelpers(ctx, cfg)
	if err != nil {
		return nil, err
	}
	a := env.LoCoMo{NewRuntime: setup.Runtime(cfg, h, tok), System: cfg.Agent.Prompt(cfg.Tools.Offered()), Limits: cfg.Agent.Limits(), Chunk: chunk}
	total := 0
	for _, s := range samples {
		total += len(s.QA)
	}
	pr := train.NewProgress(cmd.ErrOrStderr(), total, isatty.IsTerminal(os.Stderr.Fd()))
	var preds []locomo.Prediction
	done := 0
	for i, s := range samples {
		ps, err := a.Answer(ctx, p, s, uint64(cfg.Seed)+uint64(i), func() { done++; pr.Update(done, "agemem") })
		if err != nil {
			return nil, err
		}
		preds = append(preds, ps...)
	}
	return preds, nil
}
