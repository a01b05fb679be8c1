package chat

import (
	"encoding/json"
	"fmt"
)

// Message is one chat message: the toolkit's one message type. Every
// backend reads and writes it, the agent loop and AgeMem's context hold
// it, and the templates here render it.
type Message struct {
	Role    string `json:"role"` // system, user, assistant, tool
	Content string `json:"content"`
	// Reasoning is an assistant turn's thinking kept apart from its
	// content (Qwen3's reasoning_content); nil: a <think> block in the
	// content is its reasoning, as the template reads it.
	Reasoning *string    `json:"reasoning_content,omitempty"`
	ToolCalls []ToolCall `json:"tool_calls,omitempty"`
	// ToolCallID and Name are a tool message's: the call it answers and
	// the tool that answered.
	ToolCallID string `json:"tool_call_id,omitempty"`
	Name       string `json:"name,omitempty"`
}

// ToolCall is one call of an assistant message. In JSON it has OpenAI's
// shape ({"id", "type": "function", "function": {"name", "arguments"}},
// the arguments a string), what chat-completion APIs and fine-tuning
// files hold; it also reads a call whose arguments are an object, and the
// flat {"name", "arguments"} some tools write.
type ToolCall struct {
	ID   string
	Name string
	// Arguments is the JSON the model wrote: an object, a string holding
	// JSON (as Qwen2.5 may write it), or text that does not parse.
	Arguments string
	// Invalid, set by a backend that could not read the call out of the
	// reply (a broken <tool_call> block), says why; the agent loop tells
	// the model.
	Invalid string
}

type wireFunction struct {
	Name      string          `json:"name"`
	Arguments json.RawMessage `json:"arguments,omitempty"`
}

type wireCall struct {
	ID       string          `json:"id,omitempty"`
	Type     string          `json:"type,omitempty"`
	Function *wireFunction   `json:"function,omitempty"`
	Name     string          `json:"name,omitempty"`
	Args     json.RawMessage `json:"arguments,omitempty"`
	Invalid  string          `json:"invalid,omitempty"`
}

// MarshalJSON writes OpenAI's shape.
func (c ToolCall) MarshalJSON() ([]byte, error) {
	args, err := json.Marshal(c.Arguments)
	if err != nil {
		return nil, err
	}
	return json.Marshal(wireCall{ID: c.ID, Type: "function", Function: &wireFunction{Name: c.Name, Arguments: args}, Invalid: c.Invalid})
}

// UnmarshalJSON reads OpenAI's shape or the flat one; arguments may be a
// string (the JSON text) or a JSON value (kept as written).
func (c *ToolCall) UnmarshalJSON(b []byte) error {
	var w wireCall
	if err := json.Unmarshal(b, &w); err != nil {
		return err
	}
	name, args := w.Name, w.Args
	if w.Function != nil {
		name, args = w.Function.Name, w.Function.Arguments
	}
	*c = ToolCall{ID: w.ID, Name: name, Invalid: w.Invalid}
	var s string
	switch {
	case len(args) == 0 || string(args) == "null":
	case json.Unmarshal(args, &s) == nil:
		c.Arguments = s
	default:
		c.Arguments = string(args)
	}
	return nil
}

// Function describes a tool to the model: what function-calling APIs
// call a function definition.
type Function struct {
	Name        string          `json:"name"`
	Description string          `json:"description"`
	Parameters  json.RawMessage `json:"parameters"` // a JSON Schema object
}

// Definitions are functions as the templates' tools section lists them:
// {"function": {"description", "name", "parameters"}, "type": "function"},
// keys in that order (what a Go map encodes, and so what every policy
// trained here has read).
func Definitions(fs []Function) ([]json.RawMessage, error) {
	out := make([]json.RawMessage, len(fs))
	for i, f := range fs {
		raw, err := json.Marshal(map[string]any{"type": "function", "function": map[string]any{
			"name": f.Name, "description": f.Description, "parameters": f.Parameters}})
		if err != nil {
			return nil, fmt.Errorf("tool %q: %w", f.Name, err)
		}
		out[i] = raw
	}
	return out, nil
}

// ReplyMessage reads a reply's text into an assistant message: the text
// outside <tool_call> blocks is the content, each block a call. A block
// the model broke becomes a call with Invalid set to the parser's reason,
// so the model reads what was wrong.
func ReplyMessage(text string) Message {
	content, calls := ParseToolCalls(text)
	out := Message{Role: "assistant", Content: content}
	for _, pc := range calls {
		call := ToolCall{Name: pc.Name, Arguments: string(pc.Arguments)}
		if pc.Err != "" {
			call = ToolCall{Name: pc.Name, Arguments: pc.Raw, Invalid: pc.Err}
		}
		out.ToolCalls = append(out.ToolCalls, call)
	}
	return out
}
