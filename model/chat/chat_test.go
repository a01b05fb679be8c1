package chat

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/agemem/agemem/internal/testkit"
)

type chatCase struct {
	Messages            []Message         `json:"messages"`
	Tools               []json.RawMessage `json:"tools,omitempty"`
	AddGenerationPrompt bool              `json:"add_generation_prompt"`
	EnableThinking      *bool             `json:"enable_thinking,omitempty"`
}

func TestChatTemplateMatchesJinja(t *testing.T) {
	f := false
	reasoning := "I looked it up."
	toolDef := json.RawMessage(`{"type": "function", "function": {"name": "Retrieve_memory", "description": "Retrieves relevant memories — «quoted» \"here\".", "parameters": {"type": "object", "properties": {"query": {"type": "string"}, "top_k": {"type": "integer", "default": 3}}, "required": ["query"]}}}`)
	call := ToolCall{Name: "Add_memory", Arguments: `{"content": "Marla was born in Oslo", "metadata": {"k": [1, 2.5, true, null]}}`}
	strCall := ToolCall{Name: "Retrieve_memory", Arguments: `"{\"query\": \"Oslo\"}"`}
	cases := []chatCase{
		{Messages: []Message{{Role: "user", Content: "Hi"}}, AddGenerationPrompt: true},
		{Messages: []Message{{Role: "system", Content: "You are terse."}, {Role: "user", Content: "Hi"}, {Role: "assistant", Content: "Hello."}, {Role: "user", Content: "Again"}}, AddGenerationPrompt: true},
		{Messages: []Message{{Role: "system", Content: "sys"}, {Role: "user", Content: "q"}}, AddGenerationPrompt: true, EnableThinking: &f},
		// AgeMem's own format: think, tool_call and answer blocks in the content.
		{Messages: []Message{
			{Role: "system", Content: "You manage memory."},
			{Role: "user", Content: "By the way, Marla was born in Oslo."},
			{Role: "assistant", Content: "<think>Store it.</think>\n<tool_call>[{\"name\": \"Add_memory\", \"arguments\": {\"content\": \"Marla was born in Oslo.\"}}]</tool_call>"},
			{Role: "tool", Content: `{"status": "success", "memory_id": "mem_1a2b3c4d"}`},
			{Role: "assistant", Content: "<think>Done.</think>\n<answer>Noted.</answer>"},
			{Role: "user", Content: "Question: where was Marla born?"},
			{Role: "assistant", Content: "<think>\nRetrieve.\n</think>\n\n<tool_call>[{\"name\": \"Retrieve_memory\", \"arguments\": {\"query\": \"Marla born\"}}]</tool_call>"},
			{Role: "tool", Content: `{"memories": []}`},
			{Role: "tool", Content: `{"status": "error", "error": "response format: x"}`},
			{Role: "assistant", Content: "<think>Answer now.</think><answer>Oslo</answer>"},
		}},
		{Messages: []Message{
			{Role: "system", Content: "S"},
			{Role: "user", Content: "u1"},
			{Role: "assistant", Content: "", ToolCalls: []ToolCall{call, strCall}},
			{Role: "tool", Content: "r1"},
			{Role: "user", Content: "<tool_response>\nwrapped\n</tool_response>"},
			{Role: "assistant", Content: "final", Reasoning: &reasoning, ToolCalls: []ToolCall{call}},
		}, Tools: []json.RawMessage{toolDef}, AddGenerationPrompt: true},
		{Messages: []Message{{Role: "user", Content: "no system, with tools: 中文 👍"}}, Tools: []json.RawMessage{toolDef, toolDef}},
		{Messages: []Message{{Role: "user", Content: "a"}, {Role: "assistant", Content: "<think>kept? no</think>b"}, {Role: "user", Content: "c"}, {Role: "assistant", Content: "<think>\n\nlast\n\n</think>\n\nd"}}},
		{Messages: []Message{{Role: "system", Content: "s"}, {Role: "system", Content: "second system"}, {Role: "user", Content: "x"}}, AddGenerationPrompt: true},
	}
	for _, tmpl := range []struct {
		name string
		t    Template
		file string
	}{{"qwen3", Qwen3, "templates/qwen3.jinja"}, {"qwen2.5", Qwen25, "templates/qwen2.5.jinja"}} {
		t.Run(tmpl.name, func(t *testing.T) { compareWithJinja(t, cases, tmpl.t, tmpl.file) })
		// A policy that takes plain messages sees the same text.
		t.Run(tmpl.name+"/inline", func(t *testing.T) {
			cs := append(cases, chatCase{Messages: []Message{{Role: "user", Content: "u"}, {Role: "assistant", Content: "", ToolCalls: []ToolCall{strCall}}}, Tools: []json.RawMessage{toolDef}},
				chatCase{Tools: []json.RawMessage{toolDef}, AddGenerationPrompt: true})
			for i, c := range cs {
				o := Options{Template: tmpl.t, Tools: c.Tools, AddGenerationPrompt: c.AddGenerationPrompt, EnableThinking: c.EnableThinking}
				want, err := Render(c.Messages, o)
				if err != nil {
					t.Fatal(err)
				}
				in, err := InlineTools(c.Messages, o)
				if err != nil {
					t.Fatal(err)
				}
				for _, m := range in {
					if len(m.ToolCalls) > 0 {
						t.Fatalf("case %d: a structured call was left in %+v", i, m)
					}
				}
				o.Tools = nil
				if got, err := Render(in, o); err != nil || got != want {
					t.Errorf("case %d: inlined tools render as\n%s\nnot\n%s (%v)", i, got, want, err)
				}
			}
		})
	}
}

