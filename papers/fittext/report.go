package fittext

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/agemem/agemem/bench/toolret"
	"github.com/agemem/agemem/internal/chart"
)

// ParseStrategies reads a comma-separated list of strategies, each one
// that exists and named once.
func ParseStrategies(list string) ([]string, error) {
	ss := strings.Split(list, ",")
	for i, s := range ss {
		ss[i] = strings.TrimSpace(s)
		if err := CheckStrategy(ss[i]); err != nil {
			return nil, err
		}
		if slices.Contains(ss[:i], ss[i]) {
			return nil, fmt.Errorf("%s is named twice", ss[i])
		}
	}
	return ss, nil
}

// WriteRuns writes each strategy's rankings as a TREC run file tagged
// with its name: to path for one strategy, else to path with the
// strategy before its extension (run.memetic.txt), as a run file lists a
// tool once per query.
func WriteRuns(path string, ev Evaluation, strategies []string) error {
	for _, s := range strategies {
		p := path
		if len(strategies) > 1 {
			ext := filepath.Ext(path)
			p = strings.TrimSuffix(path, ext) + "." + s + ext
		}
		if err := writeFile(p, func(f *os.File) error { return toolret.WriteRun(f, ev.Runs[s], s) }); err != nil {
			return err
		}
	}
	return nil
}

// WriteReport writes dir/report.json (the table, the strategies' average
// ranks and each query's results) and dir/retrieval.png (every strategy's
// figures over all queries, ×100).
func WriteReport(dir string, ev Evaluation, strategies []string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	names, ranks := AvgRank(ev.Rows)
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

// writeFile writes path, making its directory, with write.
func writeFile(path string, write func(*os.File) error) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := write(f); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}
