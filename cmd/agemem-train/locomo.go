package main

import (
	"encoding/json"
	"fmt"
	"os"

	"github.com/spf13/cobra"

	"github.com/agemem/agemem/locomo"
)

func locomoCmd() *cobra.Command {
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
			return os.WriteFile(out, raw, 0o644)
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
				f, err := os.Create(scores)
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
	cmd.AddCommand(synth, score)
	return cmd
}
