package workbench

import (
	"context"
	"fmt"
	"io"

	"github.com/agemem/agemem/internal/par"
	"github.com/agemem/agemem/papers/fittext"
)

// SearchStats are a search run's means per query.
type SearchStats struct {
	Retrieval     string  `json:"retrieval"` // the FitText strategy, or "none"
	Answered      float64 `json:"answered"`
	Queries       float64 `json:"agent_calls"`
	StrategyCalls float64 `json:"strategy_calls"`
	Retrievals    float64 `json:"retrievals"`
	Duplicates    float64 `json:"duplicates"`
	Pruned        float64 `json:"pruned"`
}

// PlaySearch plays task with FitText's agent (fittext.Search): every
// expansion runs in a fresh sandbox into which its path is replayed, so a
// branch's emails and events are its own; the answer path's calls are
// scored as WorkBench scores a run. A search that found no answer scores
// wrong, as a run that failed does.
func (d *Data) PlaySearch(ctx context.Context, s *fittext.Search, task Task) (Run, fittext.Outcome, error) {
	open := func() (fittext.World, error) { return d.New().Toolset(nil, nil) }
	out, err := s.Run(ctx, Prompt, task.Query, open)
	r := Run{Task: task, Query: task.Query, InputTokens: out.PromptTokens, OutputTokens: out.CompletionTokens}
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
		ts, err := d.New().Toolset(nil, func(a Action) { r.Actions = append(r.Actions, a.String()) })
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

// SearchBench plays the test queries of tasks (after Split, the queries
// Bench tests) with the search, parallel at once; retrieval names its
// strategy in the table.
func (d *Data) SearchBench(ctx context.Context, tasks []Task, s *fittext.Search, retrieval string, parallel int, log io.Writer) (Result, error) {
	_, test := Split(tasks)
	res := Result{ByDomain: map[string]Stat{}, Search: &SearchStats{Retrieval: retrieval}}
	runs := make([]Run, len(test))
	outs := make([]fittext.Outcome, len(test))
	errs := make([]error, len(test))
	par.Each(len(test), parallel, func(i int) {
		runs[i], outs[i], errs[i] = d.PlaySearch(ctx, s, test[i])
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
	res.score(test, runs)
	return res, nil
}
