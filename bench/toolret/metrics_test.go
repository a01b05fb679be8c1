package toolret

import (
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strings"
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

// TestTRECFiles: qrels and run files read as trec_eval reads them (the
// score orders, the rank column is ignored), a written run reads back to
// the same ranking, and malformed lines are named.
func TestTRECFiles(t *testing.T) {
	dir := t.TempDir()
	qrels := filepath.Join(dir, "qrels.txt")
	run := filepath.Join(dir, "run.txt")
	os.WriteFile(qrels, []byte("q1 0 t1 1\nq1 0 t2 2\n\nq2 0 t9 1\n"), 0o644)
	os.WriteFile(run, []byte("q1 Q0 t2 1 0.2 x\nq1 Q0 t1 2 0.9 x\nq2 Q0 t8 1 0.5 x\n"), 0o644)
	qr, err := ReadQrels(qrels)
	if err != nil || qr["q1"]["t2"] != 2 || len(qr["q2"]) != 1 {
		t.Fatalf("%v %v", qr, err)
	}
	rn, err := ReadRun(run)
	if err != nil || Ranked(rn["q1"])[0] != "t1" {
		t.Fatalf("%v %v (the score, not the rank column, orders)", rn, err)
	}
	var buf strings.Builder
	rn["q1"]["t3"] = 0.9000000001 // nearly tied: full precision keeps the order
	WriteRun(&buf, rn, "tag")
	os.WriteFile(run, []byte(buf.String()), 0o644)
	back, err := ReadRun(run)
	if err != nil || fmt.Sprint(Ranked(back["q1"])) != fmt.Sprint(Ranked(rn["q1"])) {
		t.Fatalf("written and read back: %v, was %v (%v)", Ranked(back["q1"]), Ranked(rn["q1"]), err)
	}
	for content, want := range map[string]string{
		"q1 0 t1\n":              "want 4 fields",
		"q1 0 t1 high\n":         "not an integer",
		"q1 0 t1 1\nq1 0 t1 0\n": "judges t1 twice",
	} {
		os.WriteFile(qrels, []byte(content), 0o644)
		if _, err := ReadQrels(qrels); err == nil || !strings.Contains(err.Error(), want) || !strings.Contains(err.Error(), "qrels.txt:") {
			t.Errorf("%q: %v", content, err)
		}
	}
	os.WriteFile(run, []byte("q1 Q0 t1 1 0.5 x\nq1 Q0 t1 2 0.4 x\n"), 0o644)
	if _, err := ReadRun(run); err == nil || !strings.Contains(err.Error(), "run.txt:2: query q1 lists t1 twice") {
		t.Errorf("duplicate: %v", err)
	}
	os.WriteFile(run, []byte("q1 Q0 t1 1 0.5 x\nq1 Q0 t2 2 nan x\n"), 0o644)
	if _, err := ReadRun(run); err == nil || !strings.Contains(err.Error(), `run.txt:2: score "nan" cannot be ordered`) {
		t.Errorf("NaN score: %v", err)
	}
}
