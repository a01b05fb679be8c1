package agent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/agemem/agemem/llm"
	"github.com/agemem/agemem/model/chat"
)

// script is a model that plays its replies in order and records what it
// was sent.
type script struct {
	replies []chat.Message
	seen    [][]chat.Message
	specs   [][]chat.Function
}

func (s *script) Chat(_ context.Context, req llm.Request) (llm.Response, error) {
	s.seen = append(s.seen, req.Messages)
	s.specs = append(s.specs, req.Tools)
	if len(s.replies) == 0 {
		return llm.Response{}, errors.New("the script ran out")
	}
	r := s.replies[0]
	s.replies = s.replies[1:]
	return llm.Response{Message: r}, nil
}

func call(id, name, args string) chat.ToolCall {
	return chat.ToolCall{ID: id, Name: name, Arguments: args}
}

func weather() Tool {
	return Tool{Function: chat.Function{Name: "get_weather", Description: "The weather in a city.",
		Parameters: json.RawMessage(`{"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer", "minimum": 1}}, "required": ["city"], "additionalProperties": false}`)},
		Call: func(_ context.Context, args json.RawMessage) (string, error) {
			var a struct{ City string }
			json.Unmarshal(args, &a)
			if a.City == "Atlantis" {
				return "", errors.New("no station there")
			}
			return "sunny in " + a.City, nil
		}}
}

func clock() Tool {
	return Tool{Function: chat.Function{Name: "now", Description: "The time."}, Call: func(context.Context, json.RawMessage) (string, error) { return "12:00", nil }}
}

// TestLoopRunsCallsAndAnswers: several calls in one turn run in order,
// each result goes back as a tool message answering its call by id, and
// the turn without calls is the answer.
func TestLoopRunsCallsAndAnswers(t *testing.T) {
	ts, err := NewToolset(weather(), clock())
	if err != nil {
		t.Fatal(err)
	}
	m := &script{replies: []chat.Message{
		{ToolCalls: []chat.ToolCall{call("a", "get_weather", `{"city": "Oslo"}`), call("", "now", "")}},
		{Content: "Sunny in Oslo at noon."},
	}}
	tr, err := Run(context.Background(), m, ts, []chat.Message{{Role: "user", Content: "Weather and time?"}}, Limits{MaxSteps: 4})
	if err != nil {
		t.Fatal(err)
	}
	if !tr.HasAnswer || tr.Answer != "Sunny in Oslo at noon." || len(tr.Steps) != 2 {
		t.Fatalf("trace %+v", tr)
	}
	var roles []string
	for _, msg := range tr.Messages {
		roles = append(roles, msg.Role)
	}
	if strings.Join(roles, ",") != "user,assistant,tool,tool,assistant" {
		t.Fatalf("roles %v", roles)
	}
	asst := tr.Messages[1]
	if tr.Messages[2].ToolCallID != "a" || tr.Messages[3].ToolCallID != asst.ToolCalls[1].ID || asst.ToolCalls[1].ID == "" {
		t.Fatalf("tool messages answer %q, %q; calls %+v", tr.Messages[2].ToolCallID, tr.Messages[3].ToolCallID, asst.ToolCalls)
	}
	if tr.Messages[2].Content != "sunny in Oslo" || tr.Messages[3].Content != "12:00" {
		t.Fatalf("results %q %q", tr.Messages[2].Content, tr.Messages[3].Content)
	}
	if len(m.specs[0]) != 2 || m.specs[0][0].Name != "get_weather" || len(m.seen[1]) != 4 {
		t.Fatalf("the model saw %d specs and then %d messages", len(m.specs[0]), len(m.seen[1]))
	}
}

// TestBrokenCallsAreToldToTheModel: an unknown tool, arguments that are
// not JSON, arguments that break the schema and a failing tool each become
// an error the model reads, and the loop goes on to the answer.
func TestBrokenCallsAreToldToTheModel(t *testing.T) {
	ts, _ := NewToolset(weather())
	cases := []struct {
		call chat.ToolCall
		want string
	}{
		{call("1", "get_wether", `{"city": "Oslo"}`), `there is no tool "get_wether"; the tools are: get_weather`},
		{call("2", "get_weather", `{"city": "Oslo"`), "are not JSON"},
		{call("3", "get_weather", `{"town": "Oslo"}`), "do not match its schema"},
		{call("4", "get_weather", `{"city": 7}`), "do not match its schema"},
		{call("5", "get_weather", `{"city": "Oslo", "days": 0}`), "do not match its schema"},
		{call("6", "get_weather", `{"city": "Atlantis"}`), "get_weather failed: no station there"},
		// A block the model's reply could not be read from (a llm.Model sets
		// Invalid): refused with the model's parser's reason.
		{chat.ToolCall{ID: "7", Name: "get_weather", Arguments: `{"city": `, Invalid: "the <tool_call> block is never closed"}, "never closed"},
	}
	var calls []chat.ToolCall
	for _, c := range cases {
		calls = append(calls, c.call)
	}
	m := &script{replies: []chat.Message{{ToolCalls: calls}, {Content: "Sorry."}}}
	tr, err := Run(context.Background(), m, ts, []chat.Message{{Role: "user", Content: "?"}}, Limits{MaxSteps: 3})
	if err != nil || !tr.HasAnswer {
		t.Fatalf("%v %+v", err, tr)
	}
	for i, c := range cases {
		r := tr.Steps[0].Results[i]
		if r.OK || !strings.Contains(r.Result, c.want) {
			t.Errorf("%s(%s): %q, ok %v; want %q", c.call.Name, c.call.Arguments, r.Result, r.OK, c.want)
		}
	}
}

