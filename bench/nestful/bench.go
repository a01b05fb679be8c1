package nestful

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"strings"

	"github.com/agemem/agemem/agent"
	"github.com/agemem/agemem/internal/par"
	"github.com/agemem/agemem/papers/memtoolagent"
)

// Instructions is NESTFUL's system prompt (MemToolAgent, Figure 18), the
// sample's tools in JSON where {TOOLS} stands.
const Instructions = `You are a helpful assistant with access to the following function calls. Your task is to produce a sequence of function calls necessary to generate response to the user utterance. Here is a list of functions in JSON format that you can invoke: {TOOLS}
DO NOT try to answer the user question, just invoke the tools needed to respond to the user, if any. The output MUST strictly adhere to the following JSON format: [{"name": "func_name1", "arguments": {"argument1": "value1", "argument2": "value2"}, "label": "$var_1"}, ... (more tool calls as required)]. Please make sure the parameter type is correct and follow the documentation for parameter format. If no function call is needed, please directly output an empty list.`

// Prompt is the agent's system prompt for s with the recalled entries
// (Figure 18: "Example Query" / "Tool Calls Used" / "Reflection/Critic",
// a line of '=' between entries; a correct entry's critic is "correct tool
// calls"). With nothing recalled it is the instructions alone.
func Prompt(s Sample, recalled []memtoolagent.Entry) string {
	var tools strings.Builder
	enc := json.NewEncoder(&tools)
	enc.SetEscapeHTML(false) // "<" as written, not \u003c
	enc.Encode(s.Tools)
	p := strings.Replace(Instructions, "{TOOLS}", strings.TrimSpace(tools.String()), 1)
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

// Run is one played sample.
type Run struct {
	ID     string `json:"sample_id"`
	Query  string `json:"query"`
	Answer string `json:"answer"` // the model's text
	Calls  []Call `json:"calls,omitempty"`
	// Error is why the model gave no answer (its server, a prompt over
	// its context); ParseError is set when the answer held no call
	// sequence. Every metric is then 0.
	Error      string `json:"error,omitempty"`
	ParseError string `json:"parse_error,omitempty"`
	// BadCalls counts elements of the answer's list that were not calls.
	BadCalls int `json:"bad_calls,omitempty"`
	Scores
	// Win is set when the calls were executed: whether they returned the
	// gold answer (Answer, as Python prints it); ExecError is why they did
	// not run through.
	Win        *bool  `json:"win,omitempty"`
	ExecAnswer string `json:"exec_answer,omitempty"`
	ExecError  string `json:"exec_error,omitempty"`
	Recalled   int    `json:"recalled"`
	// PromptTokens and CompletionTokens are the model's counts, where it
	// reports them.
	PromptTokens     int `json:"prompt_tokens"`
	CompletionTokens int `json:"completion_tokens"`
}

// Correct is the feedback a memory entry gets: the win when executed,
// else the full sequence match.
func (r Run) Correct() bool {
	if r.Win != nil {
		return *r.Win
	}
	return r.Full
}

// Stat is a mean with its standard error and count.
type Stat struct {
	Mean float64 `json:"mean"`
	SE   float64 `json:"se"`
	N    int     `json:"n"`
}

func statOf(v []float64) Stat {
	s := Stat{N: len(v)}
	if len(v) == 0 {
		return s
	}
	for _, x := range v {
		s.Mean += x
	}
	s.Mean /= float64(len(v))
	if len(v) > 1 {
		var ss float64
		for _, x := range v {
			ss += (x - s.Mean) * (x - s.Mean)
		}
		s.SE = math.Sqrt(ss / float64(len(v)-1) / float64(len(v)))
	}
	return s
}

// Result is a benchmark run.
type Result struct {
	Memory bool `json:"memory"`
	// F1Function and F1Param are over the corpus (macro F1, the
	// scorer's): no per-sample spread.
	F1Function float64 `json:"f1_function"`
	F1Param    float64 `json:"f1_param"`
	Partial    Stat    `json:"partial_sequence"`
	Full       Stat    `json:"full_sequence"`
	// Win is over the executed samples (none without an Executor).
	Win Stat `json:"win_rate"`
	// Unparsed counts answers with no call sequence in them, Errors the
	// samples the model gave no answer for.
	Unparsed int `json:"unparsed"`
	Errors   int `json:"errors"`
	// MemorySize is the entries stored before the test samples.
	MemorySize      int     `json:"memory_size"`
	ExtractorErrors int     `json:"extractor_errors,omitempty"`
	PromptTokens    float64 `json:"prompt_tokens"`
	Runs            []Run   `json:"runs"`
}

// BenchOptions configure a run.
type BenchOptions struct {
	Model agent.Model
	// Memory, when set, is MemToolAgent's: built from the memory samples
	// (each played and scored; a failure reflected on by Extractor, nil:
	// Model) and recalled for every test sample. Nil plays without.
	Memory    *memtoolagent.Memory
	Extractor agent.Model
	// Exec, when set, executes every parsed prediction for the win rate.
	Exec     *Executor
	Log      io.Writer
	Parallel int // test samples played at once
}

// Play asks the model for s's call sequence under system and scores it.
func Play(ctx context.Context, m agent.Model, ex *Executor, s Sample, system string) (Run, error) {
	r := Run{ID: s.ID, Query: s.Input}
	rep, err := m.Chat(ctx, []agent.Message{{Role: "system", Content: system}, {Role: "user", Content: s.Input}}, nil)
	if err != nil {
		if ctx.Err() != nil {
			return r, ctx.Err()
		}
		// Scored as a failure, as WorkBench's runs are: one prompt too
		// long for the model should not end a 500-sample run.
		r.Error = err.Error()
		r.Scores = Score(nil, s.Output)
		if ex != nil {
			r.Win = new(bool)
		}
		return r, nil
	}
	r.Answer, r.PromptTokens, r.CompletionTokens = rep.Message.Content, rep.PromptTokens, rep.CompletionTokens
	r.Calls, r.BadCalls, err = ParseCalls(r.Answer)
	if err != nil {
		r.ParseError = err.Error()
	}
	r.Scores = Score(r.Calls, s.Output)
	if ex != nil {
		o, err := ex.Run(ctx, s, r.Calls)
		if ctx.Err() != nil {
			return r, ctx.Err()
		}
		if err != nil {
			o.Error = err.Error()
		}
		r.Win, r.ExecAnswer, r.ExecError = &o.Win, o.Answer, o.Error
	}
	return r, nil
}

// actions writes calls for a memory entry, one JSON object each.
func actions(calls []Call) []string {
	out := make([]string, len(calls))
	for i, c := range calls {
		b, _ := json.Marshal(c)
		out[i] = string(b)
	}
	return out
}

// Bench plays test with o.Model, with the memory built from memory first
// when o.Memory is set (MemToolAgent's protocol: the first 500 samples are
// the test set, the next 500 populate the memory).
func Bench(ctx context.Context, test, memory []Sample, o BenchOptions) (Result, error) {
	res := Result{Memory: o.Memory != nil}
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
			r, err := Play(ctx, o.Model, o.Exec, s, Prompt(s, nil))
			if err != nil {
				return res, err
			}
			e := memtoolagent.Entry{Query: s.Input, Actions: actions(r.Calls)}
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
				e.Reflection, err = memtoolagent.Reflect(ctx, ext, memtoolagent.ExtractorPrompt(strings.Replace(Instructions, "{TOOLS}", "(below)", 1), string(tools), similar, execution), s.Input)
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
	runs := make([]Run, len(test))
	errs := make([]error, len(test))
	par.Each(len(test), o.Parallel, func(i int) {
		var recalled []memtoolagent.Entry
		if o.Memory != nil {
			if recalled, errs[i] = o.Memory.Recall(ctx, test[i].Input); errs[i] != nil {
				return
			}
		}
		runs[i], errs[i] = Play(ctx, o.Model, o.Exec, test[i], Prompt(test[i], recalled))
		runs[i].Recalled = len(recalled)
	}, func(done, i int) {
		logf("test %d/%d full=%v partial=%.2f\n", done, len(test), runs[i].Full, runs[i].Partial)
	})
	var part, full, win []float64
	var preds, golds [][]Call
	for i, r := range runs {
		if errs[i] != nil {
			return res, errs[i]
		}
		preds, golds = append(preds, r.Calls), append(golds, test[i].Output)
		part = append(part, r.Partial)
		full = append(full, b2f(r.Full))
		if r.Win != nil {
			win = append(win, b2f(*r.Win))
		}
		if r.ParseError != "" {
			res.Unparsed++
		}
		if r.Error != "" {
			res.Errors++
		}
		res.PromptTokens += float64(r.PromptTokens) / float64(len(runs))
	}
	res.F1Function, res.F1Param = CorpusF1(preds, golds)
	res.Partial, res.Full, res.Win = statOf(part), statOf(full), statOf(win)
	res.Runs = runs
	return res, nil
}

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

// Print writes the runs' metrics, one row a run.
func Print(w io.Writer, rs []Result) {
	fmt.Fprintf(w, "%-10s %-15s %-15s %-15s %-15s %-15s %-8s %-6s %-11s %s\n", "agent", "F1 function", "F1 param", "partial seq", "full seq", "win rate", "unparsed", "errors", "memory size", "recalled (mean)")
	for _, r := range rs {
		name := "no memory"
		if r.Memory {
			name = "memory"
		}
		win := "not executed"
		if r.Win.N > 0 {
			win = fmtStat(r.Win)
		}
		var rec float64
		for _, run := range r.Runs {
			rec += float64(run.Recalled) / float64(len(r.Runs))
		}
		fmt.Fprintf(w, "%-10s %-15.3f %-15.3f %-15s %-15s %-15s %-8d %-6d %-11d %.1f\n", name, r.F1Function, r.F1Param, fmtStat(r.Partial), fmtStat(r.Full), win, r.Unparsed, r.Errors, r.MemorySize, rec)
	}
	for _, r := range rs {
		for _, run := range r.Runs {
			if run.Error != "" {
				fmt.Fprintf(w, "memory %v: the model gave no answer on %d samples, e.g. %s: %s\n", r.Memory, r.Errors, run.ID, run.Error)
				break
			}
		}
	}
}

func fmtStat(s Stat) string { return fmt.Sprintf("%.3f ± %.3f", s.Mean, s.SE) }
