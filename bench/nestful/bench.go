package nestful

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"strings"

	"github.com/agemem/agemem/llm"
	"github.com/agemem/agemem/model/chat"
)

// Instructions is NESTFUL's system prompt (MemToolAgent, Figure 18), the
// sample's tools in JSON where {TOOLS} stands.
const Instructions = `You are a helpful assistant with access to the following function calls. Your task is to produce a sequence of function calls necessary to generate response to the user utterance. Here is a list of functions in JSON format that you can invoke: {TOOLS}
DO NOT try to answer the user question, just invoke the tools needed to respond to the user, if any. The output MUST strictly adhere to the following JSON format: [{"name": "func_name1", "arguments": {"argument1": "value1", "argument2": "value2"}, "label": "$var_1"}, ... (more tool calls as required)]. Please make sure the parameter type is correct and follow the documentation for parameter format. If no function call is needed, please directly output an empty list.`

// System is the agent's system prompt for s: the instructions with the
// sample's tools in JSON (Figure 18, without recalled examples).
func System(s Sample) string {
	var tools strings.Builder
	enc := json.NewEncoder(&tools)
	enc.SetEscapeHTML(false) // "<" as written, not \u003c
	enc.Encode(s.Tools)
	return strings.Replace(Instructions, "{TOOLS}", strings.TrimSpace(tools.String()), 1)
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

// Play asks the model for s's call sequence under system and scores it.
func Play(ctx context.Context, m llm.Model, ex *Executor, s Sample, system string) (Run, error) {
	r := Run{ID: s.ID, Query: s.Input}
	rep, err := m.Chat(ctx, llm.Request{Messages: []chat.Message{{Role: "system", Content: system}, {Role: "user", Content: s.Input}}})
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

// Tally scores runs of the test samples: corpus F1, partial and full
// sequence accuracy, the win rate where the runs were executed, and the
// counts of unparsed answers and model errors.
func Tally(test []Sample, runs []Run) Result {
	var res Result
	var part, full, win []float64
	var preds, golds [][]Call
	for i, r := range runs {
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
	return res
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
