package fittext

import (
	"context"
	"fmt"
	"io"
	"slices"
	"sync"

	"github.com/agemem/agemem/bench/toolret"
)

// Row is one strategy's figures on one subset (or "all": every query,
// the merged qrels the paper's per-domain "Global" figures use).
type Row struct {
	Strategy string          `json:"strategy"`
	Subset   string          `json:"subset"`
	K        int             `json:"k"`
	Metrics  toolret.Metrics `json:"metrics"`
	Queries  int             `json:"queries"`
	LLMCalls float64         `json:"llm_calls_per_query"`
}

// Evaluation is a run over a dataset: the table, and each strategy's
// ranking per query (corpus ids; scores strictly decreasing with rank, so
// trec_eval keeps the strategy's order, as the authors' "rank" scoring).
type Evaluation struct {
	Rows    []Row                             `json:"rows"`
	Runs    map[string]map[string]toolret.Run `json:"-"`
	Results map[string][]Result               `json:"-"`
}

// Evaluate runs every strategy on every query of ds and measures the
// rankings at cutoff k. workers queries run at once (their model calls
// batch together on a batching backend; results do not depend on it).
// progress, if set, hears each query done (one at a time).
func Evaluate(ctx context.Context, r *Retriever, ds toolret.Dataset, strategies []string, k, workers int, progress func(strategy string, done, total int)) (Evaluation, error) {
	ev := Evaluation{Runs: map[string]map[string]toolret.Run{}, Results: map[string][]Result{}}
	qrels := map[string]toolret.Qrels{}
	subsetOf := map[string]string{}
	var subsets []string
	for _, q := range ds.Queries {
		qrels[q.ID] = q.Gold
		subsetOf[q.ID] = q.Subset
		if !slices.Contains(subsets, q.Subset) {
			subsets = append(subsets, q.Subset)
		}
	}
	for _, s := range strategies {
		if err := CheckStrategy(s); err != nil {
			return ev, err
		}
		results := make([]Result, len(ds.Queries))
		errs := make([]error, len(ds.Queries))
		jobs := make(chan int)
		var wg sync.WaitGroup
		var mu sync.Mutex
		done := 0
		for range max(workers, 1) {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := range jobs {
					results[i], errs[i] = r.Retrieve(ctx, s, ds.Queries[i].Text)
					mu.Lock()
					done++
					if progress != nil {
						progress(s, done, len(ds.Queries))
					}
					mu.Unlock()
				}
			}()
		}
		for i := range ds.Queries {
			jobs <- i
		}
		close(jobs)
		wg.Wait()
		runs := map[string]toolret.Run{}
		calls := map[string]int{}
		for i, q := range ds.Queries {
			if errs[i] != nil {
				return ev, fmt.Errorf("%s, query %s: %w", s, q.ID, errs[i])
			}
			res := results[i]
			run := toolret.Run{}
			for rank, h := range res.Ranking {
				run[ds.IDs[h.Name]] = float64(len(res.Ranking) - rank)
			}
			runs[q.ID] = run
			calls[q.Subset] += res.Calls
			calls[""] += res.Calls
			ev.Results[s] = append(ev.Results[s], res)
		}
		ev.Runs[s] = runs
		for _, sub := range append(slices.Clone(subsets), "all") {
			sr, sq := map[string]toolret.Run{}, map[string]toolret.Qrels{}
			for id, run := range runs {
				if sub == "all" || subsetOf[id] == sub {
					sr[id], sq[id] = run, qrels[id]
				}
			}
			m, n, _ := toolret.Mean(sr, sq, k)
			key := sub
			if sub == "all" {
				key = ""
			}
			row := Row{Strategy: s, Subset: sub, K: k, Metrics: m, Queries: n}
			if n > 0 {
				row.LLMCalls = float64(calls[key]) / float64(n)
			}
			ev.Rows = append(ev.Rows, row)
		}
	}
	return ev, nil
}

// AvgRank is the paper's "Avg. Rank" (Table 1): each strategy's rank
// among the strategies in every column, a subset's N, P, R and C (1 is
// the highest value; ties share the mean of their ranks), averaged over
// the columns. The columns are the subsets' ("all" only when it is the
// one subset). Strategies in the order they first appear.
func AvgRank(rows []Row) (strategies []string, ranks []float64) {
	type col struct {
		subset string
		metric int
	}
	var subsets []string
	value := map[string]map[col]float64{}
	for _, r := range rows {
		if !slices.Contains(strategies, r.Strategy) {
			strategies = append(strategies, r.Strategy)
			value[r.Strategy] = map[col]float64{}
		}
		if !slices.Contains(subsets, r.Subset) {
			subsets = append(subsets, r.Subset)
		}
		m := r.Metrics
		for i, v := range []float64{m.NDCG, m.Precision, m.Recall, m.Comprehensiveness} {
			value[r.Strategy][col{r.Subset, i}] = v
		}
	}
	if len(subsets) > 1 {
		subsets = slices.DeleteFunc(subsets, func(s string) bool { return s == "all" })
	}
	ranks = make([]float64, len(strategies))
	n := 0
	for _, sub := range subsets {
		for metric := range 4 {
			c := col{sub, metric}
			for i, s := range strategies {
				v := value[s][c]
				better, equal := 0, 0
				for _, o := range strategies {
					switch ov := value[o][c]; {
					case ov > v:
						better++
					case ov == v:
						equal++ // itself included
					}
				}
				ranks[i] += float64(better) + float64(equal+1)/2
			}
			n++
		}
	}
	for i := range ranks {
		ranks[i] /= float64(n)
	}
	return strategies, ranks
}

// WriteTable prints the rows as the paper's tables read: ×100, then each
// strategy's Avg. Rank.
func WriteTable(w io.Writer, rows []Row) {
	if len(rows) == 0 {
		return
	}
	k := rows[0].K
	fmt.Fprintf(w, "%-12s %-12s %8s %8s %8s %8s %8s %10s\n", "strategy", "subset", "queries", fmt.Sprintf("N@%d", k), fmt.Sprintf("P@%d", k),
		fmt.Sprintf("R@%d", k), fmt.Sprintf("C@%d", k), "LLM calls")
	for _, r := range rows {
		m := r.Metrics
		fmt.Fprintf(w, "%-12s %-12s %8d %8.2f %8.2f %8.2f %8.2f %10.1f\n", r.Strategy, r.Subset, r.Queries,
			100*m.NDCG, 100*m.Precision, 100*m.Recall, 100*m.Comprehensiveness, r.LLMCalls)
	}
	if names, ranks := AvgRank(rows); len(names) > 1 {
		fmt.Fprintf(w, "avg rank (1 best, over each subset's four metrics):")
		for i, s := range names {
			fmt.Fprintf(w, " %s %.2f", s, ranks[i])
		}
		fmt.Fprintln(w)
	}
}
