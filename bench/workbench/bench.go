package workbench

import (
	"context"
	"fmt"
	"io"
	"maps"
	"math"
	"slices"
	"strings"

	"github.com/agemem/agemem/agent"
	"github.com/agemem/agemem/internal/par"
	"github.com/agemem/agemem/papers/memtoolagent"
)

// Split holds out one query per template to build the memory from
// (MemToolAgent's WorkBench protocol: the first query of each
// base_template, in file order); the rest are the test set.
func Split(tasks []Task) (memory, test []Task) {
	seen := map[string]bool{}
	for _, t := range tasks {
		if !seen[t.BaseTemplate] {
			seen[t.BaseTemplate] = true
			memory = append(memory, t)
			continue
		}
		test = append(test, t)
	}
	return memory, test
}

// Domain is a task's domain as WorkBench reports accuracy: its one
// domain, or "multi_domain".
func (t Task) Domain() string {
	if len(t.Domains) == 1 {
		return t.Domains[0]
	}
	return "multi_domain"
}

// BenchOptions configure a benchmark run.
type BenchOptions struct {
	Model agent.Model
	// Memory, when set, is MemToolAgent's: built from the held-out queries
	// (each played, scored, a failure reflected on by Extractor) and
	// recalled for every test query. Nil plays without memory.
	Memory    *memtoolagent.Memory
	Extractor agent.Model // nil: Model
	// Online adds each test query's entry to the memory as it is scored.
	Online bool
	// HardPreference is MemToolAgent's Hard Preference Guiding: the tools
	// the recalled failures used that no recalled success used are taken
	// out of the agent's tool set (no extractor call needed).
	HardPreference bool
	Limits         agent.Limits
	Log            io.Writer
	// Parallel test queries are played at once (their model calls batch on
	// the native engine); the held-out queries that build the memory, and
	// every query with Online, go one at a time, in order.
	Parallel int
}

// Result is a benchmark run.
type Result struct {
	Memory bool `json:"memory"`
	// Search is set when FitText's agent played (SearchBench).
	Search     *SearchStats    `json:"search,omitempty"`
	Accuracy   Stat            `json:"accuracy"`
	ByDomain   map[string]Stat `json:"by_domain"`
	ExactMatch float64         `json:"exact_match"`
	// SideEffects is the share of test queries whose actions changed the
	// state wrongly.
	SideEffects float64 `json:"side_effects"`
	// InputTokens and OutputTokens are the agent's means per test query.
	InputTokens  float64 `json:"input_tokens"`
	OutputTokens float64 `json:"output_tokens"`
	// MemorySize is the entries stored before the test queries; Recalled
	// the entries each test query was shown.
	MemorySize int   `json:"memory_size"`
	Recalled   []int `json:"recalled,omitempty"`
	// ExtractorErrors counts failures stored without a reflection because
	// the extractor failed.
	ExtractorErrors int   `json:"extractor_errors,omitempty"`
	Runs            []Run `json:"runs"`
}

// Stat is a share with its standard error and count.
type Stat struct {
	Mean float64 `json:"mean"`
	SE   float64 `json:"se"`
	N    int     `json:"n"`
}

func statOf(v []bool) Stat {
	if len(v) == 0 {
		return Stat{}
	}
	var k float64
	for _, b := range v {
		if b {
			k++
		}
	}
	p := k / float64(len(v))
	s := Stat{Mean: p, N: len(v)}
	if len(v) > 1 {
		s.SE = math.Sqrt(p * (1 - p) / float64(len(v)-1))
	}
	return s
}

// Bench plays the test queries of tasks (after Split) with o.Model, with
// the memory built from the held-out ones when o.Memory is set.
func (d *Data) Bench(ctx context.Context, tasks []Task, o BenchOptions) (Result, error) {
	memTasks, test := Split(tasks)
	res := Result{Memory: o.Memory != nil, ByDomain: map[string]Stat{}}
	logf := func(format string, a ...any) {
		if o.Log != nil {
			fmt.Fprintf(o.Log, format, a...)
		}
	}
	ext := o.Extractor
	if ext == nil {
		ext = o.Model
	}
	learn := func(r Run) error {
		e := memtoolagent.Entry{Query: r.Query, Actions: r.Actions}
		if r.Correct {
			e.Feedback = 1
		} else {
			similar, err := o.Memory.Recall(ctx, r.Query)
			if err != nil {
				return err
			}
			tools, _ := d.New().Toolset(nil, nil)
			e.Reflection, err = memtoolagent.Reflect(ctx, ext, memtoolagent.ExtractorPrompt(Prompt, memtoolagent.ToolList(tools.Specs()), similar, r.Execution()), r.Query)
			if ctx.Err() != nil {
				return ctx.Err()
			}
			if err != nil {
				// The entry is kept without a reflection: one failed
				// extraction (a prompt too long for the model, a server
				// error) should not end the benchmark.
				res.ExtractorErrors++
				logf("memory extractor: %v\n", err)
			}
		}
		return o.Memory.Add(ctx, e)
	}
	if o.Memory != nil {
		for i, t := range memTasks {
			r, err := d.Play(ctx, o.Model, t, Prompt, o.Limits)
			if err != nil {
				return res, err
			}
			if err := learn(r); err != nil {
				return res, err
			}
			logf("memory %d/%d correct=%v %q\n", i+1, len(memTasks), r.Correct, t.Query)
		}
		res.MemorySize = len(memTasks)
	}
	type played struct {
		r   Run
		rec int
		err error
	}
	play := func(t Task) played {
		system := Prompt
		var without []string
		rec := 0
		if o.Memory != nil {
			recalled, err := o.Memory.Recall(ctx, t.Query)
			if err != nil {
				return played{err: err}
			}
			rec = len(recalled)
			system = memtoolagent.AgentPrompt(Prompt, recalled)
			if o.HardPreference {
				without = Disliked(recalled)
			}
		}
		r, err := d.Play(ctx, o.Model, t, system, o.Limits, without...)
		if err == nil && o.Memory != nil && o.Online {
			err = learn(r)
		}
		return played{r, rec, err}
	}
	results := make([]played, len(test))
	workers := max(o.Parallel, 1)
	if o.Online {
		workers = 1
	}
	par.Each(len(test), workers, func(i int) {
		results[i] = play(test[i])
	}, func(done, i int) {
		logf("test %d/%d correct=%v %q\n", done, len(test), results[i].r.Correct, test[i].Query)
	})
	runs := make([]Run, len(test))
	for i, p := range results {
		if p.err != nil {
			return res, p.err
		}
		runs[i] = p.r
		if o.Memory != nil {
			res.Recalled = append(res.Recalled, p.rec)
		}
	}
	res.score(test, runs)
	return res, nil
}

