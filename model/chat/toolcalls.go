package chat

import (
	"encoding/json"
	"strings"
)

// ParsedCall is one <tool_call> block of a model's reply. Err is set when
// the block is not the JSON object {"name": ..., "arguments": {...}} the
// templates ask for; Raw is then the block as written.
type ParsedCall struct {
	Name      string
	Arguments json.RawMessage
	Raw       string
	Err       string
}

// ParseToolCalls splits a Qwen2.5/Qwen3 reply into its text and the
// <tool_call> blocks the templates' tools section asks for (one JSON object
// per block, as Render writes an assistant's tool_calls back). Qwen3's
// <think> block is dropped from the text (the template drops it from
// history too). A block left open runs to the end of the reply. It never
// fails: a broken block is a ParsedCall with Err, for the agent loop to
// tell the model.
func ParseToolCalls(reply string) (content string, calls []ParsedCall) {
	if i := strings.Index(reply, "</think>"); i >= 0 {
		reply = reply[i+len("</think>"):]
	}
	var text strings.Builder
	for {
		i := strings.Index(reply, "<tool_call>")
		if i < 0 {
			text.WriteString(reply)
			break
		}
		text.WriteString(reply[:i])
		rest := reply[i+len("<tool_call>"):]
		body, after, closed := strings.Cut(rest, "</tool_call>")
		if !closed {
			after = ""
		}
		calls = append(calls, parseCall(strings.TrimSpace(body), closed))
		reply = after
	}
	return strings.TrimSpace(text.String()), calls
}

func parseCall(body string, closed bool) ParsedCall {
	c := ParsedCall{Raw: body}
	var obj struct {
		Name      *string         `json:"name"`
		Arguments json.RawMessage `json:"arguments"`
	}
	dec := json.NewDecoder(strings.NewReader(body))
	switch err := dec.Decode(&obj); {
	case err != nil:
		c.Err = "the <tool_call> block is not a JSON object: " + err.Error()
	case dec.More():
		c.Err = "the <tool_call> block holds more than one JSON value; write one call per block"
	case obj.Name == nil || *obj.Name == "":
		c.Err = `the <tool_call> block has no "name"`
	default:
		c.Name, c.Arguments = *obj.Name, obj.Arguments
		if len(c.Arguments) == 0 || string(c.Arguments) == "null" {
			c.Arguments = json.RawMessage("{}")
		}
		// Qwen2.5 may write the arguments as a string holding JSON.
		var s string
		if json.Unmarshal(c.Arguments, &s) == nil && json.Valid([]byte(s)) {
			c.Arguments = json.RawMessage(s)
		}
	}
	if !closed && c.Err == "" {
		c.Err = "the <tool_call> block is never closed with </tool_call>"
	}
	return c
}
