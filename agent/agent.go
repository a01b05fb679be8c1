// Package agent is the function-calling agent loop the memory systems of
// MemTool, FitText, MemToolAgent and TA-Mem run on: tools described by JSON
// Schema, several calls in one turn, results back to the model, a step
// limit and a trace. A call the model gets wrong (an unknown tool, arguments
// that are not JSON or break the schema, a tool that fails) becomes a tool
// message telling the model what was wrong, never a crash of the loop.
package agent

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/agemem/agemem/llm"
	"github.com/agemem/agemem/model/chat"
	"github.com/google/jsonschema-go/jsonschema"
)

// Tool is a function the model may call.
type Tool struct {
	chat.Function
	// Call runs the tool on arguments that passed the schema. An error is
	// reported to the model as the result; the loop goes on.
	Call func(ctx context.Context, args json.RawMessage) (string, error)
	// Server names the MCP server the tool lives on ("" for local tools).
	Server string
}

// Toolset is the tools of a run with their schemas compiled once.
type Toolset struct {
	tools  []Tool
	schema map[string]*jsonschema.Resolved
	// servers are the MCP servers whose tools joined, with their tools'
	// names, re-listed when a server announces a change.
	servers map[*MCPClient][]string
}

// NewToolset checks every tool's name and schema; names must be unique.
func NewToolset(tools ...Tool) (*Toolset, error) {
	ts := &Toolset{schema: map[string]*jsonschema.Resolved{}, servers: map[*MCPClient][]string{}}
	for _, t := range tools {
		if err := ts.Add(t); err != nil {
			return nil, err
		}
	}
	return ts, nil
}

// Add adds a tool (an MCP server's tools arriving later, say).
func (ts *Toolset) Add(t Tool) error {
	if t.Name == "" || t.Call == nil {
		return fmt.Errorf("agent: a tool needs a name and a Call")
	}
	if _, ok := ts.schema[t.Name]; ok {
		return fmt.Errorf("agent: two tools named %q", t.Name)
	}
	params := t.Parameters
	if len(params) == 0 {
		params = json.RawMessage(`{"type": "object"}`)
	}
	var s jsonschema.Schema
	if err := json.Unmarshal(draft2020(params), &s); err != nil {
		return fmt.Errorf("agent: tool %q: the parameters are not a JSON Schema: %w", t.Name, err)
	}
	rs, err := s.Resolve(nil)
	if err != nil {
		return fmt.Errorf("agent: tool %q: %w", t.Name, err)
	}
	t.Parameters = params
	ts.tools = append(ts.tools, t)
	ts.schema[t.Name] = rs
	return nil
}

// draft2020 rewrites draft-04's boolean exclusiveMinimum and
// exclusiveMaximum (true: minimum and maximum are exclusive), which
// zod-to-json-schema and other MCP servers still write and the 2020-12
// validator cannot read, as 2020-12's numeric bounds. Anything else, and a
// schema that is not JSON, is returned unchanged.
func draft2020(raw json.RawMessage) json.RawMessage {
	if !bytes.Contains(raw, []byte("exclusiveM")) {
		return raw
	}
	var v any
	if json.Unmarshal(raw, &v) != nil {
		return raw
	}
	var walk func(v any)
	walk = func(v any) {
		switch x := v.(type) {
		case map[string]any:
			for _, b := range [][2]string{{"exclusiveMinimum", "minimum"}, {"exclusiveMaximum", "maximum"}} {
				excl, ok := x[b[0]].(bool)
				if !ok {
					continue
				}
				delete(x, b[0])
				if bound, has := x[b[1]]; excl && has {
					x[b[0]] = bound
					delete(x, b[1])
				}
			}
			for _, c := range x {
				walk(c)
			}
		case []any:
			for _, c := range x {
				walk(c)
			}
		}
	}
	walk(v)
	out, err := json.Marshal(v)
	if err != nil {
		return raw
	}
	return out
}

// Remove drops tools by name (MemTool's working set shrinking); unknown
// names are ignored. It returns how many were removed.
func (ts *Toolset) Remove(names ...string) int {
	n := len(ts.tools)
	ts.tools = slices.DeleteFunc(ts.tools, func(t Tool) bool { return slices.Contains(names, t.Name) })
	for _, name := range names {
		delete(ts.schema, name)
	}
	return n - len(ts.tools)
}

// AddMCP adds an MCP server's tools; Run re-lists them whenever the server
// announces that its tool list changed.
func (ts *Toolset) AddMCP(ctx context.Context, c *MCPClient) error {
	tools, err := c.Tools(ctx)
	if err != nil {
		return err
	}
	var names []string
	for _, t := range tools {
		if err := ts.Add(t); err != nil {
			return fmt.Errorf("MCP server %q: %w", c.server.Name, err)
		}
		names = append(names, t.Name)
	}
	ts.servers[c] = names
	return nil
}

// refresh re-lists the tools of servers that announced a change. A server
// that cannot list keeps its old tools: calling them fails, and the model is
// told.
func (ts *Toolset) refresh(ctx context.Context) {
	for c, names := range ts.servers {
		if !c.Changed() {
			continue
		}
		tools, err := c.Tools(ctx)
		if err != nil {
			continue
		}
		ts.Remove(names...)
		names = names[:0]
		for _, t := range tools {
			if ts.Add(t) == nil {
				names = append(names, t.Name)
			}
		}
		ts.servers[c] = names
	}
}

