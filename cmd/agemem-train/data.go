package main

import (
	"fmt"
	"os"
	"path/filepath"

	"github.com/spf13/cobra"

	"github.com/agemem/agemem/env"
)

func dataCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "data",
		Short: "Make task data",
	}
	var n int
	var seed int64
	var out string
	synth := &cobra.Command{
		Use:   "synth",
		Short: "Generate synthetic two-hop questions in HotpotQA's JSON format",
		Long: `Generates bridge and comparison questions about fictional people, towns,
firms and bands. Each question has two supporting facts and four distractor
paragraphs that share names and words with the facts. The same seed gives
the same file.`,
		Example: "  agemem-train data synth --n 1000 --seed 1 --out data/synth.json",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if n < 1 {
				return fmt.Errorf("--n must be at least 1, got %d", n)
			}
			if dir := filepath.Dir(out); dir != "." {
				if err := os.MkdirAll(dir, 0o755); err != nil {
					return err
				}
			}
			f, err := os.Create(out)
			if err != nil {
				return err
			}
			if err := env.WriteHotpot(f, env.NewSynth(uint64(seed)).Generate(n)); err != nil {
				f.Close()
				return fmt.Errorf("write %s: %w", out, err)
			}
			if err := f.Close(); err != nil {
				return err
			}
			fmt.Fprintf(cmd.ErrOrStderr(), "wrote %d tasks to %s\n", n, out)
			return nil
		},
	}
	synth.Flags().IntVar(&n, "n", 1000, "number of questions")
	synth.Flags().Int64Var(&seed, "seed", 1, "random seed")
	synth.Flags().StringVar(&out, "out", "data/synth.json", "output file")
	cmd.AddCommand(synth)
	return cmd
}
