package memtools

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/agemem/agemem/llm"
	"github.com/agemem/agemem/memtools/stm"
	"github.com/agemem/agemem/model/chat"
)

// Functions are the six AgeMem tools (Figures 6-7) as function
// definitions: each parameter's type and description, in name order (so
// every request renders the same tools section and a server's prompt
// cache holds).
func Functions() []chat.Function {
	var out []chat.Function
	for _, s := range Schemas() {
		props := map[string]any{}
		for _, name := range slices.Sorted(maps.Keys(s.Parameters.Properties)) {
			p := s.Parameters.Properties[name]
			props[name] = map[string]any{"type": p.Type, "description": p.Description}
		}
		required := s.Parameters.Required
		if required == nil {
			required = []string{}
		}
		params, _ := json.Marshal(map[string]any{"type": "object", "properties": props, "required": required})
		out = append(out, chat.Function{Name: s.Name, Description: s.Description, Parameters: params})
	}
	return out
}

// FunctionCalling is AgeMem's text protocol over a model that calls
// functions natively (qwen3 on Ollama, a model behind an OpenAI-compatible
// server): the history's <tool_call> blocks go out as structured calls,
// each result that follows as the tool message answering it (ids
// call_<message>_<call>; a result with no call to answer, a format error's
// message, as a user turn), the six tools as functions; the reply's calls
// come back as one AgeMem <tool_call> block, its reasoning as <think>, so
// the loop reads the format it always does.
type FunctionCalling struct{ Model llm.Model }

// Chat implements llm.Model.
func (f FunctionCalling) Chat(ctx context.Context, r llm.Request) (llm.Response, error) {
	r.Messages, r.Tools = structured(r.Messages), Functions()
	resp, err := f.Model.Chat(ctx, r)
	if err != nil {
		return resp, err
	}
	thinking := ""
	if resp.Message.Reasoning != nil {
		thinking = *resp.Message.Reasoning
	}
	resp.Message = chat.Message{Role: stm.Assistant, Content: AgeMemText(thinking, resp.Message.Content, resp.Message.ToolCalls)}
	if resp.FinishReason == "tool_calls" {
		resp.FinishReason = "stop"
	}
	return resp, nil
}

// structured writes an AgeMem conversation with function calls.
func structured(msgs []chat.Message) []chat.Message {
	out := make([]chat.Message, 0, len(msgs))
	var pending []string // ids of calls not yet answered
	for i, m := range msgs {
		switch m.Role {
		case stm.Assistant:
			p := Parse(m.Content)
			am := chat.Message{Role: stm.Assistant, Content: withoutCalls(m.Content)}
			pending = pending[:0]
			for j, c := range p.Calls {
				id := fmt.Sprintf("call_%d_%d", i, j)
				am.ToolCalls = append(am.ToolCalls, chat.ToolCall{ID: id, Name: c.Name, Arguments: string(c.Arguments)})
				pending = append(pending, id)
			}
			out = append(out, am)
		case stm.Tool:
			if len(pending) == 0 {
				out = append(out, chat.Message{Role: stm.User, Content: m.Content})
				continue
			}
			out = append(out, chat.Message{Role: stm.Tool, Content: m.Content, ToolCallID: pending[0], Name: m.Name})
			pending = pending[1:]
		default:
			out = append(out, chat.Message{Role: m.Role, Content: m.Content})
		}
	}
	return out
}

// withoutCalls is an AgeMem response without its <tool_call> block (the
// calls travel as tool_calls).
func withoutCalls(s string) string {
	if i := strings.Index(s, "<tool_call>"); i >= 0 {
		if j := strings.Index(s[i:], "</tool_call>"); j >= 0 {
			s = s[:i] + s[i+j+len("</tool_call>"):]
		}
	}
	return strings.TrimSpace(s)
}

// AgeMemText writes a reply with native tool calls in the AgeMem format:
// the reasoning in <think> (the content's own block, or the model's
// separate reasoning, or empty: the format opens every response with
// one), then the calls as one <tool_call> JSON list in order, or the
// content as the <answer>. A reply that already carries AgeMem's blocks
// is kept as written. Arguments that are not a JSON object go on as a JSON
// string, so the tool refuses them and tells the model, and nothing the
// model wrote there can close the block early (the encoder escapes < and >).
func AgeMemText(thinking, content string, calls []chat.ToolCall) string {
	var b strings.Builder
	if !strings.Contains(content, "<think>") {
		b.WriteString("<think>" + strings.TrimSpace(thinking) + "</think>")
	}
	trimmed := strings.TrimSpace(content)
	hasBlocks := strings.Contains(content, "<answer>") || strings.Contains(content, "<tool_call>") || strings.Contains(content, "<think>")
	switch {
	case hasBlocks:
		b.WriteString(trimmed)
	case len(calls) == 0 && trimmed != "":
		b.WriteString("<answer>" + trimmed + "</answer>")
	}
	if len(calls) > 0 {
		parts := make([]string, len(calls))
		for i, c := range calls {
			raw := strings.TrimSpace(c.Arguments)
			if raw == "" {
				raw = "{}"
			}
			var obj map[string]any
			var args []byte
			if json.Unmarshal([]byte(raw), &obj) == nil && obj != nil {
				args, _ = json.Marshal(obj)
			} else {
				args, _ = json.Marshal(raw)
			}
			name, _ := json.Marshal(c.Name)
			parts[i] = `{"name":` + string(name) + `,"arguments":` + string(args) + `}`
		}
		b.WriteString("<tool_call>[" + strings.Join(parts, ",") + "]</tool_call>")
	}
	return b.String()
}