// TestLimits: a model that keeps calling stops at MaxSteps; calls beyond
// MaxCallsPerStep are refused with a message; a failing model is an error
// naming the step; a cancelled run returns the context's error.
func TestLimits(t *testing.T) {
	ts, _ := NewToolset(clock())
	loop := chat.Message{ToolCalls: []chat.ToolCall{call("", "now", ""), call("", "now", ""), call("", "now", "")}}
	m := &script{replies: []chat.Message{loop, loop, loop}}
	tr, err := Run(context.Background(), m, ts, nil, Limits{MaxSteps: 2, MaxCallsPerStep: 2})
	if err != nil || !tr.StepLimitHit || tr.HasAnswer || len(tr.Steps) != 2 {
		t.Fatalf("%v %+v", err, tr)
	}
	if r := tr.Steps[0].Results; !r[0].OK || !r[1].OK || r[2].OK || !strings.Contains(r[2].Result, "at most 2 tool calls") {
		t.Fatalf("results %+v", r)
	}
	if _, err := Run(context.Background(), &script{}, ts, nil, Limits{MaxSteps: 1}); !errors.Is(err, ErrStep) || !strings.Contains(err.Error(), "step 1") {
		t.Fatalf("model failure: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	slow := Tool{Function: chat.Function{Name: "slow"}, Call: func(ctx context.Context, _ json.RawMessage) (string, error) { cancel(); return "", ctx.Err() }}
	ts2, _ := NewToolset(slow)
	if _, err := Run(ctx, &script{replies: []chat.Message{{ToolCalls: []chat.ToolCall{call("", "slow", "{}")}}}}, ts2, nil, Limits{MaxSteps: 2}); !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled: %v", err)
	}
}

func TestToolsetErrors(t *testing.T) {
	if _, err := NewToolset(clock(), clock()); err == nil || !strings.Contains(err.Error(), `two tools named "now"`) {
		t.Fatalf("duplicate: %v", err)
	}
	bad := clock()
	bad.Parameters = json.RawMessage(`{"type": 7}`)
	if _, err := NewToolset(bad); err == nil || !strings.Contains(err.Error(), `"now"`) {
		t.Fatalf("bad schema: %v", err)
	}
	ts, _ := NewToolset(clock(), weather())
	if n := ts.Remove("now", "nope"); n != 1 || fmt.Sprint(ts.Names()) != "[get_weather]" {
		t.Fatalf("removed %d, left %v", n, ts.Names())
	}
	if out, ok, _ := ts.Execute(context.Background(), call("", "now", "")); ok || !strings.Contains(out, "no tool") {
		t.Fatalf("a removed tool ran: %q", out)
	}
}

// A draft-04 schema (boolean exclusiveMinimum, as zod-to-json-schema and
// MCP servers built on it write) is accepted, its bounds kept: a page of 0
// is refused, 1 runs, and the model sees the schema as the server wrote it.
func TestDraft04ExclusiveBounds(t *testing.T) {
	pages := Tool{Function: chat.Function{Name: "read_pdf", Parameters: json.RawMessage(`{"type": "object", "required": ["pages"],
		"properties": {"pages": {"type": "array", "items": {"type": "integer", "exclusiveMinimum": true, "minimum": 0}},
		"top": {"type": "number", "exclusiveMaximum": false, "maximum": 5}}}`)},
		Call: func(context.Context, json.RawMessage) (string, error) { return "read", nil }}
	ts, err := NewToolset(pages)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		args string
		ok   bool
	}{{`{"pages": [1, 2]}`, true}, {`{"pages": [0]}`, false}, {`{"pages": [1], "top": 5}`, true}, {`{"pages": [1], "top": 6}`, false}} {
		if out, ok, _ := ts.Execute(context.Background(), call("", "read_pdf", c.args)); ok != c.ok {
			t.Fatalf("%s: ran %v (%q), want %v", c.args, ok, out, c.ok)
		}
	}
	if got := string(ts.Functions()[0].Parameters); !strings.Contains(got, `"exclusiveMinimum": true`) {
		t.Fatalf("the model sees %s, not the server's schema", got)
	}
}

// FuzzExecute: whatever a model writes as a call, Execute answers without
// panicking.
func FuzzExecute(f *testing.F) {
	for _, s := range []string{`{"city": "Oslo"}`, `{"city": [1, {"a": null}]}`, `[]`, `"x"`, `{`, `null`, `{"days": 1e400}`} {
		f.Add("get_weather", s)
	}
	ts, _ := NewToolset(weather(), clock())
	f.Fuzz(func(t *testing.T, name, args string) {
		if _, _, err := ts.Execute(context.Background(), call("", name, args)); err != nil {
			t.Fatal(err)
		}
	})
}
