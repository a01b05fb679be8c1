package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/agemem/agemem/internal/testkit"
)

// memtool synth writes a benchmark that memtool bench reads; the oracle
// agent gets every turn right in every mode, and the report and the chart
// are written.
func TestCLIMemtool(t *testing.T) {
	dir := t.TempDir()
	mustRun(t, "memtool", "synth", "--companies", "40", "--queries", "30", "--out", dir)
	out := filepath.Join(dir, "out")
	set := []string{"--set", "memtool.bench.queries=" + filepath.Join(dir, "queries.json"), "--set", "memtool.bench.tools=" + filepath.Join(dir, "tools.json"),
		"--set", "memtool.bench.out=" + out, "--set", "memtool.bench.turns=20"}
	got := mustRun(t, append([]string{"memtool", "bench", "--policy", "oracle"}, set...)...)
	for _, mode := range []string{"autonomous", "workflow", "hybrid"} {
		if !strings.Contains(got, "oracle   "+mode) {
			t.Fatalf("no %s row:\n%s", mode, got)
		}
	}
	if !strings.Contains(got, "200 tools, 20 turns, L = 128") || !strings.Contains(got, "1.000     1.000") {
		t.Fatalf("report:\n%s", got)
	}
	var rep struct {
		Modes []struct {
			Counts []int `json:"tool_count_per_turn"`
		} `json:"modes"`
	}
	b, err := os.ReadFile(filepath.Join(out, "report.json"))
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, &rep); err != nil || len(rep.Modes) != 3 || len(rep.Modes[0].Counts) != 20 {
		t.Fatalf("report.json: %v %+v", err, rep)
	}
	if st, err := os.Stat(filepath.Join(out, "tools.png")); err != nil || st.Size() == 0 {
		t.Fatalf("tools.png: %v", err)
	}
	// The built-in engine as the agent and controller: a random tiny model
	// writes nonsense, and the session still runs to its end and is measured.
	model := filepath.Join(dir, "tiny")
	mustRun(t, "init-model", "--preset", "tiny", "--tokenizer", testkit.QwenTokenizer(t), "--out", model)
	got = mustRun(t, append([]string{"memtool", "bench", "--policy", "native", "--native", model, "--set", "memtool.bench.turns=3",
		"--set", "memtool.max_steps=2", "--set", "agent.response_budget=16"}, set[:6]...)...)
	if !strings.Contains(got, "native   hybrid") {
		t.Fatalf("native report:\n%s", got)
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--modes", "auto"}, `--modes: "auto"`},
		{[]string{"--policy", "gpt"}, `--policy "gpt"`},
		{[]string{"--policy", "native"}, "needs --native DIR"},
		{[]string{"--set", "memtool.limit=1"}, "memtool.limit"},
		{[]string{"--set", "memtool.bench.queries=" + filepath.Join(dir, "tools.json")}, "query 0 (query_id 0): no query text"},
		{[]string{"--set", "memtool.bench.judge=model"}, "--judge-model"},
	} {
		_, err := run(t, append(append([]string{"memtool", "bench"}, set...), c.args...)...)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%v: error %v, want %q", c.args, err, c.want)
		}
	}
}