// SortByName orders the tools by name, as an MCP server lists its own:
// a toolset kept in this order shows a model the same list whether its
// tools are local or come through a server.
func (ts *Toolset) SortByName() {
	slices.SortStableFunc(ts.tools, func(a, b Tool) int { return strings.Compare(a.Name, b.Name) })
}

// Functions are the tools as the model sees them, in the order added
// (or sorted).
func (ts *Toolset) Functions() []chat.Function {
	out := make([]chat.Function, len(ts.tools))
	for i, t := range ts.tools {
		out[i] = t.Function
	}
	return out
}

// Names are the tools' names, in the order added.
func (ts *Toolset) Names() []string {
	out := make([]string, len(ts.tools))
	for i, t := range ts.tools {
		out[i] = t.Name
	}
	return out
}

// Execute runs one call: the result the model reads and whether the call
// went through (false: unknown tool, bad arguments or a failing tool, the
// result then says what was wrong). Only the caller's context ending is an
// error.
func (ts *Toolset) Execute(ctx context.Context, c chat.ToolCall) (string, bool, error) {
	if c.Invalid != "" {
		return "error: " + c.Invalid, false, nil
	}
	i := slices.IndexFunc(ts.tools, func(t Tool) bool { return t.Name == c.Name })
	if i < 0 {
		return fmt.Sprintf("error: there is no tool %q; the tools are: %s", c.Name, strings.Join(ts.Names(), ", ")), false, nil
	}
	raw := strings.TrimSpace(c.Arguments)
	if raw == "" {
		raw = "{}"
	}
	var args any
	if err := json.Unmarshal([]byte(raw), &args); err != nil {
		return fmt.Sprintf("error: the arguments of %s are not JSON (%v); send one JSON object", c.Name, err), false, nil
	}
	if err := ts.schema[c.Name].Validate(args); err != nil {
		return fmt.Sprintf("error: the arguments of %s do not match its schema: %v", c.Name, err), false, nil
	}
	out, err := ts.tools[i].Call(ctx, json.RawMessage(raw))
	if ctx.Err() != nil {
		return "", false, ctx.Err()
	}
	if err != nil {
		return fmt.Sprintf("error: %s failed: %v", c.Name, err), false, nil
	}
	return out, true, nil
}

// Limits bound a run.
type Limits struct {
	// MaxSteps is the most model turns (at least 1).
	MaxSteps int
	// MaxCallsPerStep caps the calls of one turn that run (0: no cap); the
	// others are answered with an error.
	MaxCallsPerStep int
}

// Step is one model turn and the calls it made.
type Step struct {
	Reply   llm.Response `json:"reply"`
	Results []CallResult `json:"results"`
}

// CallResult is one call's outcome.
type CallResult struct {
	Call   chat.ToolCall `json:"call"`
	Result string        `json:"result"`
	OK     bool          `json:"ok"`
}

// Trace is the record of a run.
type Trace struct {
	Steps []Step `json:"steps"`
	// Answer is the final assistant message's content (the turn without
	// tool calls), if the run got there.
	Answer    string `json:"answer"`
	HasAnswer bool   `json:"has_answer"`
	// StepLimitHit: the model was still calling tools at MaxSteps.
	StepLimitHit bool `json:"step_limit_hit"`
	// Messages is the conversation at the end, tool results included.
	Messages []chat.Message `json:"messages"`
}

// ErrStep wraps a model failure with the step it happened at.
var ErrStep = errors.New("agent: the model failed")

// Run runs the loop from msgs until the model answers without calling a
// tool or MaxSteps turns have passed.
func Run(ctx context.Context, m llm.Model, ts *Toolset, msgs []chat.Message, lim Limits) (Trace, error) {
	tr := Trace{Messages: slices.Clone(msgs)}
	for step := 0; step < max(lim.MaxSteps, 1); step++ {
		ts.refresh(ctx)
		r, err := m.Chat(ctx, llm.Request{Messages: tr.Messages, Tools: ts.Functions()})
		if err != nil {
			return tr, fmt.Errorf("%w at step %d: %w", ErrStep, step+1, err)
		}
		r.Message.Role = "assistant"
		for i := range r.Message.ToolCalls {
			if r.Message.ToolCalls[i].ID == "" { // some servers leave ids out
				r.Message.ToolCalls[i].ID = fmt.Sprintf("call_%d_%d", step, i)
			}
		}
		tr.Messages = append(tr.Messages, r.Message)
		st := Step{Reply: r}
		for i, c := range r.Message.ToolCalls {
			var res CallResult
			if lim.MaxCallsPerStep > 0 && i >= lim.MaxCallsPerStep {
				res = CallResult{Call: c, Result: fmt.Sprintf("error: at most %d tool calls run per turn; call %s again in the next turn", lim.MaxCallsPerStep, c.Name)}
			} else {
				out, ok, err := ts.Execute(ctx, c)
				if err != nil {
					tr.Steps = append(tr.Steps, st)
					return tr, err
				}
				res = CallResult{Call: c, Result: out, OK: ok}
			}
			st.Results = append(st.Results, res)
			tr.Messages = append(tr.Messages, chat.Message{Role: "tool", Content: res.Result, ToolCallID: c.ID, Name: c.Name})
		}
		tr.Steps = append(tr.Steps, st)
		if len(r.Message.ToolCalls) == 0 {
			tr.Answer, tr.HasAnswer = r.Message.Content, true
			return tr, nil
		}
	}
	tr.StepLimitHit = true
	return tr, nil
}
