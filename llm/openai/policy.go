package openai

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/agemem/agemem/agent"
	"github.com/agemem/agemem/embed"
	"github.com/agemem/agemem/memtools"
	"github.com/agemem/agemem/memtools/stm"
)

// Format is how a Generator talks to the model.
type Format string

const (
	// Raw keeps the AgeMem text format in message content: the model's
	// <tool_call> blocks come back verbatim, and tool results go back as
	// user turns wrapped in <tool_response> (how the Qwen templates render
	// a tool message). For policies trained here served by any server.
	Raw Format = "raw"
	// Tools offers the six memory tools as functions; the model's tool
	// calls are written back as one AgeMem <tool_call> block, and the
	// history's AgeMem calls and results are sent as tool_calls and tool
	// messages with matching ids. For models with native function calling.
	Tools Format = "tools"
	// Chat returns the reply as written (the judge and the summariser).
	Chat Format = "chat"
)

// Generator is a memtools.Policy served by a chat model.
type Generator struct {
	Client      *Client
	Model       string
	Format      Format
	MaxTokens   int
	Temperature float64
	TopP        float64
	// OnText, if set, streams the reply: it gets the text so far.
	OnText func(string)
}

// Generator is model driven in format f with max tokens and sampling at
// temperature 1 (as policies are trained; callers set their own).
func (c Config) Generator(cl *Client, model string, f Format, maxTokens int) *Generator {
	if model == "" {
		model = c.Model
	}
	return &Generator{Client: cl, Model: model, Format: f, MaxTokens: maxTokens, Temperature: 1, TopP: 1}
}

// Complete implements memtools.Policy.
func (g *Generator) Complete(ctx context.Context, msgs []stm.Message) (memtools.Completion, error) {
	temp, topP := g.Temperature, g.TopP
	req := ChatRequest{Model: g.Model, MaxTokens: g.MaxTokens, Temperature: &temp, TopP: &topP}
	if g.Format == Tools {
		req.Messages = toolMessages(msgs)
		req.Tools = MemoryTools()
	} else {
		req.Messages = rawMessages(msgs)
	}
	var onDelta func(string)
	if g.OnText != nil {
		onDelta = g.OnText
	}
	r, err := g.Client.Chat(ctx, req, onDelta)
	if err != nil {
		return memtools.Completion{}, err
	}
	text := r.Message.Content
	if g.Format == Tools {
		text = AgeMemText(text, r.Message.ToolCalls)
	}
	reason := r.FinishReason
	if reason == "tool_calls" {
		reason = "stop"
	}
	return memtools.Completion{Text: text, PromptTokens: r.Usage.PromptTokens, CompletionTokens: r.Usage.CompletionTokens, FinishReason: reason}, nil
}

// rawMessages sends the conversation as text: tool results as user turns.
func rawMessages(msgs []stm.Message) []Message {
	out := make([]Message, 0, len(msgs))
	for _, m := range msgs {
		if m.Role == stm.Tool {
			out = append(out, Message{Role: "user", Content: "<tool_response>\n" + m.Content + "\n</tool_response>"})
			continue
		}
		out = append(out, Message{Role: m.Role, Content: m.Content})
	}
	return out
}

// toolMessages sends the history's AgeMem tool calls as tool_calls (ids
// call_<message>_<call>) and the tool results that follow as tool messages
// answering them in order; a result without a call to answer (a format
// error's message) goes as a user turn.
func toolMessages(msgs []stm.Message) []Message {
	out := make([]Message, 0, len(msgs))
	var pending []string // ids of calls not yet answered
	for i, m := range msgs {
		switch m.Role {
		case stm.Assistant:
			p := memtools.Parse(m.Content)
			am := Message{Role: "assistant", Content: assistantText(m.Content)}
			pending = pending[:0]
			for j, c := range p.Calls {
				tc := ToolCall{ID: fmt.Sprintf("call_%d_%d", i, j), Type: "function"}
				tc.Function.Name, tc.Function.Arguments = c.Name, string(c.Arguments)
				am.ToolCalls = append(am.ToolCalls, tc)
				pending = append(pending, tc.ID)
			}
			out = append(out, am)
		case stm.Tool:
			if len(pending) == 0 {
				out = append(out, Message{Role: "user", Content: m.Content})
				continue
			}
			out = append(out, Message{Role: "tool", Content: m.Content, ToolCallID: pending[0], Name: m.Name})
			pending = pending[1:]
		default:
			out = append(out, Message{Role: m.Role, Content: m.Content})
		}
	}
	return out
}

// assistantText is an AgeMem response without its <tool_call> block (the
// calls travel as tool_calls).
func assistantText(s string) string {
	if i := strings.Index(s, "<tool_call>"); i >= 0 {
		if j := strings.Index(s[i:], "</tool_call>"); j >= 0 {
			s = s[:i] + s[i+j+len("</tool_call>"):]
		}
	}
	return strings.TrimSpace(s)
}

