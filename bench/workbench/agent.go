package workbench

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"

	"github.com/agemem/agemem/agent"
	"github.com/agemem/agemem/llm"
	"github.com/agemem/agemem/model/chat"
)

// Prompt is WorkBench's system prompt (the date, the time and the meeting
// hours every query assumes), as MemToolAgent's Figure 10 opens.
const Prompt = "Today's date is Thursday, 2023-11-30 and the current time is 00:00:00. Remember the current date and time when answering queries. Meetings must not start before 9am or end after 6pm."

// Toolset is the sandbox's tools for the function-calling loop, every
// argument a string (as WorkBench's tools take them). Each call runs in s
// and is recorded as WorkBench writes an agent's action (its arguments in
// the order the model gave them, each value as Python's str() shows it),
// so that the run can be scored as WorkBench scores it.
func (s *Sandbox) Toolset(only []string, record func(Action)) (*agent.Toolset, error) {
	ts, err := agent.NewToolset()
	if err != nil {
		return nil, err
	}
	for _, t := range Tools {
		if only != nil && !slices.Contains(only, t.Name) {
			continue
		}
		props := map[string]any{}
		for _, p := range t.Params {
			props[p.Name] = map[string]any{"type": "string", "description": p.Description}
		}
		schema, _ := json.Marshal(map[string]any{"type": "object", "properties": props, "additionalProperties": false})
		name := t.Name
		err := ts.Add(agent.Tool{Function: chat.Function{Name: name, Description: t.Description, Parameters: schema},
			Call: func(_ context.Context, raw json.RawMessage) (string, error) {
				a, err := actionOf(name, raw)
				if err != nil {
					return "", err
				}
				if record != nil {
					record(a)
				}
				out, err := s.Call(name, a.Args())
				if err != nil {
					return "", err
				}
				return observation(out), nil
			}})
		if err != nil {
			return nil, err
		}
	}
	return ts, nil
}

// actionOf reads a call's JSON arguments in the order they were written.
func actionOf(tool string, raw json.RawMessage) (Action, error) {
	a := Action{Tool: tool}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	if t, err := dec.Token(); err != nil || t != json.Delim('{') {
		return a, fmt.Errorf("the arguments are not a JSON object")
	}
	for dec.More() {
		k, err := dec.Token()
		if err != nil {
			return a, err
		}
		var v any
		if err := dec.Decode(&v); err != nil {
			return a, err
		}
		a.Keys = append(a.Keys, k.(string))
		a.Vals = append(a.Vals, PyValue(v))
	}
	return a, nil
}

// observation is a tool's result as the model reads it: a message as it
// is, anything else as JSON.
func observation(v any) string {
	if s, ok := v.(string); ok {
		return s
	}
	raw, err := json.Marshal(v)
	if err != nil {
		return fmt.Sprint(v)
	}
	return string(raw)
}

// Run is one task played by an agent.
type Run struct {
	Task    Task     `json:"-"`
	Query   string   `json:"query"`
	Actions []string `json:"actions"`
	Score
	// Error is why the run failed (the model's server, the step limit);
	// such a run scores wrong, as WorkBench's error column does.
	Error string `json:"error,omitempty"`
	// InputTokens and OutputTokens are the agent's, summed over its model
	// calls, as the server or engine reported them (MemToolAgent's Table
	// 5 counts them apart: memory lengthens the prompt, not the reply).
	InputTokens  int         `json:"input_tokens"`
	OutputTokens int         `json:"output_tokens"`
	Trace        agent.Trace `json:"-"`
}

// Play runs model on one task with the given system prompt, in a fresh
// sandbox, and scores its actions against the gold ones. without are tools
// left out of the model's tool set.
func (d *Data) Play(ctx context.Context, m llm.Model, task Task, system string, lim agent.Limits, without ...string) (Run, error) {
	s := d.New()
	var acts []string
	var only []string
	if len(without) > 0 {
		for _, t := range Tools {
			if !slices.Contains(without, t.Name) {
				only = append(only, t.Name)
			}
		}
	}
	ts, err := s.Toolset(only, func(a Action) { acts = append(acts, a.String()) })
	if err != nil {
		return Run{}, err
	}
	msgs := []chat.Message{{Role: "system", Content: system}, {Role: "user", Content: task.Query}}
	tr, err := agent.Run(ctx, m, ts, msgs, lim)
	r := Run{Task: task, Query: task.Query, Actions: acts, Trace: tr}
	for _, st := range tr.Steps {
		r.InputTokens += st.Reply.PromptTokens
		r.OutputTokens += st.Reply.CompletionTokens
	}
	if ctx.Err() != nil {
		return r, ctx.Err()
	}
	switch {
	case err != nil:
		r.Error = err.Error()
	case tr.StepLimitHit:
		r.Error = fmt.Sprintf("still calling tools after %d turns", lim.MaxSteps)
	}
	r.Score = d.Grade(acts, task.Answer, r.Error != "")
	return r, nil
}

// Execution is the run as the memory extractor reads it: each call with
// its result, then the final answer.
func (r Run) Execution() string {
	var b strings.Builder
	for _, st := range r.Trace.Steps {
		for _, c := range st.Results {
			fmt.Fprintf(&b, "Tool call: %s(%s)\nTool response: %s\n", c.Call.Name, c.Call.Arguments, c.Result)
		}
	}
	if r.Trace.HasAnswer {
		fmt.Fprintf(&b, "Final answer: %s\n", r.Trace.Answer)
	}
	if r.Error != "" {
		fmt.Fprintf(&b, "The run failed: %s\n", r.Error)
	}
	return b.String()
}
