package main

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"

	"github.com/spf13/cobra"

	"github.com/agemem/agemem/env"
	"github.com/agemem/agemem/setup"
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
	cmd.AddCommand(synth, sftDataCmd(g))
	return cmd
}

const sftDataLong = `Plays the oracle on tasks and writes its episodes as chat JSONL (OpenAI
format: system, user, assistant, tool): each of the oracle's replies with
exactly the messages it saw, which is what SFT learns. Calls that continue
one conversation (the next call sees the last one's context and reply, then
new messages) share one record, every reply learned (weight 1) against its
own context; where a Filter or Summary rewrote the context a new record
starts, the replies it still holds weighted 0. The same gradient as one
record per call (--per-call) in about half the tokens. Error rates
make the oracle imperfect, so the tuned policy leaves RL room to improve:
a greedy policy does what its teacher did most often, so a random rate
under one half vanishes from it, while a blind spot (--forget-relayed-rate
1: facts the user only relayed are never stored) stays for RL to correct.
--reason: before answering a comparison from facts it sees, the oracle
thinks the comparison out (each option's year or country, in the order the
memories came back, then the verdict; README, "Demo results").`

func sftDataCmd(g *globals) *cobra.Command {
	var data, out, policyName string
	var forget, forgetRelayed, keep float64
	var n int
	var perCall, reason bool
	var stages []int
	cmd := &cobra.Command{
		Use:     "sft",
		Short:   "Turn oracle episodes into supervised chat data (JSONL) in the AgeMem format",
		Long:    sftDataLong,
		Example: "  agemem-train data sft --policy oracle --data data/synth.json --out data/sft.jsonl --forget-rate 0.1 --keep-distractor-rate 0.2",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg, err := g.loadData(&data)
			if err != nil {
				return err
			}
			if policyName != "oracle" {
				return fmt.Errorf("--policy %q: only the oracle makes SFT data", policyName)
			}
			for _, r := range []struct {
				flag string
				v    float64
			}{{"--forget-rate", forget}, {"--forget-relayed-rate", forgetRelayed}, {"--keep-distractor-rate", keep}} {
				if !(r.v >= 0 && r.v <= 1) {
					return fmt.Errorf("%s %v: a chance, in [0, 1]", r.flag, r.v)
				}
			}
			if n < 0 {
				return fmt.Errorf("--n %d: want 0 (every task) or more", n)
			}
			for _, s := range stages {
				if s < env.Stage1 || s > env.Stage3 {
					return fmt.Errorf("--stages %d: stages are 1, 2 and 3", s)
				}
			}
			o := setup.OracleSFT{Forget: forget, ForgetRelayed: forgetRelayed, KeepDistractor: keep, Reason: reason, Tasks: n, Stages: stages, PerCall: perCall}
			f, err := create(out)
			if err != nil {
				return err
			}
			w := bufio.NewWriter(f)
			tasks, records, err := setup.WriteOracleSFT(cmd.Context(), cfg, data, o, w)
			if err == nil {
				err = w.Flush()
			}
			if err != nil {
				f.Close()
				return err
			}
			if err := f.Close(); err != nil {
				return err
			}
			fmt.Fprintf(cmd.ErrOrStderr(), "wrote %d records from %d tasks to %s\n", records, tasks, out)
			return nil
		},
	}
	cmd.Flags().StringVar(&data, "data", "", "HotpotQA-format task file (default: data.train)")
	cmd.Flags().StringVar(&out, "out", "data/sft.jsonl", "output JSONL file")
	cmd.Flags().StringVar(&policyName, "policy", "oracle", "the policy whose episodes are written (oracle)")
	cmd.Flags().Float64Var(&forget, "forget-rate", 0, "chance the oracle does not store a fact it is shown")
	cmd.Flags().Float64Var(&forgetRelayed, "forget-relayed-rate", 0, "chance the oracle does not store a fact the user relayed (\"A friend mentioned this: ...\"), when above --forget-rate: a blind spot SFT copies and RL can correct")
	cmd.Flags().Float64Var(&keep, "keep-distractor-rate", 0, "chance the oracle does not filter a distractor")
	cmd.Flags().IntVar(&n, "n", 0, "tasks to use (0: all)")
	cmd.Flags().BoolVar(&reason, "reason", false, "the oracle reasons a comparison out in its thought before answering it (each option's year or country, then the verdict)")
	cmd.Flags().IntSliceVar(&stages, "stages", []int{1, 2, 3}, "the stages whose calls are written, e.g. 1 for Stage 1 alone: short conversations that each store what the user said (copy-dense data)")
	cmd.Flags().BoolVar(&perCall, "per-call", false, "one record per policy call, only its last message learned (more tokens, the same examples)")
	return cmd
}
