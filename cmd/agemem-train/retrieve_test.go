package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/agemem/agemem/internal/testkit"
)

// tools synth writes ToolRet-layout data that tools retrieve reads; the
// query baseline needs no model, Memetic runs on the built-in engine (a
// random tiny model: nonsense pseudo-tools, but the whole loop), and the
// run file it writes is read back by tools score.
func TestCLIToolsRetrieve(t *testing.T) {
	dir := t.TempDir()
	mustRun(t, "tools", "synth", "--providers", "10", "--queries", "12", "--out", dir)
	data := []string{"--data", filepath.Join(dir, "queries.jsonl"), "--corpus", filepath.Join(dir, "tools.jsonl")}
	got := mustRun(t, append([]string{"tools", "retrieve", "--strategy", "query"}, data...)...)
	if !strings.Contains(got, "query        all                12") || !strings.Contains(got, "N@5") {
		t.Fatalf("table:\n%s", got)
	}
	model := filepath.Join(dir, "tiny")
	mustRun(t, "init-model", "--preset", "tiny", "--tokenizer", testkit.QwenTokenizer(t), "--out", model)
	out, runFile := filepath.Join(dir, "out"), filepath.Join(dir, "run.txt")
	got = mustRun(t, append([]string{"tools", "retrieve", "--strategy", "query,memetic", "--native", model, "--first", "2",
		"--set", "agent.response_budget=12", "--out", out, "--run", runFile, "--qrels", filepath.Join(dir, "qrels.txt")}, data...)...)
	if !strings.Contains(got, "memetic      all                 2") || !strings.Contains(got, "avg rank (1 best") {
		t.Fatalf("memetic table:\n%s", got)
	}
	var rep struct {
		Rows []struct {
			Strategy string  `json:"strategy"`
			Calls    float64 `json:"llm_calls_per_query"`
		} `json:"rows"`
		AvgRank map[string]float64 `json:"avg_rank"`
	}
	b, _ := os.ReadFile(filepath.Join(out, "report.json"))
	if err := json.Unmarshal(b, &rep); err != nil || rep.Rows[len(rep.Rows)-1].Calls != 22 || rep.AvgRank["query"]+rep.AvgRank["memetic"] != 3 {
		t.Fatalf("report: %v %+v (memetic: 1 analysis + 1 seed + 2 rounds of 5 offspring and 5 refinements)", err, rep.Rows)
	}
	if st, err := os.Stat(filepath.Join(out, "retrieval.png")); err != nil || st.Size() == 0 {
		t.Fatalf("retrieval.png: %v", err)
	}
	raw, _ := os.ReadFile(filepath.Join(dir, "run.memetic.txt"))
	if !strings.Contains(string(raw), " Q0 ") || !strings.Contains(string(raw), " memetic\n") {
		t.Fatalf("run file:\n%s", raw)
	}
	// tools score reads them back.
	if got := mustRun(t, "tools", "score", "--qrels", filepath.Join(dir, "qrels.txt"), "--run", filepath.Join(dir, "run.query.txt"), "--k", "5"); !strings.Contains(got, "queries") || !strings.Contains(got, "\n5  ") {
		t.Fatalf("tools score:\n%s", got)
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		{append([]string{"--strategy", "genetic"}, data...), `strategy "genetic"`},
		{append([]string{"--strategy", "dbd"}, data...), "need a model"},
		{[]string{"--strategy", "query"}, "--data and --corpus"},
		{append([]string{"--set", "fittext.memory_penalty=both"}, data...), "fittext.memory_penalty"},
		{[]string{"--stb", filepath.Join(dir, "tools.jsonl")}, "not a JSON list of queries"},
		{append([]string{"--strategy", "query, query"}, data...), "query is named twice"},
		{append([]string{"--first", "-1"}, data...), "--first -1"},
		{append([]string{"--k", "-5"}, data...), "--k -5"},
	} {
		if _, err := run(t, append([]string{"tools", "retrieve"}, c.args...)...); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%v: %v, want %q", c.args, err, c.want)
		}
	}
}
