package memtoolagent

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"strings"

	"github.com/agemem/agemem/bench/nestful"
	"github.com/agemem/agemem/internal/par"
	"github.com/agemem/agemem/llm"
)

// NestfulPrompt is the agent's system prompt for s with the recalled entries
// (Figure 18: "Example Query" / "Tool Calls Used" / "Reflection/Critic",
// a line of '=' between entries; a correct entry's critic is "correct tool
// calls"). With nothing recalled it is the instructions alone.
func NestfulPrompt(s nestful.Sample, recalled []Entry) string {
	p := nestful.System(s)
	if len(recalled) == 0 {
		return p
	}
	var b strings.Builder
	b.WriteString(p + "\nHere are some examples and what was wrong with the agent response:\n")
	for i, e := range recalled {
		if i > 0 {
			b.WriteString("=====\n")
		}
		critic := "correct tool calls"
		if e.Feedback != 1 {
			critic = e.Reflection
			if critic == "" {
				critic = "incorrect tool calls"
			}
		}
		fmt.Fprintf(&b, "Example Query: %s\nTool Calls Used: [%s]\nReflection/Critic: %s\n", e.Query, strings.Join(e.Actions, ", "), critic)
	}
	b.WriteString("Use these insights to avoid similar mistakes. Consider these examples when solving the current task.")
	return b.String()
}

// NestfulOptions configure a run.
type NestfulOptions struct {
	Model llm.Model
	// Memory, when set, is MemToolAgent's: built from the memory samples
	// (each played and scored; a failure reflected on by Extractor, nil:
	// Model) and recalled for every test sample. Nil plays without.
	Memory    *Memory
	Extractor llm.Model
	// Exec, when set, executes every parsed prediction for the win rate.
	Exec     *nestful.Executor
	Log      io.Writer
	Parallel int // test samples played at once
}

// actions writes calls for a memory entry, one JSON object each.
func actions(calls []nestful.Call) []string {
	out := make([]string, len(calls))
	for i, c := range calls {
		b, _ := json.Marshal(c)
		out[i] = string(b)
	}
	return out
}

// Nestful plays test with o.Model, with the memory built from memory first
// when o.Memory is set (MemToolAgent's protocol: the first 500 samples are
// the test set, the next 500 populate the memory).
func Nestful(ctx context.Context, test, memory []nestful.Sample, o NestfulOptions) (nestful.Result, error) {
	res := nestful.Result{Memory: o.Memory != nil}
	logf := func(format string, a ...any) {
		if o.Log != nil {
			fmt.Fprintf(o.Log, format, a...)
		}
	}
	if o.Memory != nil {
		ext := o.Extractor
		if ext == nil {
			ext = o.Model
		}
		for i, s := range memory {
			r, err := nestful.Play(ctx, o.Model, o.Exec, s, nestful.System(s))
			if err != nil {
				return res, err
			}
			e := Entry{Query: s.Input, Actions: actions(r.Calls)}
			if r.Correct() {
				e.Feedback = 1
			} else {
				similar, err := o.Memory.Recall(ctx, s.Input)
				if err != nil {
					return res, err
				}
				tools, _ := json.MarshalIndent(s.Tools, "", " ")
				execution := "Answer: " + r.Answer
				if r.ExecError != "" {
					execution += "\nExecution error: " + r.ExecError
				}
				e.Reflection, err = Reflect(ctx, ext, ExtractorPrompt(strings.Replace(nestful.Instructions, "{TOOLS}", "(below)", 1), string(tools), similar, execution), s.Input)
				if ctx.Err() != nil {
					return res, ctx.Err()
				}
				if err != nil {
					// Kept without a reflection: one failed extraction
					// should not end the benchmark.
					res.ExtractorErrors++
					logf("memory extractor: %v\n", err)
				}
			}
			if err := o.Memory.Add(ctx, e); err != nil {
				return res, err
			}
			logf("memory %d/%d correct=%v\n", i+1, len(memory), r.Correct())
		}
		res.MemorySize = len(memory)
	}
	runs := make([]nestful.Run, len(test))
	errs := make([]error, len(test))
	par.Each(len(test), o.Parallel, func(i int) {
		var recalled []Entry
		if o.Memory != nil {
			if recalled, errs[i] = o.Memory.Recall(ctx, test[i].Input); errs[i] != nil {
				return
			}
		}
		runs[i], errs[i] = nestful.Play(ctx, o.Model, o.Exec, test[i], NestfulPrompt(test[i], recalled))
		runs[i].Recalled = len(recalled)
	}, func(done, i int) {
		logf("test %d/%d full=%v partial=%.2f\n", done, len(test), runs[i].Full, runs[i].Partial)
	})
	for i := range runs {
		if errs[i] != nil {
			return res, errs[i]
		}
	}
	scored := nestful.Tally(test, runs)
	scored.Memory, scored.MemorySize, scored.ExtractorErrors = res.Memory, res.MemorySize, res.ExtractorErrors
	return scored, nil
}
