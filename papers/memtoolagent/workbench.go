package memtoolagent

import (
	"context"
	"fmt"
	"io"
	"maps"
	"slices"

	"github.com/agemem/agemem/agent"
	"github.com/agemem/agemem/bench/workbench"
	"github.com/agemem/agemem/internal/par"
	"github.com/agemem/agemem/llm"
)

// WorkBenchOptions configure a run of MemToolAgent on WorkBench.
type WorkBenchOptions struct {
	Model llm.Model
	// Memory, when set, is MemToolAgent's: built from the held-out queries
	// (each played, scored, a failure reflected on by Extractor) and
	// recalled for every test query. Nil plays without memory.
	Memory    *Memory
	Extractor llm.Model // nil: Model
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

// WorkBench plays the test queries of tasks (after workbench.Split) with o.Model, with
// the memory built from the held-out ones when o.Memory is set.
func WorkBench(ctx context.Context, d *workbench.Data, tasks []workbench.Task, o WorkBenchOptions) (workbench.Result, error) {
	memTasks, test := workbench.Split(tasks)
	res := workbench.Result{Memory: o.Memory != nil, ByDomain: map[string]workbench.Stat{}}
	logf := func(format string, a ...any) {
		if o.Log != nil {
			fmt.Fprintf(o.Log, format, a...)
		}
	}
	ext := o.Extractor
	if ext == nil {
		ext = o.Model
	}
	learn := func(r workbench.Run) error {
		e := Entry{Query: r.Query, Actions: r.Actions}
		if r.Correct {
			e.Feedback = 1
		} else {
			similar, err := o.Memory.Recall(ctx, r.Query)
			if err != nil {
				return err
			}
			tools, _ := d.New().Toolset(nil, nil)
			e.Reflection, err = Reflect(ctx, ext, ExtractorPrompt(workbench.Prompt, ToolList(tools.Functions()), similar, r.Execution()), r.Query)
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
			r, err := d.Play(ctx, o.Model, t, workbench.Prompt, o.Limits)
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
		r   workbench.Run
		rec int
		err error
	}
	play := func(t workbench.Task) played {
		system := workbench.Prompt
		var without []string
		rec := 0
		if o.Memory != nil {
			recalled, err := o.Memory.Recall(ctx, t.Query)
			if err != nil {
				return played{err: err}
			}
			rec = len(recalled)
			system = AgentPrompt(workbench.Prompt, recalled)
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
	runs := make([]workbench.Run, len(test))
	for i, p := range results {
		if p.err != nil {
			return res, p.err
		}
		runs[i] = p.r
		if o.Memory != nil {
			res.Recalled = append(res.Recalled, p.rec)
		}
	}
	res.Fill(test, runs)
	return res, nil
}

// Disliked are the tools of the failed entries that no correct entry
// among them used (Hard Preference Guiding's "tools with a rating of 0").
func Disliked(entries []Entry) []string {
	bad, good := map[string]bool{}, map[string]bool{}
	for _, e := range entries {
		for _, a := range e.Actions {
			act, err := workbench.ParseAction(a)
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