func compareWithJinja(t *testing.T, cases []chatCase, tmpl Template, file string) {
	dir := t.TempDir()
	raw, _ := json.Marshal(templateCases(cases))
	in := filepath.Join(dir, "cases.json")
	os.WriteFile(in, raw, 0o644)
	args := []string{filepath.Join("testdata", "chat_reference.cjs"), testkit.NPM(t), in}
	if file != "" {
		args = append(args, file)
	}
	out, err := exec.Command("node", args...).Output()
	if err != nil {
		if ee, ok := err.(*exec.ExitError); ok {
			msg := string(ee.Stderr)
			t.Fatalf("reference renderer: %v\n%s", err, msg[max(0, len(msg)-600):])
		}
		t.Fatal(err)
	}
	var want []string
	if err := json.Unmarshal(out, &want); err != nil {
		t.Fatal(err)
	}
	for i, c := range cases {
		got, err := Render(c.Messages, Options{Template: tmpl, Tools: c.Tools, AddGenerationPrompt: c.AddGenerationPrompt, EnableThinking: c.EnableThinking})
		if err != nil {
			t.Fatal(err)
		}
		if got != want[i] {
			t.Errorf("case %d differs from the Jinja template:\n--- ours\n%s\n--- jinja\n%s", i, got, want[i])
		}
	}
}

func TestDetectTemplate(t *testing.T) {
	dir := t.TempDir()
	if tm, _ := Detect(dir, "qwen2"); tm != Qwen25 {
		t.Fatal("a qwen2 directory without tokenizer_config.json should use Qwen2.5's template")
	}
	q25 := []byte(Qwen25Text)
	for _, c := range []struct {
		tmpl string
		want Template
		err  bool
	}{{string(q25), Qwen25, false}, {"{{ messages }} </think>", Qwen3, false}, {"{{ llama }}", 0, true}} {
		raw, _ := json.Marshal(map[string]string{"chat_template": c.tmpl})
		os.WriteFile(filepath.Join(dir, "tokenizer_config.json"), raw, 0o644)
		got, err := Detect(dir, "qwen3")
		if (err != nil) != c.err || got != c.want {
			t.Errorf("template %.20q: got %v, %v", c.tmpl, got, err)
		}
	}
}

// SplitTools reads back what InlineTools wrote into the system message;
// a message without a tools section is left as it is.
func TestSplitToolsInvertsInlineTools(t *testing.T) {
	defs := []json.RawMessage{json.RawMessage(`{"type": "function", "function": {"name": "a", "parameters": {}}}`), json.RawMessage(`{"type":"function","function":{"name":"b"}}`)}
	for _, sys := range []string{"You look things up.", ""} {
		msgs := []Message{{Role: "user", Content: "q"}}
		if sys != "" {
			msgs = append([]Message{{Role: "system", Content: sys}}, msgs...)
		}
		in, err := InlineTools(msgs, Options{Template: Qwen3, Tools: defs})
		if err != nil {
			t.Fatal(err)
		}
		text, tools, ok := SplitTools(in[0].Content)
		if !ok || text != sys || len(tools) != 2 {
			t.Fatalf("system %q: got %q, %d tools, %v", sys, text, len(tools), ok)
		}
		for i, d := range defs {
			want, _ := PyJSON(d)
			if string(tools[i]) != want {
				t.Errorf("tool %d: %s, want %s", i, tools[i], want)
			}
		}
	}
	if text, tools, ok := SplitTools("plain system"); ok || text != "plain system" || tools != nil {
		t.Errorf("no tools section: %q %v %v", text, tools, ok)
	}
}

// templateCases are cases as a chat template's caller passes them (what
// transformers' apply_chat_template takes): a call's arguments as the JSON
// value they hold, under "function".
func templateCases(cases []chatCase) []map[string]any {
	type fn struct {
		Name      string          `json:"name"`
		Arguments json.RawMessage `json:"arguments"`
	}
	out := make([]map[string]any, len(cases))
	for i, c := range cases {
		msgs := make([]map[string]any, len(c.Messages))
		for j, m := range c.Messages {
			x := map[string]any{"role": m.Role, "content": m.Content}
			if m.Reasoning != nil {
				x["reasoning_content"] = *m.Reasoning
			}
			var calls []map[string]any
			for _, tc := range m.ToolCalls {
				calls = append(calls, map[string]any{"function": fn{tc.Name, json.RawMessage(tc.Arguments)}})
			}
			if calls != nil {
				x["tool_calls"] = calls
			}
			msgs[j] = x
		}
		out[i] = map[string]any{"messages": msgs, "tools": c.Tools, "add_generation_prompt": c.AddGenerationPrompt}
		if c.Tools == nil {
			delete(out[i], "tools")
		}
		if c.EnableThinking != nil {
			out[i]["enable_thinking"] = *c.EnableThinking
		}
	}
	return out
}
