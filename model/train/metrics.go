package train

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// Metrics appends one JSON object per line to a file and keeps every
// numeric series for the curves.
type Metrics struct {
	f      *os.File
	w      *bufio.Writer
	Series map[string][]Point
}

// Point is one value of a series at a step.
type Point struct{ Step, Value float64 }

// OpenMetrics creates (or, when resuming, appends to) path, and its folder.
func OpenMetrics(path string, appendTo bool) (*Metrics, error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return nil, err
	}
	flags := os.O_CREATE | os.O_WRONLY | os.O_TRUNC
	m := &Metrics{Series: map[string][]Point{}}
	if appendTo {
		flags = os.O_CREATE | os.O_WRONLY | os.O_APPEND
		if err := m.readBack(path); err != nil {
			return nil, err
		}
	}
	f, err := os.OpenFile(path, flags, 0o644)
	if err != nil {
		return nil, err
	}
	m.f, m.w = f, bufio.NewWriter(f)
	return m, nil
}

// readBack loads the series of an earlier run so the curves stay whole.
func (m *Metrics) readBack(path string) error {
	raw, err := os.ReadFile(path)
	if os.IsNotExist(err) {
		return nil
	}
	if err != nil {
		return err
	}
	for i, line := range strings.Split(strings.TrimSpace(string(raw)), "\n") {
		if line == "" {
			continue
		}
		var rec map[string]any
		if err := json.Unmarshal([]byte(line), &rec); err != nil {
			return fmt.Errorf("%s:%d: %w", path, i+1, err)
		}
		m.keep(rec)
	}
	return nil
}

func (m *Metrics) keep(rec map[string]any) {
	step, _ := rec["step"].(float64)
	for k, v := range rec {
		if f, ok := v.(float64); ok && k != "step" {
			m.Series[k] = append(m.Series[k], Point{step, f})
		}
	}
}

// Log writes one record; "step" should be among its keys.
func (m *Metrics) Log(rec map[string]any) error {
	raw, err := json.Marshal(rec)
	if err != nil {
		return err
	}
	var back map[string]any
	json.Unmarshal(raw, &back)
	m.keep(back)
	if _, err := m.w.Write(append(raw, '\n')); err != nil {
		return err
	}
	return m.w.Flush()
}

// Close flushes and closes the file; closing again does nothing.
func (m *Metrics) Close() error {
	if m.f == nil {
		return nil
	}
	f := m.f
	m.f = nil
	if err := m.w.Flush(); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// Progress draws a one-line progress bar on a terminal and plain log lines
// elsewhere (every tenth of the run), with the latest figures.
type Progress struct {
	w        io.Writer
	total    int
	tty      bool
	start    time.Time
	lastTick int
}

// NewProgress reports on w; tty selects the redrawn bar.
func NewProgress(w io.Writer, total int, tty bool) *Progress {
	return &Progress{w: w, total: total, tty: tty, start: time.Now(), lastTick: -1}
}

// Update shows step (1-based) of the total with a status.
func (p *Progress) Update(step int, status string) {
	el := time.Since(p.start)
	eta := time.Duration(0)
	if step > 0 {
		eta = el / time.Duration(step) * time.Duration(p.total-step)
	}
	if p.tty {
		const width = 30
		n := width * step / max(p.total, 1)
		fmt.Fprintf(p.w, "\r[%s%s] %d/%d %s eta %s ", strings.Repeat("=", n), strings.Repeat(" ", width-n), step, p.total, status, eta.Round(time.Second))
		if step == p.total {
			fmt.Fprintln(p.w)
		}
		return
	}
	if tick := 10 * step / max(p.total, 1); tick != p.lastTick || step == p.total {
		p.lastTick = tick
		fmt.Fprintf(p.w, "step %d/%d %s (%s elapsed)\n", step, p.total, status, el.Round(time.Second))
	}
}
