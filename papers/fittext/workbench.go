package fittext

import (
	"context"
	"fmt"
	"io"

	"github.com/agemem/agemem/bench/workbench"
	"github.com/agemem/agemem/embed"
	"github.com/agemem/agemem/internal/par"
	"github.com/agemem/agemem/llm"
)

// PlayWorkBench plays task with FitText's agent (Search): every
// expansion runs in a fresh sandbox into which its path is replayed, so a
// branch's emails and events are its own; the answer path's calls are
// scored as WorkBench scores a run. A search that found no answer scores
// wrong, as a run that failed does.
func PlayWorkBench(ctx context.Context, d *workbench.Data, s *Search, task workbench.Task) (workbench.Run, Outcome, error) {
	open := func() (World, error) { return d.New().Toolset(nil, nil) }
	out, err := s.Run(ctx, workbench.Prompt, task.Query, open)
	r := workbench.Run{Task: task, Query: task.Query, InputTokens: out.PromptTokens, OutputTokens: out.CompletionTokens}
	if ctx.Err() != nil {
		return r, out, ctx.Err()
	}
	if err != nil {
		r.Error = err.Error()
	} else if !out.Answered {
		r.Error = fmt.Sprintf("no answer after %d model calls", out.Queries)
		if out.ContextFull > 0 {
			r.Error += fmt.Sprintf(" (%d state(s) outgrew the model's context)", out.ContextFull)
		}
	}
	if out.Answered {
		ts, err := d.New().Toolset(nil, func(a workbench.Action) { r.Actions = append(r.Actions, a.String()) })
		if err != nil {
			return r, out, err
		}
		for _, c := range out.Path {
			if _, _, err := ts.Execute(ctx, c); err != nil {
				return r, out, err
			}
		}
	}
	r.Score = d.Grade(r.Actions, task.Answer, r.Error != "")
	return r, out, nil
}

// WorkBench plays the test queries of tasks (after workbench.Split, the queries
// Bench tests) with the search, parallel at once; retrieval names its
// strategy in the table.
func WorkBench(ctx context.Context, d *workbench.Data, tasks []workbench.Task, s *Search, retrieval string, parallel int, log io.Writer) (workbench.Result, error) {
	_, test := workbench.Split(tasks)
	res := workbench.Result{ByDomain: map[string]workbench.Stat{}, Search: &workbench.SearchStats{Retrieval: retrieval}}
	runs := make([]workbench.Run, len(test))
	outs := make([]Outcome, len(test))
	errs := make([]error, len(test))
	par.Each(len(test), parallel, func(i int) {
		runs[i], outs[i], errs[i] = PlayWorkBench(ctx, d, s, test[i])
	}, func(done, i int) {
		if log != nil {
			fmt.Fprintf(log, "dfsdt %s %d/%d correct=%v calls=%d %q\n", retrieval, done, len(test), runs[i].Correct, outs[i].Queries, test[i].Query)
		}
	})
	st := res.Search
	for i, err := range errs {
		if err != nil {
			return res, err
		}
		o := outs[i]
		if o.Answered {
			st.Answered++
		}
		st.Queries += float64(o.Queries)
		st.StrategyCalls += float64(o.StrategyCalls)
		st.Retrievals += float64(o.Retrievals)
		st.Duplicates += float64(o.Duplicates)
		st.Pruned += float64(o.Pruned)
	}
	if n := float64(len(test)); n > 0 { // sums to means
		for _, v := range []*float64{&st.Answered, &st.Queries, &st.StrategyCalls, &st.Retrievals, &st.Duplicates, &st.Pruned} {
			*v /= n
		}
	}
	res.Fill(test, runs)
	return res, nil
}

// WorkBenchRuns plays tasks with FitText's agent on m once for each
// strategy of c.DFSDT.Retrieval, the strategies asking m too (on the
// native engine the agent's and the strategies' calls decode in shared
// steps) over a knowledge base of WorkBench's functions embedded by emb;
// "none" gives the agent every function from the start (plain DFSDT).
func WorkBenchRuns(ctx context.Context, c Config, m llm.Model, emb embed.Embedder, seed uint64, d *workbench.Data, tasks []workbench.Task, parallel int, log io.Writer) ([]workbench.Result, error) {
	ts, err := d.New().Toolset(nil, nil)
	if err != nil {
		return nil, err
	}
	kb, err := WorldKB(ctx, emb, ts.Functions())
	if err != nil {
		return nil, err
	}
	strategies := &ModelLLM{Model: m}
	var results []workbench.Result
	for _, r := range c.DFSDT.Retrieval {
		s := &Search{Model: m, Strategy: r, Config: c.DFSDT}
		if r != "none" {
			s.Retriever = &Retriever{Config: c, KB: kb, LLM: strategies, Seed: seed}
		}
		res, err := WorkBench(ctx, d, tasks, s, r, parallel, log)
		if err != nil {
			return nil, err
		}
		results = append(results, res)
	}
	return results, nil
}
