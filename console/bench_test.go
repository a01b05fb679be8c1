package console_test

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// scaleRun writes a GRPO run of at least n rollouts into dir/big: the
// small real run's records (metrics.jsonl, rollouts.jsonl with their
// trajectories) repeated over as many steps as it takes, renumbered, so the
// pages read files of a long run's size and shape.
func scaleRun(b *testing.B, small, dir string, n int) (rollouts int, bytes int64) {
	read := func(name string) []map[string]json.RawMessage {
		raw, err := os.ReadFile(filepath.Join(small, name))
		if err != nil {
			b.Fatal(err)
		}
		var out []map[string]json.RawMessage
		for _, line := range strings.Split(strings.TrimSpace(string(raw)), "\n") {
			var m map[string]json.RawMessage
			if err := json.Unmarshal([]byte(line), &m); err != nil {
				b.Fatal(err)
			}
			out = append(out, m)
		}
		return out
	}
	metrics, rolls := read("metrics.jsonl"), read("rollouts.jsonl")
	out := filepath.Join(dir, "big")
	os.MkdirAll(out, 0o755)
	mf, _ := os.Create(filepath.Join(out, "metrics.jsonl"))
	rf, _ := os.Create(filepath.Join(out, "rollouts.jsonl"))
	mw, rw := bufio.NewWriter(mf), bufio.NewWriter(rf)
	// Each step of the big run holds every rollout of the small one, its
	// groups renumbered: (small step, group) pairs become the step's groups.
	step := 0
	for rollouts < n {
		step++
		m := maps(metrics[(step-1)%len(metrics)])
		m["step"] = json.RawMessage(fmt.Sprint(step))
		raw, _ := json.Marshal(m)
		mw.Write(append(raw, '\n'))
		groupOf := map[[2]int]int{}
		for _, r := range rolls {
			var s, g int
			json.Unmarshal(r["step"], &s)
			json.Unmarshal(r["group"], &g)
			gi, ok := groupOf[[2]int{s, g}]
			if !ok {
				gi = len(groupOf)
				groupOf[[2]int{s, g}] = gi
			}
			c := maps(r)
			c["step"], c["group"] = json.RawMessage(fmt.Sprint(step)), json.RawMessage(fmt.Sprint(gi))
			raw, _ := json.Marshal(c)
			rw.Write(append(raw, '\n'))
			rollouts++
		}
	}
	mw.Flush()
	rw.Flush()
	mf.Close()
	rf.Close()
	st, _ := os.Stat(filepath.Join(out, "rollouts.jsonl"))
	return rollouts, st.Size()
}

func maps(m map[string]json.RawMessage) map[string]json.RawMessage {
	c := make(map[string]json.RawMessage, len(m))
	for k, v := range m {
		c[k] = v
	}
	return c
}

// median is the median time of n requests of path.
func median(b *testing.B, c *http.Client, url string, n int) time.Duration {
	ds := make([]time.Duration, n)
	for i := range ds {
		t0 := time.Now()
		resp, err := c.Get(url)
		if err != nil {
			b.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 {
			b.Fatalf("%s: %d", url, resp.StatusCode)
		}
		ds[i] = time.Since(t0)
	}
	slices.Sort(ds)
	return ds[n/2]
}

// BenchmarkRunPages: the training pages of a run of 10,000 rollouts (with
// their trajectories), each page's median latency over HTTP beside its
// anchor, reading rollouts.jsonl whole with encoding/json (what a page
// that did not index the file would pay on every view). The first view
// of a run indexes the file once; after that a page reads only what it
// shows, and a run still training only what was appended.
func BenchmarkRunPages(b *testing.B) {
	dir := b.TempDir()
	n, size := scaleRun(b, filepath.Join(runsDir(b), "tiny", "rl"), dir, 10000)
	for range b.N {
		t0 := time.Now()
		raw, err := os.ReadFile(filepath.Join(dir, "big", "rollouts.jsonl"))
		if err != nil {
			b.Fatal(err)
		}
		for _, line := range bytes.Split(bytes.TrimSpace(raw), []byte("\n")) {
			var m map[string]any
			if err := json.Unmarshal(line, &m); err != nil {
				b.Fatal(err)
			}
		}
		anchor := time.Since(t0)

		// A fresh console per iteration, so its first view is cold.
		ts := runsConsole(b, dir)
		c, u := ts.Client(), ts.URL+"/ui/runs"
		t0 = time.Now()
		median(b, c, u+"/rollouts?run=big", 1)
		cold := time.Since(t0)
		pages := []struct{ name, path string }{
			{"runs list", ""},
			{"run page", "/run?name=big"},
			{"reward chart (cached)", "/chart.svg?run=big&metric=reward&metric=r_task&smooth=0"},
			{"rollouts of the last step", "/rollouts?run=big"},
			{"rollouts of step 1", "/rollouts?run=big&step=1"},
			{"a group's 4 trajectories", "/group?run=big&step=100&group=1"},
		}
		var lines []string
		for _, p := range pages {
			d := median(b, c, u+p.path, 21)
			b.ReportMetric(float64(d.Microseconds())/1000, strings.ReplaceAll(p.name, " ", "-")+"-ms")
			lines = append(lines, fmt.Sprintf("  %-28s %8.2f ms  (%.4fx the anchor)", p.name, float64(d.Microseconds())/1000, float64(d)/float64(anchor)))
		}
		// A chart drawn afresh: a new smoothing window each time.
		t0 = time.Now()
		for w := 2; w < 7; w++ {
			median(b, c, fmt.Sprintf("%s/chart.svg?run=big&metric=reward&metric=r_task&smooth=%d", u, w), 1)
		}
		draw := time.Since(t0) / 5
		b.ReportMetric(float64(draw.Microseconds())/1000, "chart-drawn-ms")
		b.ReportMetric(float64(anchor.Microseconds())/1000, "anchor-read-whole-ms")
		b.Logf("run of %d rollouts (rollouts.jsonl %.1f MiB); anchor, reading it whole with encoding/json: %.1f ms\n"+
			"  first view (indexes the file) %8.2f ms  (%.4fx the anchor)\n%s\n  a chart drawn afresh         %8.2f ms  (%.4fx the anchor)",
			n, float64(size)/(1<<20), float64(anchor.Microseconds())/1000, float64(cold.Microseconds())/1000, float64(cold)/float64(anchor),
			strings.Join(lines, "\n"), float64(draw.Microseconds())/1000, float64(draw)/float64(anchor))
	}
}
