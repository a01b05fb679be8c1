package main

import (
	"fmt"
	"strconv"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/agemem/agemem/bench/toolret"
)

func toolsCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{Use: "tools", Short: "Tool use: retrieval evaluated as the benchmarks do it (FitText), WorkBench with MemToolAgent's memory"}
	cmd.AddCommand(toolsScoreCmd(), toolsRetrieveCmd(g), toolsSynthCmd(), toolsRunCmd(g))
	return cmd
}

func toolsScoreCmd() *cobra.Command {
	var qrelsPath, runPath, ks, out string
	var asJSON bool
	score := &cobra.Command{
		Use:   "score",
		Short: "Evaluate a TREC run file against TREC qrels, as trec_eval does",
		Long: `Evaluates any ranking (a TREC run file: "qid Q0 docid rank score tag" per line)
against judgments (TREC qrels: "qid 0 docid rel") as trec_eval / pytrec_eval
do: tools ordered by score (ties by reverse id; the rank column is ignored),
NDCG@k with the relevance level as gain, Recall@k, Precision@k (over k) and
Comprehensiveness@k (1 only when every relevant tool is in the top k),
averaged over the queries that have both a ranking and judgments. --out
writes each query's values as JSONL.`,
		Example: `  agemem-train tools score --qrels qrels.txt --run run.txt --k 1,3,5,10 --out per-query.jsonl`,
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if qrelsPath == "" || runPath == "" {
				return fmt.Errorf("--qrels and --run are required")
			}
			var cuts []int
			for _, s := range strings.Split(ks, ",") {
				k, err := strconv.Atoi(strings.TrimSpace(s))
				if err != nil || k < 1 {
					return fmt.Errorf("--k %q: want cutoffs such as 1,3,5,10", ks)
				}
				cuts = append(cuts, k)
			}
			qrels, err := toolret.ReadQrels(qrelsPath)
			if err != nil {
				return err
			}
			runs, err := toolret.ReadRun(runPath)
			if err != nil {
				return err
			}
			type row struct {
				K int `json:"k"`
				toolret.Metrics
				Queries int `json:"queries"`
				Skipped int `json:"skipped"`
			}
			var rows []row
			for _, k := range cuts {
				m, n, skipped := toolret.Mean(runs, qrels, k)
				rows = append(rows, row{k, m, n, skipped})
			}
			if out != "" {
				if err := writeJSONL(out, toolret.PerQuery(runs, qrels, cuts)); err != nil {
					return err
				}
			}
			if asJSON {
				return writeJSON(cmd.OutOrStdout(), rows)
			}
			tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 0, 2, ' ', 0)
			fmt.Fprintln(tw, "k\tNDCG\trecall\tprecision\tcomprehensiveness\tqueries")
			for _, r := range rows {
				fmt.Fprintf(tw, "%d\t%.4f\t%.4f\t%.4f\t%.4f\t%d\n", r.K, r.NDCG, r.Recall, r.Precision, r.Comprehensiveness, r.Queries)
			}
			tw.Flush()
			if rows[0].Skipped > 0 {
				fmt.Fprintf(cmd.OutOrStdout(), "%d judged queries have no ranking (left out, as pytrec_eval does)\n", rows[0].Skipped)
			}
			return nil
		},
	}
	score.Flags().StringVar(&qrelsPath, "qrels", "", "TREC qrels file")
	score.Flags().StringVar(&runPath, "run", "", "TREC run file")
	score.Flags().StringVar(&ks, "k", "1,3,5,10", "cutoffs")
	score.Flags().StringVar(&out, "out", "", "write per-query values here (JSONL)")
	score.Flags().BoolVar(&asJSON, "json", false, "print the table as JSON")
	return score
}