// score fills in the result's runs and their statistics.
func (res *Result) score(test []Task, runs []Run) {
	byDomain := map[string][]bool{}
	var all []bool
	for i, t := range test {
		r := runs[i]
		res.Runs = append(res.Runs, r)
		all = append(all, r.Correct)
		byDomain[t.Domain()] = append(byDomain[t.Domain()], r.Correct)
		if r.ExactMatch {
			res.ExactMatch += 1 / float64(len(test))
		}
		if r.SideEffects {
			res.SideEffects += 1 / float64(len(test))
		}
		res.InputTokens += float64(r.InputTokens) / float64(len(test))
		res.OutputTokens += float64(r.OutputTokens) / float64(len(test))
	}
	res.Accuracy = statOf(all)
	for k, v := range byDomain {
		res.ByDomain[k] = statOf(v)
	}
}

// Disliked are the tools of the failed entries that no correct entry
// among them used (Hard Preference Guiding's "tools with a rating of 0").
func Disliked(entries []memtoolagent.Entry) []string {
	bad, good := map[string]bool{}, map[string]bool{}
	for _, e := range entries {
		for _, a := range e.Actions {
			act, err := ParseAction(a)
			if err != nil {
				continue
			}
			if e.Feedback == 1 {
				good[act.Tool] = true
			} else {
				bad[act.Tool] = true
			}
		}
	}
	for t := range good {
		delete(bad, t)
	}
	return slices.Sorted(maps.Keys(bad))
}

// Domains are the domains of results, sorted.
func Domains(rs []Result) []string {
	seen := map[string]bool{}
	for _, r := range rs {
		for k := range r.ByDomain {
			seen[k] = true
		}
	}
	return slices.Sorted(maps.Keys(seen))
}

// Label names a result's agent: "memory on" or "memory off" for the
// function-calling loop, "dfsdt <retrieval>" for FitText's.
func (res Result) Label() string {
	switch {
	case res.Search != nil:
		return "dfsdt " + res.Search.Retrieval
	case res.Memory:
		return "memory on"
	}
	return "memory off"
}

// Print writes results as a table: accuracy overall and per domain with
// standard errors, exact match, wrong side effects, memory size and the
// mean entries recalled; for searches, the mean model calls a query.
func Print(w io.Writer, rs []Result) {
	doms := Domains(rs)
	fmt.Fprintf(w, "%-18s %-16s", "agent", "accuracy")
	for _, d := range doms {
		fmt.Fprintf(w, " %-16s", d)
	}
	fmt.Fprintf(w, " %-11s %-12s %-11s %s\n", "exact match", "side effects", "memory size", "recalled (mean)")
	for _, r := range rs {
		fmt.Fprintf(w, "%-18s %-16s", r.Label(), fmtStat(r.Accuracy))
		for _, d := range doms {
			fmt.Fprintf(w, " %-16s", fmtStat(r.ByDomain[d]))
		}
		var rec float64
		for _, n := range r.Recalled {
			rec += float64(n) / float64(len(r.Recalled))
		}
		fmt.Fprintf(w, " %-11.3f %-12.3f %-11d %.1f\n", r.ExactMatch, r.SideEffects, r.MemorySize, rec)
	}
	for _, r := range rs {
		if r.InputTokens+r.OutputTokens > 0 {
			fmt.Fprintf(w, "%s: %.0f input and %.0f output tokens a query\n", r.Label(), r.InputTokens, r.OutputTokens)
		}
	}
	for _, r := range rs {
		if st := r.Search; st != nil {
			fmt.Fprintf(w, "%s: %.1f agent calls, %.1f strategy calls, %.2f retrievals (%.2f duplicates skipped), %.1f pruned a query; %.3f answered\n",
				r.Label(), st.Queries, st.StrategyCalls, st.Retrievals, st.Duplicates, st.Pruned, st.Answered)
		}
	}
}

func fmtStat(s Stat) string { return strings.TrimSpace(fmt.Sprintf("%.3f ± %.3f", s.Mean, s.SE)) }
