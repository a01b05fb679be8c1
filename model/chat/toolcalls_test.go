package chat

import (
	"encoding/json"
	"reflect"
	"strings"
	"testing"
)

func jsonEqual(a, b []byte) bool {
	var x, y any
	return json.Unmarshal(a, &x) == nil && json.Unmarshal(b, &y) == nil && reflect.DeepEqual(x, y)
}

// TestToolCallsRoundTrip: an assistant turn with several tool calls,
// rendered by each template as transformers renders it (TestChatTemplate-
// MatchesJinja holds Render to the Jinja template), parses back to the same
// calls and text.
func TestToolCallsRoundTrip(t *testing.T) {
	a := ToolCall{Name: "Add_memory", Arguments: `{"content": "Ivo is a judge.", "metadata": {"k": [1, 2.5, true, null]}}`}
	b := ToolCall{Name: "get_weather", Arguments: `{"city": "Oslo «quoted» \"x\""}`}
	msgs := []Message{{Role: "user", Content: "u"}, {Role: "assistant", Content: "Let me do two things.", ToolCalls: []ToolCall{a, b}}}
	for _, tmpl := range []Template{Qwen3, Qwen25} {
		text, err := Render(msgs, Options{Template: tmpl})
		if err != nil {
			t.Fatal(err)
		}
		turn := text[strings.LastIndex(text, "<|im_start|>assistant\n")+len("<|im_start|>assistant\n"):]
		turn = strings.TrimSuffix(strings.TrimSpace(turn), "<|im_end|>")
		content, calls := ParseToolCalls(turn)
		if content != "Let me do two things." || len(calls) != 2 {
			t.Fatalf("template %d: %q, %d calls from\n%s", tmpl, content, len(calls), turn)
		}
		for i, want := range []ToolCall{a, b} {
			if calls[i].Err != "" || calls[i].Name != want.Name || !jsonEqual(calls[i].Arguments, []byte(want.Arguments)) {
				t.Fatalf("template %d, call %d: %+v", tmpl, i, calls[i])
			}
		}
	}
}

func TestParseToolCalls(t *testing.T) {
	for _, c := range []struct {
		reply, content string
		names, errs    []string
	}{
		{"<think>\nplan\n</think>\n\nJust text.", "Just text.", nil, nil},
		{"<tool_call>\n{\"name\": \"a\", \"arguments\": \"{\\\"x\\\": 1}\"}\n</tool_call>", "", []string{"a"}, []string{""}},
		{"<tool_call>{\"name\": \"a\"}</tool_call>", "", []string{"a"}, []string{""}},
		{"x <tool_call>{\"name\": \"a\", \"arguments\": {}</tool_call> y", "x  y", []string{""}, []string{"not a JSON object"}},
		{"<tool_call>{\"arguments\": {}}</tool_call>", "", []string{""}, []string{`no "name"`}},
		{"<tool_call>{\"name\": \"a\"}{\"name\": \"b\"}</tool_call>", "", []string{""}, []string{"more than one JSON value"}},
		{"<tool_call>\n{\"name\": \"a\", \"arguments\": {}}", "", []string{"a"}, []string{"never closed"}},
	} {
		content, calls := ParseToolCalls(c.reply)
		if content != c.content || len(calls) != len(c.names) {
			t.Fatalf("%q: content %q, %d calls", c.reply, content, len(calls))
		}
		for i := range calls {
			if calls[i].Name != c.names[i] || !strings.Contains(calls[i].Err, c.errs[i]) || (c.errs[i] == "" && calls[i].Err != "") {
				t.Fatalf("%q: call %d %+v", c.reply, i, calls[i])
			}
		}
	}
	if _, calls := ParseToolCalls(`<tool_call>{"name": "a", "arguments": "{\"x\": 1}"}</tool_call>`); string(calls[0].Arguments) != `{"x": 1}` {
		t.Fatalf("string arguments: %s", calls[0].Arguments)
	}
}

// FuzzParseToolCalls: no reply a model writes makes the parser panic.
func FuzzParseToolCalls(f *testing.F) {
	for _, s := range []string{"<tool_call>{\"name\": \"a\", \"arguments\": \"hello\"}</tool_call>", "<tool_call>{\"name\": \"a\"}</tool_call>", "<think>", "<tool_call>", "</think><tool_call>\"x\"</tool_call><tool_call>[1]"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		_, calls := ParseToolCalls(s)
		for _, c := range calls {
			if c.Err == "" && !json.Valid(c.Arguments) {
				t.Fatalf("%q: call %+v has invalid arguments", s, c)
			}
		}
	})
}
