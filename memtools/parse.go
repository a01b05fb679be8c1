package memtools

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"
)

// Call is one tool invocation as the model wrote it.
type Call struct {
	Name      string          `json:"name"`
	Arguments json.RawMessage `json:"arguments"`
}

// Parsed is a policy response split into its blocks. Errors lists every way
// the response broke the format of Appendix A.1; a response with errors is
// still acted on as far as it can be (calls that parsed run, a lone answer
// counts), and the errors go back to the model as a tool message.
type Parsed struct {
	Thinks    []string
	Calls     []Call
	Answer    string
	HasAnswer bool
	Errors    []string
}

type blockKind int

const (
	blockThink blockKind = iota
	blockToolCall
	blockAnswer
)

var tagNames = [...]string{"think", "tool_call", "answer"}

type block struct {
	kind blockKind
	body string
}

// Parse splits a response into <think>, <tool_call> and <answer> blocks and
// enforces the mutual-exclusivity rule: after each <think>, exactly one of a
// <tool_call> or an <answer>. It never panics.
func Parse(text string) Parsed {
	var p Parsed
	blocks, errs := splitBlocks(text)
	p.Errors = errs
	if len(blocks) == 0 {
		if len(errs) == 0 {
			p.Errors = append(p.Errors, "the response is empty: start with <think>...</think>, then a <tool_call> or an <answer>")
		}
		return p
	}
	if blocks[0].kind != blockThink {
		p.Errors = append(p.Errors, fmt.Sprintf("the response must start with <think>, not <%s>", tagNames[blocks[0].kind]))
	}
	// Walk think-groups: each <think> is followed by at most one action.
	acted := false // an action already followed the current <think>
	for _, b := range blocks {
		switch b.kind {
		case blockThink:
			p.Thinks = append(p.Thinks, strings.TrimSpace(b.body))
			acted = false
		case blockToolCall, blockAnswer:
			if acted {
				p.Errors = append(p.Errors, fmt.Sprintf("mutual exclusivity: <%s> follows another action after the same <think>; put a new <think> before each action", tagNames[b.kind]))
				if b.kind == blockAnswer {
					continue // a tool call and an answer after one think: the answer is void
				}
			}
			acted = true
			if b.kind == blockAnswer {
				if p.HasAnswer {
					p.Errors = append(p.Errors, "use <answer> only once")
					continue
				}
				p.Answer, p.HasAnswer = strings.TrimSpace(b.body), true
				continue
			}
			calls, cerrs := parseCalls(b.body)
			p.Calls = append(p.Calls, calls...)
			p.Errors = append(p.Errors, cerrs...)
		}
	}
	if !p.HasAnswer && len(p.Calls) == 0 && len(p.Errors) == 0 {
		p.Errors = append(p.Errors, "the response has neither a <tool_call> nor an <answer> block")
	}
	return p
}

// splitBlocks finds the tagged blocks in order and reports stray text,
// unclosed and nested tags.
func splitBlocks(text string) ([]block, []string) {
	var blocks []block
	var errs []string
	rest := text
	for {
		i, kind := nextOpenTag(rest)
		if i < 0 {
			stray(&errs, rest)
			return blocks, errs
		}
		stray(&errs, rest[:i])
		open := "<" + tagNames[kind] + ">"
		body := rest[i+len(open):]
		end := strings.Index(body, "</"+tagNames[kind]+">")
		if end < 0 {
			errs = append(errs, fmt.Sprintf("<%s> is never closed with </%s>", tagNames[kind], tagNames[kind]))
			return blocks, errs
		}
		inner := body[:end]
		if j, k := nextOpenTag(inner); j >= 0 {
			errs = append(errs, fmt.Sprintf("<%s> is nested inside <%s>; blocks cannot nest", tagNames[k], tagNames[kind]))
		}
		blocks = append(blocks, block{kind, inner})
		rest = body[end+len("</"+tagNames[kind]+">"):]
	}
}

func nextOpenTag(s string) (int, blockKind) {
	best, kind := -1, blockThink
	for k, name := range tagNames {
		if i := strings.Index(s, "<"+name+">"); i >= 0 && (best < 0 || i < best) {
			best, kind = i, blockKind(k)
		}
	}
	return best, kind
}

func stray(errs *[]string, s string) {
	s = strings.TrimSpace(s)
	if s == "" {
		return
	}
	for _, name := range tagNames {
		if strings.Contains(s, "</"+name+">") {
			*errs = append(*errs, fmt.Sprintf("</%s> closes a block that was never opened", name))
			return
		}
	}
	if len(s) > 60 {
		s = s[:60] + "..."
	}
	*errs = append(*errs, fmt.Sprintf("text outside tags is not allowed: %q", s))
}

// parseCalls reads a <tool_call> body: a JSON array of {"name","arguments"}
// or one such object. Arguments may also be a JSON string holding an object
// (the OpenAI wire form).
func parseCalls(body string) ([]Call, []string) {
	body = strings.TrimSpace(body)
	if body == "" {
		return nil, []string{"<tool_call> is empty: put a JSON array of {\"name\": ..., \"arguments\": {...}} inside it"}
	}
	var raws []json.RawMessage
	if body[0] == '[' {
		if err := json.Unmarshal([]byte(body), &raws); err != nil {
			return nil, []string{"<tool_call> is not valid JSON: " + jsonError(body, err)}
		}
	} else {
		var one json.RawMessage
		if err := json.Unmarshal([]byte(body), &one); err != nil {
			return nil, []string{"<tool_call> is not valid JSON: " + jsonError(body, err)}
		}
		raws = []json.RawMessage{one}
	}
	if len(raws) == 0 {
		return nil, []string{"<tool_call> holds an empty list"}
	}
	var calls []Call
	var errs []string
	for i, raw := range raws {
		var obj map[string]json.RawMessage
		if err := json.Unmarshal(raw, &obj); err != nil {
			errs = append(errs, fmt.Sprintf("tool call %d is not a JSON object", i+1))
			continue
		}
		var name string
		if err := json.Unmarshal(obj["name"], &name); err != nil || name == "" {
			errs = append(errs, fmt.Sprintf("tool call %d has no \"name\" string", i+1))
			continue
		}
		args := bytes.TrimSpace(obj["arguments"])
		if len(args) > 0 && args[0] == '"' {
			var s string
			json.Unmarshal(args, &s)
			args = []byte(s)
		}
		if len(args) == 0 || string(args) == "null" {
			args = []byte("{}")
		}
		var check map[string]json.RawMessage
		if err := json.Unmarshal(args, &check); err != nil {
			errs = append(errs, fmt.Sprintf("tool call %d (%s): \"arguments\" must be a JSON object", i+1, name))
			continue
		}
		calls = append(calls, Call{Name: name, Arguments: json.RawMessage(args)})
	}
	return calls, errs
}

func jsonError(body string, err error) string {
	if se, ok := err.(*json.SyntaxError); ok {
		return fmt.Sprintf("%v at byte %d", se, se.Offset)
	}
	return err.Error()
}

// WellFormed reports whether a response is in AgeMem's format: think, then
// tool calls or an answer, with no format error.
func WellFormed(text string) bool {
	p := Parse(text)
	return len(p.Errors) == 0 && (len(p.Calls) > 0 || p.HasAnswer)
}
