// Package chat renders conversations with Qwen's chat templates (Qwen3's
// and Qwen2.5's), written out natively and checked against the Jinja
// templates themselves, so that what a model sees here, through Ollama or
// through transformers is the same text.
package chat

import (
	"bytes"
	_ "embed"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// The template texts, for tokenizer_config.json files the toolkit writes.
var (
	//go:embed templates/qwen3.jinja
	Qwen3Text string
	//go:embed templates/qwen2.5.jinja
	Qwen25Text string
)

// Template names a Qwen chat template family.
type Template int

const (
	// Qwen3 is Qwen3's: reasoning blocks, no default system prompt.
	Qwen3 Template = iota
	// Qwen25 is Qwen2 / Qwen2.5's: a default system prompt, tool
	// arguments always as JSON.
	Qwen25
)

// qwen25DefaultSystem is what Qwen2.5's template says when no system
// message is given.
const qwen25DefaultSystem = "You are Qwen, created by Alibaba Cloud. You are a helpful assistant."

// Detect picks the template family of a model directory from the
// chat_template in its tokenizer_config.json; without one, from the model
// type (config.json's model_type). An unknown template is an error rather
// than a silent mismatch.
func Detect(dir, modelType string) (Template, error) {
	raw, err := os.ReadFile(filepath.Join(dir, "tokenizer_config.json"))
	if os.IsNotExist(err) {
		if modelType == "qwen2" {
			return Qwen25, nil
		}
		return Qwen3, nil
	}
	if err != nil {
		return 0, err
	}
	var tc struct {
		ChatTemplate any `json:"chat_template"`
	}
	if err := json.Unmarshal(raw, &tc); err != nil {
		return 0, fmt.Errorf("%s/tokenizer_config.json: %w", dir, err)
	}
	t, _ := tc.ChatTemplate.(string)
	switch {
	case strings.Contains(t, "reasoning_content") || strings.Contains(t, "</think>"):
		return Qwen3, nil
	case strings.Contains(t, qwen25DefaultSystem):
		return Qwen25, nil
	case t == "":
		return 0, fmt.Errorf("%s/tokenizer_config.json has no chat_template string", dir)
	}
	return 0, fmt.Errorf("%s/tokenizer_config.json: the chat_template is neither Qwen3's nor Qwen2.5's, the two rendered natively", dir)
}

// Options are the template's switches.
type Options struct {
	Template            Template
	Tools               []json.RawMessage // function definitions, rendered with tojson
	AddGenerationPrompt bool
	// EnableThinking false adds the empty think block after the generation
	// prompt, as Qwen3's template does; nil or true leaves it out.
	EnableThinking *bool
}

// Render renders messages exactly as the chat_template of Qwen3's
// tokenizer_config.json does (checked against the template itself in
// tests), written out natively so that no template engine runs per request.
func Render(msgs []Message, o Options) (string, error) {
	if o.Template == Qwen25 {
		return renderQwen25(msgs, o)
	}
	var b strings.Builder
	if len(msgs) == 0 && len(o.Tools) == 0 {
		if o.AddGenerationPrompt {
			writeGenPrompt(&b, o)
		}
		return b.String(), nil
	}
	if len(o.Tools) > 0 {
		b.WriteString("<|im_start|>system\n")
		if len(msgs) > 0 && msgs[0].Role == "system" {
			b.WriteString(msgs[0].Content + "\n\n")
		}
		if err := writeTools(&b, o.Tools); err != nil {
			return "", err
		}
		b.WriteString("<|im_end|>\n")
	} else if msgs[0].Role == "system" {
		b.WriteString("<|im_start|>system\n" + msgs[0].Content + "<|im_end|>\n")
	}
	// The last user message that is not a wrapped tool response: assistant
	// turns after it keep their reasoning, earlier ones lose it.
	lastQuery := len(msgs) - 1
	for i := len(msgs) - 1; i >= 0; i-- {
		m := msgs[i]
		if m.Role == "user" && !(strings.HasPrefix(m.Content, "<tool_response>") && strings.HasSuffix(m.Content, "</tool_response>")) {
			lastQuery = i
			break
		}
	}
	for i, m := range msgs {
		switch {
		case m.Role == "user" || (m.Role == "system" && i > 0):
			b.WriteString("<|im_start|>" + m.Role + "\n" + m.Content + "<|im_end|>\n")
		case m.Role == "assistant":
			content, reasoning := m.Content, ""
			if m.Reasoning != nil {
				reasoning = *m.Reasoning
			} else if strings.Contains(m.Content, "</think>") {
				parts := strings.Split(m.Content, "</think>")
				content = strings.TrimLeft(parts[len(parts)-1], "\n")
				th := strings.Split(strings.TrimRight(parts[0], "\n"), "<think>")
				reasoning = strings.TrimLeft(th[len(th)-1], "\n")
			}
			if i > lastQuery && (i == len(msgs)-1 || reasoning != "") {
				b.WriteString("<|im_start|>" + m.Role + "\n<think>\n" + strings.Trim(reasoning, "\n") + "\n</think>\n\n" + strings.TrimLeft(content, "\n"))
			} else {
				b.WriteString("<|im_start|>" + m.Role + "\n" + content)
			}
			for j, tc := range m.ToolCalls {
				if (j == 0 && content != "") || j > 0 {
					b.WriteString("\n")
				}
				call, err := callBlock(tc, Qwen3)
				if err != nil {
					return "", fmt.Errorf("message %d: %w", i, err)
				}
				b.WriteString(call)
			}
			b.WriteString("<|im_end|>\n")
		case m.Role == "tool":
			writeToolResponse(&b, msgs, i)
		}
	}
	if o.AddGenerationPrompt {
		writeGenPrompt(&b, o)
	}
	return b.String(), nil
}

// writeTools writes the tools section both Qwen templates share.
func writeTools(b *strings.Builder, tools []json.RawMessage) error {
	b.WriteString(toolsHeader)
	for i, t := range tools {
		js, err := PyJSON(t)
		if err != nil {
			return fmt.Errorf("tool %d: %w", i, err)
		}
		b.WriteString("\n" + js)
	}
	b.WriteString("\n</tools>\n\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call>")
	return nil
}

// callBlock is a structured call as the template writes it into the
// assistant's turn. Qwen3 writes string arguments as the JSON they hold;
// Qwen2.5's tojson keeps them a JSON string.
func callBlock(tc ToolCall, t Template) (string, error) {
	args := bytes.TrimSpace([]byte(tc.Arguments))
	if !json.Valid(args) {
		// Text the model wrote that is not JSON goes back as a string,
		// as the model would read it.
		args, _ = json.Marshal(tc.Arguments)
	}
	var js string
	if t != Qwen25 && len(args) > 0 && args[0] == '"' {
		if err := json.Unmarshal(args, &js); err != nil {
			return "", fmt.Errorf("tool call arguments: %w", err)
		}
	} else {
		var err error
		if js, err = PyJSON(args); err != nil {
			return "", fmt.Errorf("tool call arguments: %w", err)
		}
	}
	return "<tool_call>\n{\"name\": \"" + tc.Name + "\", \"arguments\": " + js + "}\n</tool_call>", nil
}

// InlineTools rewrites a conversation with tools as one without: the
// tools section joins the system message and each assistant's structured
// calls join its content as <tool_call> blocks, so that Render of the
// result without tools is the text Render gives the original with them
// (o.Tools, o.Template). A policy that takes plain messages (a GRPO
// rollout's, any llm.Model) then sees a tool-using conversation
// exactly as the native template shows it; tool messages need no change.
func InlineTools(msgs []Message, o Options) ([]Message, error) {
	out := make([]Message, 0, len(msgs)+1)
	if len(o.Tools) > 0 {
		var b strings.Builder
		switch {
		case len(msgs) > 0 && msgs[0].Role == "system":
			b.WriteString(msgs[0].Content + "\n\n")
			msgs = msgs[1:]
		case o.Template == Qwen25:
			b.WriteString(qwen25DefaultSystem + "\n\n")
		}
		if err := writeTools(&b, o.Tools); err != nil {
			return nil, err
		}
		out = append(out, Message{Role: "system", Content: b.String()})
	}
	for i, m := range msgs {
		if m.Role == "assistant" && len(m.ToolCalls) > 0 {
			parts := []string{}
			if m.Content != "" {
				parts = append(parts, m.Content)
			}
			for _, tc := range m.ToolCalls {
				call, err := callBlock(tc, o.Template)
				if err != nil {
					return nil, fmt.Errorf("message %d: %w", i, err)
				}
				parts = append(parts, call)
			}
			m.Content, m.ToolCalls = strings.Join(parts, "\n"), nil
		}
		out = append(out, m)
	}
	return out, nil
}

// toolsHeader starts the tools section both Qwen templates write.
const toolsHeader = "# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>"

// SplitTools reads a system message that InlineTools wrote back into the
// system text before the tools section and the tool definitions (as
// rendered); ok is false when the message has no tools section.
func SplitTools(system string) (text string, tools []json.RawMessage, ok bool) {
	i := strings.Index(system, toolsHeader)
	if i < 0 {
		return system, nil, false
	}
	text = strings.TrimSuffix(system[:i], "\n\n")
	list, _, found := strings.Cut(system[i+len(toolsHeader):], "\n</tools>")
	if !found {
		return system, nil, false
	}
	for _, line := range strings.Split(strings.TrimPrefix(list, "\n"), "\n") {
		if line != "" {
			tools = append(tools, json.RawMessage(line))
		}
	}
	return text, tools, true
}

// writeToolResponse writes tool message i; consecutive tool messages share
// one user turn.
func writeToolResponse(b *strings.Builder, msgs []Message, i int) {
	if i == 0 || msgs[i-1].Role != "tool" {
		b.WriteString("<|im_start|>user")
	}
	b.WriteString("\n<tool_response>\n" + msgs[i].Content + "\n</tool_response>")
	if i == len(msgs)-1 || msgs[i+1].Role != "tool" {
		b.WriteString("<|im_end|>\n")
	}
}

func writeGenPrompt(b *strings.Builder, o Options) {
	b.WriteString("<|im_start|>assistant\n")
	if o.EnableThinking != nil && !*o.EnableThinking {
		b.WriteString("<think>\n\n</think>\n\n")
	}
}

// PyJSON re-encodes JSON as Python's json.dumps(ensure_ascii=False) writes
// it, which is what the template's tojson produces: ", " and ": "
// separators, keys in their given order, non-ASCII kept, numbers as written.
func PyJSON(raw []byte) (string, error) {
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	var b strings.Builder
	if err := pyValue(dec, &b); err != nil {
		return "", err
	}
	if _, err := dec.Token(); err == nil {
		return "", fmt.Errorf("trailing data after JSON value")
	}
	return b.String(), nil
}

func pyValue(dec *json.Decoder, b *strings.Builder) error {
	tok, err := dec.Token()
	if err != nil {
		return err
	}
	switch v := tok.(type) {
	case json.Delim:
		closing := map[json.Delim]json.Delim{'{': '}', '[': ']'}[v]
		b.WriteRune(rune(v))
		for i := 0; dec.More(); i++ {
			if i > 0 {
				b.WriteString(", ")
			}
			if v == '{' {
				k, err := dec.Token()
				if err != nil {
					return err
				}
				pyString(b, k.(string))
				b.WriteString(": ")
			}
			if err := pyValue(dec, b); err != nil {
				return err
			}
		}
		if _, err := dec.Token(); err != nil { // the closing delimiter
			return err
		}
		b.WriteRune(rune(closing))
	case string:
		pyString(b, v)
	case json.Number:
		b.WriteString(v.String())
	case bool:
		if v {
			b.WriteString("true")
		} else {
			b.WriteString("false")
		}
	case nil:
		b.WriteString("null")
	}
	return nil
}

func pyString(b *strings.Builder, s string) {
	b.WriteByte('"')
	for _, r := range s {
		switch r {
		case '"':
			b.WriteString(`\"`)
		case '\\':
			b.WriteString(`\\`)
		case '\n':
			b.WriteString(`\n`)
		case '\r':
			b.WriteString(`\r`)
		case '\t':
			b.WriteString(`\t`)
		case '\b':
			b.WriteString(`\b`)
		case '\f':
			b.WriteString(`\f`)
		default:
			if r < 0x20 {
				fmt.Fprintf(b, `\u%04x`, r)
			} else {
				b.WriteRune(r)
			}
		}
	}
	b.WriteByte('"')
}

// renderQwen25 renders as Qwen2.5's chat_template does.
func renderQwen25(msgs []Message, o Options) (string, error) {
	var b strings.Builder
	first := ""
	hasSystem := len(msgs) > 0 && msgs[0].Role == "system"
	if hasSystem {
		first = msgs[0].Content
	}
	if len(o.Tools) > 0 {
		b.WriteString("<|im_start|>system\n")
		if hasSystem {
			b.WriteString(first)
		} else {
			b.WriteString(qwen25DefaultSystem)
		}
		b.WriteString("\n\n")
		if err := writeTools(&b, o.Tools); err != nil {
			return "", err
		}
		b.WriteString("<|im_end|>\n")
	} else if hasSystem {
		b.WriteString("<|im_start|>system\n" + first + "<|im_end|>\n")
	} else {
		b.WriteString("<|im_start|>system\n" + qwen25DefaultSystem + "<|im_end|>\n")
	}
	for i, m := range msgs {
		switch {
		case m.Role == "user" || (m.Role == "system" && i > 0) || (m.Role == "assistant" && len(m.ToolCalls) == 0):
			b.WriteString("<|im_start|>" + m.Role + "\n" + m.Content + "<|im_end|>\n")
		case m.Role == "assistant":
			b.WriteString("<|im_start|>" + m.Role)
			if m.Content != "" {
				b.WriteString("\n" + m.Content)
			}
			for _, tc := range m.ToolCalls {
				call, err := callBlock(tc, Qwen25)
				if err != nil {
					return "", fmt.Errorf("message %d: %w", i, err)
				}
				b.WriteString("\n" + call)
			}
			b.WriteString("<|im_end|>\n")
		case m.Role == "tool":
			writeToolResponse(&b, msgs, i)
		}
	}
	if o.AddGenerationPrompt {
		b.WriteString("<|im_start|>assistant\n")
	}
	return b.String(), nil
}
