package console_test

import (
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/agemem/agemem/console"
	"github.com/agemem/agemem/console/browsertest"
	"github.com/agemem/agemem/model/train"
)

// TestRunPagesInChromium walks the training pages of a real GRPO run in
// Chromium as a researcher would: the runs list, a run's curves (every
// chart an image the browser could draw), two runs on one chart, the
// rollout browser listing the last step's groups, a group's rollouts with
// their trajectories, the evaluation tables; no page reports an error (a
// Content-Security-Policy violation would be one).
func TestRunPagesInChromium(t *testing.T) {
	dir := runsDir(t)
	b := browsertest.Start(t)
	ts := runsConsole(t, dir)
	imagesDrawn := func(page string) {
		t.Helper()
		b.Do(chromedp.WaitVisible(chromedp.CSS(".charts img")))
		ok := browsertest.Get(b, chromedp.Evaluate[bool](`Array.from(document.images).length > 0 &&
			Array.from(document.images).every(i => i.complete && i.naturalWidth > 0)`, chromedp.EvalAsValue))
		if !ok {
			t.Fatalf("%s: a chart did not load as an image", page)
		}
	}

	b.Do(chromedp.Navigate(ts.URL + "/ui/"))
	if loc := b.Location(); !strings.HasSuffix(loc, "/ui/runs") {
		t.Fatalf("the console opens on %s, want the runs list", loc)
	}
	if list := b.Text("main table"); !strings.Contains(list, "tiny/rl") || !strings.Contains(list, "tiny/rl-t1.0") {
		t.Fatalf("the runs list:\n%s", list)
	}
	b.Screenshot("console-runs")

	b.Follow(chromedp.Click(chromedp.CSS(`a[href="/ui/runs/run?name=tiny%2frl"]`)))
	imagesDrawn("run page")
	if n := len(browsertest.Get(b, chromedp.Nodes(chromedp.CSSAll(".charts img")))); n < 2 {
		t.Fatalf("the run page draws %d charts, want the reward's and KL's at least", n)
	}
	b.Screenshot("console-run")

	// Both runs on one chart, chosen on the list.
	b.Do(chromedp.Navigate(ts.URL + "/ui/runs"))
	b.Follow(chromedp.Click(chromedp.CSS(`input[value="tiny/rl"]`)), chromedp.Click(chromedp.CSS(`input[value="tiny/rl-t1.0"]`)),
		chromedp.Submit(chromedp.CSS(`input[value="tiny/rl"]`)))
	imagesDrawn("compare page")
	if title := b.Text("h1"); !strings.Contains(title, "tiny/rl,") && !strings.Contains(title, ", tiny/rl") || !strings.Contains(title, "tiny/rl-t1.0") {
		t.Fatalf("the compare page is titled %q", title)
	}
	b.Screenshot("console-compare")

	b.Do(chromedp.Navigate(ts.URL+"/ui/runs/rollouts?run=tiny/rl"), chromedp.WaitVisible(chromedp.CSS("table.groups")))
	groups := browsertest.Get(b, chromedp.Nodes(chromedp.CSSAll(`table.groups a[href*="/ui/runs/group?"]`)))
	if len(groups) != 2 {
		t.Fatalf("the rollout browser lists %d groups of the last step, want 2 (rl.batch_tasks)", len(groups))
	}
	b.Screenshot("console-rollouts")

	b.Follow(chromedp.Click(chromedp.CSS(`table.groups a[href*="/ui/runs/group?"]`)))
	rows := browsertest.Get(b, chromedp.Nodes(chromedp.CSSAll("table.rollouts tbody tr")))
	if len(rows) != 4 {
		t.Fatalf("a group shows %d rollouts, want K = 4", len(rows))
	}
	if traj := b.Text("section.rollout"); !strings.Contains(traj, "Stage 3") || !strings.Contains(traj, "user") {
		t.Fatalf("a rollout's trajectory:\n%s", traj)
	}
	b.Screenshot("console-group")

	b.Do(chromedp.Navigate(ts.URL+"/ui/runs/evals"), chromedp.WaitVisible(chromedp.CSS("table.evals")))
	if tbl := b.Text("table.evals"); !strings.Contains(tbl, "No-Memory") || !strings.Contains(tbl, "oracle") {
		t.Fatalf("the evaluation table:\n%s", tbl)
	}
	b.Screenshot("console-evals")
	b.Settle()
	if p := b.Problems(); len(p) > 0 {
		t.Fatalf("the pages reported errors:\n%s", strings.Join(p, "\n"))
	}
}

// TestLiveRunRefreshesInChromium: the page of a run still training (its
// metrics.jsonl written lately, no policy yet) re-reads itself: a step the
// trainer logs after the page opened shows up without a reload.
func TestLiveRunRefreshesInChromium(t *testing.T) {
	b := browsertest.Start(t)
	dir := t.TempDir()
	m, err := train.OpenMetrics(filepath.Join(dir, "sft", "metrics.jsonl"), false)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	for step := 1; step <= 3; step++ {
		m.Log(map[string]any{"step": step, "loss": 2.0 / float64(step)})
	}
	cfg := console.DefaultConfig()
	cfg.Runs, cfg.Refresh = dir, time.Second
	c, err := console.New(console.Options{Config: cfg, Open: console.Principal{Admin: true}})
	if err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewServer(c)
	defer ts.Close()
	b.Do(chromedp.Navigate(ts.URL+"/ui/runs/run?name=sft"), chromedp.WaitVisible(chromedp.CSS(".charts img")))
	if tag := b.Text("p.runs"); !strings.Contains(tag, "training") {
		t.Fatalf("a run written a moment ago is not marked as training: %q", tag)
	}
	before := browsertest.Get(b, chromedp.Evaluate[string](`document.querySelector(".charts img").src`, chromedp.EvalAsValue))
	m.Log(map[string]any{"step": 4, "loss": 0.123})
	// Read in one evaluation: the page may swap its <main> between the
	// steps of a query.
	figures := func() string {
		return browsertest.Get(b, chromedp.Evaluate[string](`(document.querySelector("table.figures") || {}).innerText || ""`, chromedp.EvalAsValue))
	}
	deadline := time.Now().Add(10 * time.Second)
	for !strings.Contains(figures(), "0.123") {
		if time.Now().After(deadline) {
			t.Fatalf("the page never showed step 4's loss:\n%s", figures())
		}
		time.Sleep(200 * time.Millisecond)
	}
	after := browsertest.Get(b, chromedp.Evaluate[string](`document.querySelector(".charts img").src`, chromedp.EvalAsValue))
	if after == before {
		t.Fatalf("the chart's image was not redrawn: %s", after)
	}
	b.Settle()
	if p := b.Problems(); len(p) > 0 {
		t.Fatalf("the page reported errors:\n%s", strings.Join(p, "\n"))
	}
}
