package train

import (
	"context"
	"fmt"
	"io"
	"path/filepath"
	"sort"
	"strings"

	"github.com/agemem/agemem/internal/chart"
)

// Loop is the skeleton every training run shares (SFT, GRPO, SimCSE):
// optimiser steps up to Steps, each step's metrics appended to
// Out/metrics.jsonl and shown as progress, evaluations and checkpoints at
// their intervals and at the end, and the run's curves drawn from the
// logged series. What a step, an evaluation and a checkpoint are is the
// caller's.
type Loop struct {
	Steps     int
	EvalEvery int // steps between evaluations (0: only at the end)
	SaveEvery int // steps between checkpoints (0: only at the end)
	// EvalFirst evaluates before the first step of a fresh run.
	EvalFirst bool
	Out       string // metrics.jsonl, checkpoint-N/, the plots
	Resumed   bool   // append to an earlier run's metrics.jsonl
	Log       io.Writer
	TTY       bool

	// Step takes optimiser step n (1-based) and returns its metrics and a
	// short status for the progress line.
	Step func(ctx context.Context, n int) (metrics map[string]any, status string, err error)
	// Eval evaluates the model after step n (0: before training); nil for
	// runs without one.
	Eval func(ctx context.Context, n int) (map[string]any, error)
	// Save writes a checkpoint to dir.
	Save func(dir string) error
	// Charts are drawn when the run ends.
	Charts []Chart
}

// Chart is one PNG of logged series against the step.
type Chart struct {
	File, Title string
	YLabel      string // what the values are, with their unit
	// Series are logged keys, drawn in order under their own names;
	// Prefix adds every key that starts with it, named without it.
	Series []string
	Prefix string
}

// Run continues from step done (a resumed run's) to l.Steps and returns
// the run's metrics, still open for the caller's last records (its Close
// is the caller's); on an error they are closed.
func (l Loop) Run(ctx context.Context, done int) (_ *Metrics, err error) {
	m, err := OpenMetrics(filepath.Join(l.Out, "metrics.jsonl"), l.Resumed)
	if err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			m.Close()
		}
	}()
	eval := func(n int) error {
		if l.Eval == nil {
			return nil
		}
		rec, err := l.Eval(ctx, n)
		if err != nil {
			return err
		}
		return m.Log(withStep(rec, n))
	}
	if l.EvalFirst && done == 0 && !l.Resumed {
		if err := eval(0); err != nil {
			return m, err
		}
	}
	prog := NewProgress(l.Log, l.Steps, l.TTY)
	for n := done + 1; n <= l.Steps; n++ {
		if err := ctx.Err(); err != nil {
			return m, err
		}
		rec, status, err := l.Step(ctx, n)
		if err != nil {
			return m, err
		}
		if err := m.Log(withStep(rec, n)); err != nil {
			return m, err
		}
		prog.Update(n, status)
		if n == l.Steps {
			break
		}
		if l.EvalEvery > 0 && n%l.EvalEvery == 0 {
			if err := eval(n); err != nil {
				return m, err
			}
		}
		if l.SaveEvery > 0 && n%l.SaveEvery == 0 {
			if err := l.Save(filepath.Join(l.Out, fmt.Sprintf("checkpoint-%d", n))); err != nil {
				return m, err
			}
		}
	}
	if err := eval(l.Steps); err != nil {
		return m, err
	}
	if err := l.Save(filepath.Join(l.Out, fmt.Sprintf("checkpoint-%d", l.Steps))); err != nil {
		return m, err
	}
	for _, c := range l.Charts {
		var series []chart.Series
		add := func(name, key string) {
			var pts []chart.Point
			for _, p := range m.Series[key] {
				pts = append(pts, chart.Point{X: p.Step, Y: p.Value})
			}
			if len(pts) > 0 {
				series = append(series, chart.Series{Name: name, Points: pts})
			}
		}
		for _, k := range c.Series {
			add(k, k)
		}
		if c.Prefix != "" {
			var keys []string
			for k := range m.Series {
				if strings.HasPrefix(k, c.Prefix) {
					keys = append(keys, k)
				}
			}
			sort.Strings(keys)
			for _, k := range keys {
				add(strings.TrimPrefix(k, c.Prefix), k)
			}
		}
		if len(series) == 0 {
			continue // nothing of this chart was logged (a run without evaluation)
		}
		if err := chart.Lines(filepath.Join(l.Out, c.File), c.Title, "optimiser step", c.YLabel, series); err != nil {
			return m, err
		}
	}
	return m, nil
}

func withStep(rec map[string]any, n int) map[string]any {
	out := map[string]any{"step": n}
	for k, v := range rec {
		out[k] = v
	}
	return out
}
