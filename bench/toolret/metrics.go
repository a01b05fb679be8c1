// Package toolret evaluates tool retrieval as the benchmarks do (ToolRet,
// StableToolBench): NDCG@k, Recall@k, Precision@k and Comprehensiveness@k,
// computed as pytrec_eval (trec_eval) computes them.
package toolret

import (
	"fmt"
	"math"
	"sort"
)

// Run is a retriever's scored tools for one query.
type Run map[string]float64

// Qrels are a query's judged tools: relevance levels, 1 or more relevant.
type Qrels map[string]int

// Ranked orders a run as trec_eval does: by score, highest first, ties
// broken by tool id in reverse lexicographic order.
func Ranked(r Run) []string {
	ids := make([]string, 0, len(r))
	for id := range r {
		ids = append(ids, id)
	}
	sort.Slice(ids, func(a, b int) bool {
		if r[ids[a]] != r[ids[b]] {
			return r[ids[a]] > r[ids[b]]
		}
		return ids[a] > ids[b]
	})
	return ids
}

// Metrics are one query's figures at a cutoff.
type Metrics struct {
	NDCG, Recall, Precision, Comprehensiveness float64
}

// At computes the metrics of the run's top k for a query with these
// judgments, as trec_eval's ndcg_cut_k, recall_k and P_k do (gain = the
// relevance level, discount log2(rank+1), the ideal from the judgments;
// P_k divides by k even when fewer were retrieved), and
// Comprehensiveness@k: 1 when every relevant tool is in the top k.
func At(run Run, qrels Qrels, k int) Metrics {
	ranked := Ranked(run)
	if len(ranked) > k {
		ranked = ranked[:k]
	}
	var rels []int
	relevant := 0
	for _, r := range qrels {
		if r > 0 {
			rels = append(rels, r)
			relevant++
		}
	}
	var dcg float64
	hits := 0
	for i, id := range ranked {
		if r := qrels[id]; r > 0 {
			dcg += float64(r) / math.Log2(float64(i+2))
			hits++
		}
	}
	sort.Sort(sort.Reverse(sort.IntSlice(rels)))
	var idcg float64
	for i, r := range rels {
		if i >= k {
			break
		}
		idcg += float64(r) / math.Log2(float64(i+2))
	}
	var m Metrics
	if idcg > 0 {
		m.NDCG = dcg / idcg
	}
	if relevant > 0 {
		m.Recall = float64(hits) / float64(relevant)
		if hits == relevant {
			m.Comprehensiveness = 1
		}
	}
	m.Precision = float64(hits) / float64(k)
	return m
}

// Mean averages the metrics over the queries that have both a run and
// judgments, as pytrec_eval's evaluate does (a judged query without any
// relevant tool scores 0 there too). Skipped counts judged queries the run
// lacks, which pytrec_eval leaves out silently: report it.
func Mean(runs map[string]Run, qrels map[string]Qrels, k int) (m Metrics, n, skipped int) {
	for q := range qrels {
		if _, ok := runs[q]; !ok {
			skipped++
		}
	}
	for q, run := range runs {
		qr, ok := qrels[q]
		if !ok {
			continue
		}
		x := At(run, qr, k)
		m.NDCG += x.NDCG
		m.Recall += x.Recall
		m.Precision += x.Precision
		m.Comprehensiveness += x.Comprehensiveness
		n++
	}
	if n > 0 {
		f := float64(n)
		m = Metrics{m.NDCG / f, m.Recall / f, m.Precision / f, m.Comprehensiveness / f}
	}
	return m, n, skipped
}

// PerQuery are each judged query's metrics at every cutoff, by query id
// (sorted), as records of "qid" and "ndcg@k", "recall@k", "precision@k",
// "comprehensiveness@k": trec_eval -q's figures, for JSONL.
func PerQuery(runs map[string]Run, qrels map[string]Qrels, cuts []int) []map[string]any {
	qids := make([]string, 0, len(runs))
	for q := range runs {
		if qrels[q] != nil {
			qids = append(qids, q)
		}
	}
	sort.Strings(qids)
	out := make([]map[string]any, len(qids))
	for i, q := range qids {
		rec := map[string]any{"qid": q}
		for _, k := range cuts {
			m := At(runs[q], qrels[q], k)
			rec[fmt.Sprintf("ndcg@%d", k)], rec[fmt.Sprintf("recall@%d", k)] = m.NDCG, m.Recall
			rec[fmt.Sprintf("precision@%d", k)], rec[fmt.Sprintf("comprehensiveness@%d", k)] = m.Precision, m.Comprehensiveness
		}
		out[i] = rec
	}
	return out
}
