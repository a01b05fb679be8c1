package toolret

import (
	"math"
	"testing"
)

func close(a, b float64) bool { return math.Abs(a-b) < 1e-12 }

// TestMetricsHandWorked: trec_eval's definitions worked by hand.
func TestMetricsHandWorked(t *testing.T) {
	// Ranked: t3 (0.9), t1 (0.8), t2 = t4 (0.5; the tie goes to the larger id, t4, first), t5.
	run := Run{"t1": 0.8, "t2": 0.5, "t3": 0.9, "t4": 0.5, "t5": 0.1}
	if got := Ranked(run); got[2] != "t4" || got[3] != "t2" || got[0] != "t3" {
		t.Fatalf("ranking %v", got)
	}
	qrels := Qrels{"t1": 1, "t2": 2, "t6": 1, "t5": 0}
	m := At(run, qrels, 3)
	// Top 3: t3 (0), t1 (1), t4 (0). DCG = 1/log2(3); ideal: 2, 1, 1 at ranks 1-3.
	dcg := 1 / math.Log2(3)
	idcg := 2/math.Log2(2) + 1/math.Log2(3) + 1/math.Log2(4)
	if !close(m.NDCG, dcg/idcg) || !close(m.Recall, 1.0/3) || !close(m.Precision, 1.0/3) || m.Comprehensiveness != 0 {
		t.Fatalf("@3: %+v (NDCG want %.6f)", m, dcg/idcg)
	}
	m = At(run, qrels, 10)
	// All five retrieved: t1 at rank 2, t2 at rank 4; t6 never. P@10 divides by 10.
	dcg = 1/math.Log2(3) + 2/math.Log2(5)
	if !close(m.NDCG, dcg/idcg) || !close(m.Recall, 2.0/3) || !close(m.Precision, 0.2) || m.Comprehensiveness != 0 {
		t.Fatalf("@10: %+v", m)
	}
	all := At(Run{"t1": 1, "t2": 3, "t6": 2}, qrels, 3)
	if !close(all.Recall, 1) || all.Comprehensiveness != 1 || !close(all.Precision, 1) {
		t.Fatalf("all found: %+v", all)
	}
	// Perfect order gives NDCG 1.
	if p := At(Run{"t2": 3, "t1": 2, "t6": 1}, qrels, 3); !close(p.NDCG, 1) {
		t.Fatalf("ideal ranking: %+v", p)
	}
}

func TestMeanAsPytrecEval(t *testing.T) {
	runs := map[string]Run{"q1": {"a": 1}, "q2": {"b": 1}, "q9": {"a": 1}}
	qrels := map[string]Qrels{"q1": {"a": 1}, "q2": {"c": 1}, "q3": {"a": 1}}
	m, n, skipped := Mean(runs, qrels, 1)
	if n != 2 || skipped != 1 || !close(m.Recall, 0.5) || !close(m.NDCG, 0.5) || !close(m.Precision, 0.5) || !close(m.Comprehensiveness, 0.5) {
		t.Fatalf("%+v over %d, %d skipped", m, n, skipped)
	}
}
