package console_test

import (
	"strings"
	"testing"

	"github.com/chromedp/chromedp"

	"github.com/agemem/agemem/console/browsertest"
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

	b.Do(chromedp.Click(chromedp.CSS(`a[href="/ui/runs/run?name=tiny%2frl"]`)), chromedp.WaitVisible(chromedp.CSS(".charts")))
	imagesDrawn("run page")
	if n := len(browsertest.Get(b, chromedp.Nodes(chromedp.CSSAll(".charts img")))); n < 2 {
		t.Fatalf("the run page draws %d charts, want the reward's and KL's at least", n)
	}
	b.Screenshot("console-run")

	// Both runs on one chart, chosen on the list.
	b.Do(chromedp.Navigate(ts.URL+"/ui/runs"),
		chromedp.Click(chromedp.CSS(`input[value="tiny/rl"]`)), chromedp.Click(chromedp.CSS(`input[value="tiny/rl-t1.0"]`)),
		chromedp.Submit(chromedp.CSS(`input[value="tiny/rl"]`)), chromedp.WaitVisible(chromedp.CSS(".charts")))
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

	b.Do(chromedp.Click(chromedp.CSS(`table.groups a[href*="/ui/runs/group?"]`)), chromedp.WaitVisible(chromedp.CSS("table.rollouts")))
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
