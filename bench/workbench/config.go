package workbench

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"

	"github.com/agemem/agemem/internal/chart"
	"github.com/agemem/agemem/internal/valid"
)

// Config is the "workbench" section: the sandbox and the queries a run
// plays (agemem-train tools run --env workbench) and where its report goes.
type Config struct {
	// Data is a sandbox directory ("": the published one, embedded).
	Data string `yaml:"data"`
	// Tasks are queries-and-answers CSV files (empty: the embedded
	// analytics, calendar and email sets).
	Tasks []string `yaml:"tasks"`
	// Limit plays only the first Limit queries (0: all).
	Limit int `yaml:"limit"`
	// Parallel test queries are played at once (on the native engine
	// their calls decode together).
	Parallel int `yaml:"parallel"`
	// Out receives report.json and accuracy.png.
	Out string `yaml:"out"`
}

// EmbeddedSets are the query sets shipped with the sandbox, the default
// tasks.
var EmbeddedSets = []string{"analytics", "calendar", "email"}

// DefaultConfig plays every embedded query, four at a time.
func DefaultConfig() Config {
	return Config{Tasks: []string{}, Parallel: 4, Out: "runs/workbench"}
}

// Validate checks every key.
func (c Config) Validate() error {
	var e valid.Errors
	for i, t := range c.Tasks {
		if t == "" {
			e.Add(fmt.Sprintf("tasks[%d]", i), `"": want a queries-and-answers CSV file`)
		}
	}
	if c.Limit < 0 {
		e.Add("limit", "%d: want 0 (all queries) or more", c.Limit)
	}
	e.AtLeast("parallel", c.Parallel, 1)
	if c.Out == "" {
		e.Add("out", `"": want the folder for report.json and accuracy.png`)
	}
	return e.Err()
}

// Load reads the sandbox and the queries the section names, the first
// Limit of them.
func (c Config) Load() (*Data, []Task, error) {
	d := Default()
	if c.Data != "" {
		var err error
		if d, err = Load(c.Data); err != nil {
			return nil, nil, err
		}
	}
	var tasks []Task
	if len(c.Tasks) == 0 {
		for _, set := range EmbeddedSets {
			ts, err := EmbeddedTasks(set)
			if err != nil {
				return nil, nil, err
			}
			tasks = append(tasks, ts...)
		}
	}
	for _, f := range c.Tasks {
		ts, err := LoadTasks(f)
		if err != nil {
			return nil, nil, err
		}
		tasks = append(tasks, ts...)
	}
	if c.Limit > 0 && len(tasks) > c.Limit {
		tasks = tasks[:c.Limit]
	}
	return d, tasks, nil
}

// WriteReport writes dir/report.json (every run's calls and scores) and
// dir/accuracy.png (accuracy by domain, a bar a run) and returns their
// paths.
func WriteReport(dir string, rs []Result) ([]string, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	report, png := filepath.Join(dir, "report.json"), filepath.Join(dir, "accuracy.png")
	raw, err := json.MarshalIndent(rs, "", "  ")
	if err != nil {
		return nil, err
	}
	if err := os.WriteFile(report, append(raw, '\n'), 0o644); err != nil {
		return nil, err
	}
	if err := accuracyChart(png, rs); err != nil {
		return nil, err
	}
	return []string{report, png}, nil
}

// accuracyChart draws accuracy per domain, one bar a run.
func accuracyChart(path string, rs []Result) error {
	doms := append([]string{"all"}, Domains(rs)...)
	var names []string
	var vals, errs [][]float64
	for _, r := range rs {
		names = append(names, r.Label())
		var v, e []float64
		for _, d := range doms {
			s := r.Accuracy
			if d != "all" {
				s = r.ByDomain[d]
			}
			v, e = append(v, s.Mean), append(e, s.SE)
		}
		vals, errs = append(vals, v), append(errs, e)
	}
	return chart.Bars(path, "WorkBench: accuracy by domain (mean and standard error)", "accuracy (0 to 1)", names, doms, vals, errs)
}
