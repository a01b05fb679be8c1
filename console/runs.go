package console

// Training runs as their files hold them: a run is a folder with a
// metrics.jsonl (the trainer's one record per step; GRPO adds
// rollouts.jsonl, one record per rollout). A run still training appends to
// both, so each file is read from where the last read stopped: a page
// costs what was written since, not the run's whole history.

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/agemem/agemem/internal/chart"
)

// liveFor is how recently a run's metrics must have been written for it to
// count as still training (a GRPO step at paper scale takes minutes).
const liveFor = 10 * time.Minute

// maxDepth bounds how deep below the runs folder runs are looked for.
const maxDepth = 5

type runStore struct {
	root string

	mu      sync.Mutex
	found   []runInfo
	evals   []evalFile
	foundAt time.Time
	metrics map[string]*metricsFile
	rolls   map[string]*rolloutFile
	evalMem map[string]*evalFile // by path, while its size and time hold
	charts  svgCache
}

func newRunStore(root string) *runStore {
	return &runStore{root: root, metrics: map[string]*metricsFile{}, rolls: map[string]*rolloutFile{}, evalMem: map[string]*evalFile{}}
}

// runInfo is a run as the list shows it.
type runInfo struct {
	Name     string // its folder below the runs folder, slash-separated
	Dir      string
	Modified time.Time
	Live     bool
	Rollouts bool
}

// scan finds the runs and evaluation reports below the root, at most once
// a second (a list page, then the pages it links to).
func (rs *runStore) scan() ([]runInfo, []evalFile, error) {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	if time.Since(rs.foundAt) < time.Second {
		return rs.found, rs.evals, nil
	}
	var runs []runInfo
	var evals []evalFile
	err := filepath.WalkDir(rs.root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			if path == rs.root {
				return err
			}
			return nil // an unreadable folder below: skip it
		}
		rel, _ := filepath.Rel(rs.root, path)
		name := filepath.ToSlash(rel)
		if d.IsDir() {
			base := d.Name()
			if path != rs.root && (strings.HasPrefix(base, ".") || strings.HasPrefix(base, "checkpoint-") || base == "policy" || base == "val-policy") {
				return fs.SkipDir
			}
			if strings.Count(name, "/") >= maxDepth {
				return fs.SkipDir
			}
			return nil
		}
		switch {
		case d.Name() == "metrics.jsonl":
			info, err := d.Info()
			if err != nil {
				return nil
			}
			dir := filepath.Dir(path)
			rname, _ := filepath.Rel(rs.root, dir)
			r := runInfo{Name: filepath.ToSlash(rname), Dir: dir, Modified: info.ModTime()}
			_, perr := os.Stat(filepath.Join(dir, "policy"))
			r.Live = time.Since(r.Modified) < liveFor && perr != nil
			_, rerr := os.Stat(filepath.Join(dir, "rollouts.jsonl"))
			r.Rollouts = rerr == nil
			runs = append(runs, r)
		case strings.HasSuffix(d.Name(), ".json"):
			if ef := rs.evalAt(path, name, d); ef != nil {
				evals = append(evals, *ef)
			}
		}
		return nil
	})
	if err != nil {
		return nil, nil, fmt.Errorf("runs folder %s: %w", rs.root, err)
	}
	sort.Slice(runs, func(i, j int) bool { return runs[i].Modified.After(runs[j].Modified) })
	rs.found, rs.evals, rs.foundAt = runs, evals, time.Now()
	return runs, evals, nil
}

// run is the run of that name: only a name the scan found, so a request
// cannot name a path of its own.
func (rs *runStore) run(name string) (runInfo, bool) {
	runs, _, err := rs.scan()
	if err != nil {
		return runInfo{}, false
	}
	for _, r := range runs {
		if r.Name == name {
			return r, true
		}
	}
	return runInfo{}, false
}

// tail reads a JSONL file that only grows: each read parses the complete
// lines written since the last; a file that shrank was rewritten (a new
// run in the same folder) and is read again from the start.
type tail struct {
	path  string
	off   int64 // bytes of complete lines consumed
	lines int
	bad   []string // the first malformed lines, "file:line: error"
}

// read calls line for each new complete line with its offset, and reset
// before re-reading a rewritten file.
func (t *tail) read(line func(off int64, raw []byte) error, reset func()) error {
	f, err := os.Open(t.path)
	if err != nil {
		return err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return err
	}
	if st.Size() < t.off {
		t.off, t.lines, t.bad = 0, 0, nil
		reset()
	}
	if st.Size() == t.off {
		return nil
	}
	buf := make([]byte, st.Size()-t.off)
	n, err := f.ReadAt(buf, t.off)
	if err != nil && err != io.EOF {
		return err
	}
	buf = buf[:n]
	for {
		i := bytes.IndexByte(buf, '\n')
		if i < 0 {
			return nil // a line still being written
		}
		raw := buf[:i]
		t.lines++
		if len(bytes.TrimSpace(raw)) > 0 {
			if err := line(t.off, raw); err != nil && len(t.bad) < 5 {
				t.bad = append(t.bad, fmt.Sprintf("%s:%d: %v", t.path, t.lines, err))
			}
		}
		t.off += int64(i + 1)
		buf = buf[i+1:]
	}
}

// metricsFile is a run's metrics.jsonl: every numeric series by step.
type metricsFile struct {
	mu     sync.Mutex
	t      tail
	series map[string][]chart.Point
	last   map[string]float64
	steps  int
}

func (rs *runStore) metricsOf(r runInfo) (*metricsFile, error) {
	rs.mu.Lock()
	m := rs.metrics[r.Dir]
	if m == nil {
		m = &metricsFile{t: tail{path: filepath.Join(r.Dir, "metrics.jsonl")}, series: map[string][]chart.Point{}, last: map[string]float64{}}
		rs.metrics[r.Dir] = m
	}
	rs.mu.Unlock()
	m.mu.Lock()
	defer m.mu.Unlock()
	err := m.t.read(func(_ int64, raw []byte) error {
		var rec map[string]any
		if err := json.Unmarshal(raw, &rec); err != nil {
			return err
		}
		step, ok := rec["step"].(float64)
		if !ok {
			return fmt.Errorf("no step")
		}
		m.steps = max(m.steps, int(step))
		for k, v := range rec {
			if f, ok := v.(float64); ok && k != "step" {
				m.series[k] = append(m.series[k], chart.Point{X: step, Y: f})
				m.last[k] = f
			}
		}
		return nil
	}, func() {
		clear(m.series)
		clear(m.last)
		m.steps = 0
	})
	return m, err
}

// view is a copy of what the charts and tables need, taken under the lock.
type metricsView struct {
	Steps  int
	Keys   []string
	Last   map[string]float64
	Series map[string][]chart.Point
	Bad    []string
	Size   int64
}

func (m *metricsFile) view(keys ...string) metricsView {
	m.mu.Lock()
	defer m.mu.Unlock()
	v := metricsView{Steps: m.steps, Last: map[string]float64{}, Series: map[string][]chart.Point{}, Bad: slices.Clone(m.t.bad), Size: m.t.off}
	for k, x := range m.last {
		v.Keys = append(v.Keys, k)
		v.Last[k] = x
	}
	sort.Strings(v.Keys)
	for _, k := range keys {
		v.Series[k] = slices.Clone(m.series[k])
	}
	return v
}
