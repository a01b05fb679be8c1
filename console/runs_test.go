package console_test

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/agemem/agemem/console"
	"github.com/agemem/agemem/eval"
)

// runsConsole serves dir's runs as agemem-train console does.
func runsConsole(t testing.TB, dir string) *httptest.Server {
	t.Helper()
	cfg := console.DefaultConfig()
	cfg.Runs = dir
	c, err := console.New(console.Options{Config: cfg, Open: console.Principal{Admin: true}})
	if err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewServer(c)
	t.Cleanup(ts.Close)
	return ts
}

func get(t testing.TB, c *http.Client, u string) (int, http.Header, string) {
	t.Helper()
	resp, err := c.Get(u)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, resp.Header, string(body)
}

// TestRunPagesShowARealRun reads a small GRPO run through every run page:
// the run and the evaluation report are listed, the curves are SVG
// figures of the logged metrics, the rollout browser lists the last
// step's groups and a group shows its K rollouts with their trajectories.
func TestRunPagesShowARealRun(t *testing.T) {
	ts := runsConsole(t, runsDir(t))
	c := ts.Client()
	code, _, body := get(t, c, ts.URL+"/ui/runs")
	if code != 200 || !strings.Contains(body, "tiny/rl") || !strings.Contains(body, "tiny/eval.json") {
		t.Fatalf("runs page: %d\n%s", code, body)
	}
	code, _, body = get(t, c, ts.URL+"/ui/runs/run?name=tiny/rl")
	if code != 200 || !strings.Contains(body, "chart.svg?") || !strings.Contains(body, "r_task") {
		t.Fatalf("run page: %d\n%s", code, body)
	}
	code, h, svg := get(t, c, ts.URL+"/ui/runs/chart.svg?run=tiny/rl&metric=reward&metric=r_task&smooth=2")
	if code != 200 || h.Get("Content-Type") != "image/svg+xml" || !strings.Contains(svg, "<svg") || !strings.Contains(svg, "r_task (mean of 2)") {
		t.Fatalf("chart: %d %s\n%.300s", code, h.Get("Content-Type"), svg)
	}
	code, _, body = get(t, c, ts.URL+"/ui/runs/rollouts?run=tiny/rl")
	if code != 200 || strings.Count(body, "/ui/runs/group?") != 2 || !strings.Contains(body, "Step 3") {
		t.Fatalf("rollouts page (step 3 of 2 groups): %d\n%s", code, body)
	}
	code, _, body = get(t, c, ts.URL+"/ui/runs/group?run=tiny/rl&step=3&group=1")
	if code != 200 || strings.Count(body, `class="rollout"`) != 4 || !strings.Contains(body, "Stage 1") || !strings.Contains(body, "Stage 3") {
		t.Fatalf("group page (4 rollouts with trajectories): %d\n%s", code, body)
	}
	// The evaluation table reads eval's own report: every row's figures.
	code, _, body = get(t, c, ts.URL+"/ui/runs/evals?file=tiny/eval.json")
	raw, err := os.ReadFile(filepath.Join(runsDir(t), "tiny", "eval.json"))
	if err != nil {
		t.Fatal(err)
	}
	var rows []eval.Row
	if err := json.Unmarshal(raw, &rows); err != nil || len(rows) != 2 {
		t.Fatalf("eval.json: %v (%d rows)", err, len(rows))
	}
	for _, r := range rows {
		for _, want := range []string{r.Policy, fmt.Sprintf("%.3f ± %.3f", r.J.Mean, r.J.SE), fmt.Sprintf("%.3f ± %.3f", r.MQ.Mean, r.MQ.SE),
			fmt.Sprintf("%.0f", r.PromptTokens), fmt.Sprintf("%.2f", r.ToolCalls["Add_memory"])} {
			if code != 200 || !strings.Contains(body, want) {
				t.Fatalf("the evaluation page lacks %q of %s: %d\n%s", want, r.Policy, code, body)
			}
		}
	}
}

// TestRunNamesAreOnlyFoundRuns: a run is named by what the scan found, so
// no request reads a path of its own choosing.
func TestRunNamesAreOnlyFoundRuns(t *testing.T) {
	ts := runsConsole(t, runsDir(t))
	for _, name := range []string{"../../etc", "/etc", "tiny/../tiny/rl", "tiny", "tiny/rl/checkpoint-3"} {
		code, _, _ := get(t, ts.Client(), ts.URL+"/ui/runs/run?name="+url.QueryEscape(name))
		if code != http.StatusNotFound {
			t.Errorf("run %q: %d, want 404", name, code)
		}
	}
	if code, _, _ := get(t, ts.Client(), ts.URL+"/ui/runs/evals?file="+url.QueryEscape("../../etc/passwd")); code != http.StatusNotFound {
		t.Errorf("evaluation report outside the runs: %d, want 404", code)
	}
}