// AgeMemText writes a reply with native tool calls in the AgeMem format: a
// <think> block (the content's own, or empty), then the calls as one
// <tool_call> JSON list, or the content as the <answer>. Arguments that are
// not a JSON object go on as a JSON string, so the tool refuses them and
// tells the model, and nothing the model wrote there can break out of the
// block.
func AgeMemText(content string, calls []ToolCall) string {
	var b strings.Builder
	if !strings.Contains(content, "<think>") {
		b.WriteString("<think></think>")
	}
	trimmed := strings.TrimSpace(content)
	hasBlocks := strings.Contains(content, "<answer>") || strings.Contains(content, "<tool_call>") || strings.Contains(content, "<think>")
	switch {
	case hasBlocks:
		b.WriteString(trimmed)
	case len(calls) == 0:
		b.WriteString("<answer>" + trimmed + "</answer>")
	}
	if len(calls) > 0 {
		parts := make([]string, len(calls))
		for i, c := range calls {
			raw := strings.TrimSpace(c.Function.Arguments)
			if raw == "" {
				raw = "{}"
			}
			// Re-encoded: json.Marshal escapes < and >, so no argument can
			// close the block early.
			var obj map[string]any
			var args []byte
			if json.Unmarshal([]byte(raw), &obj) == nil && obj != nil {
				args, _ = json.Marshal(obj)
			} else {
				args, _ = json.Marshal(raw)
			}
			name, _ := json.Marshal(c.Function.Name)
			parts[i] = `{"name":` + string(name) + `,"arguments":` + string(args) + `}`
		}
		b.WriteString("<tool_call>[" + strings.Join(parts, ",") + "]</tool_call>")
	}
	return b.String()
}

// MemoryTools are the six AgeMem tools (Figures 6-7) as functions, their
// parameters as JSON Schema.
func MemoryTools() []Tool {
	var tools []Tool
	for _, s := range memtools.Schemas() {
		props := map[string]any{}
		for _, name := range slices.Sorted(maps.Keys(s.Parameters.Properties)) {
			p := s.Parameters.Properties[name]
			props[name] = map[string]any{"type": p.Type, "description": p.Description}
		}
		var t Tool
		t.Type = "function"
		t.Function.Name, t.Function.Description = s.Name, s.Description
		t.Function.Parameters = map[string]any{"type": "object", "properties": props, "required": s.Parameters.Required}
		tools = append(tools, t)
	}
	return tools
}

// Embedder embeds with a server's embedding model (embed.backend: openai),
// unit-normalised so that the store's dot product is the cosine.
type Embedder struct {
	Client *Client
	Model  string
	Batch  int // texts per request (0: 64)
	dim    int
}

// NewEmbedder learns the model's dimension (embed.Probe).
func NewEmbedder(ctx context.Context, c *Client, model string) (*Embedder, error) {
	e := &Embedder{Client: c, Model: model}
	var err error
	if e.dim, err = embed.Probe(ctx, e.Embed); err != nil {
		return nil, err
	}
	return e, nil
}

// Dim implements embed.Embedder.
func (e *Embedder) Dim() int { return e.dim }

// Embed implements embed.Embedder.
func (e *Embedder) Embed(ctx context.Context, texts []string) ([][]float32, error) {
	request := func(ctx context.Context, part []string) ([][]float32, error) {
		return e.Client.Embeddings(ctx, e.Model, part)
	}
	return embed.Batches(ctx, texts, e.Batch, e.dim, request, func(msg string) error {
		return &Error{Server: e.Client.base, Model: e.Model, Status: 200, Attempts: 1, Message: msg}
	})
}

// ChatModel is an agent.Model on the server: native function calling.
type ChatModel struct {
	Client      *Client
	Model       string
	MaxTokens   int
	Temperature float64
	// OnText, if set, streams the reply's content as it grows.
	OnText func(string)
}

// Chat implements agent.Model.
func (m *ChatModel) Chat(ctx context.Context, msgs []agent.Message, specs []agent.Spec) (agent.Reply, error) {
	temp := m.Temperature
	req := ChatRequest{Model: m.Model, MaxTokens: m.MaxTokens, Temperature: &temp}
	for _, am := range msgs {
		om := Message{Role: am.Role, Content: am.Content, ToolCallID: am.ToolCallID, Name: am.Name}
		for _, c := range am.ToolCalls {
			tc := ToolCall{ID: c.ID, Type: "function"}
			tc.Function.Name, tc.Function.Arguments = c.Name, c.Arguments
			om.ToolCalls = append(om.ToolCalls, tc)
		}
		req.Messages = append(req.Messages, om)
	}
	for _, s := range specs {
		var t Tool
		t.Type = "function"
		t.Function.Name, t.Function.Description, t.Function.Parameters = s.Name, s.Description, s.Parameters
		req.Tools = append(req.Tools, t)
	}
	r, err := m.Client.Chat(ctx, req, m.OnText)
	if err != nil {
		return agent.Reply{}, err
	}
	out := agent.Message{Role: "assistant", Content: r.Message.Content}
	for _, c := range r.Message.ToolCalls {
		out.ToolCalls = append(out.ToolCalls, agent.ToolCall{ID: c.ID, Name: c.Function.Name, Arguments: c.Function.Arguments})
	}
	return agent.Reply{Message: out, PromptTokens: r.Usage.PromptTokens, CompletionTokens: r.Usage.CompletionTokens}, nil
}
