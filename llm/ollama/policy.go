package ollama

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/ollama/ollama/api"

	"github.com/agemem/agemem/memtools"
	"github.com/agemem/agemem/memtools/stm"
	"github.com/agemem/agemem/model/chat"
)

// Format is how a policy talks to Ollama.
type Format string

const (
	// Raw renders the prompt here with the Qwen chat template, exactly as
	// the native engine does, and asks /api/generate for a raw completion
	// that stops at <|im_end|>: the model's <tool_call> blocks come back
	// verbatim because Ollama never parses them. For policies trained
	// here, and any Qwen-template model.
	Raw Format = "raw"
	// Tools sends the conversation to /api/chat with the six memory tools
	// as Ollama tools, so a model with native tool calling (qwen3:4b)
	// calls them its own way; Ollama's parsed tool calls are mapped back
	// to one AgeMem <tool_call> block, its thinking to <think>.
	Tools Format = "tools"
	// Chat sends the conversation to /api/chat and returns the reply as
	// written (the judge and the summariser).
	Chat Format = "chat"
)

// ParseFormat checks a format name.
func ParseFormat(s string) (Format, error) {
	switch f := Format(s); f {
	case Raw, Tools, Chat:
		return f, nil
	}
	return "", fmt.Errorf("format %q is not one of raw, tools, chat", s)
}

// Policy is a memtools.Policy served by an Ollama model.
type Generator struct {
	Client *Client
	Model  string
	Format Format
	// Template renders Raw prompts (Qwen3's or Qwen2.5's).
	Template chat.Template
	// Sampling and context, passed through as Ollama options. NumCtx 0
	// keeps the model's default; MaxTokens 0 lets the model stop itself.
	NumCtx            int
	Temperature, TopP float64
	MaxTokens         int
	Seed              int
	KeepAlive         time.Duration
	// Think asks a thinking model to think (Tools and Chat); nil keeps
	// the model's default.
	Think *bool
	// OnText, if set, streams the response: it is called with the text so
	// far after each chunk.
	OnText func(sofar string)
}

// Stops are the stop sequences of the Qwen chat format.
var Stops = []string{"<|im_end|>", "<|endoftext|>"}

func (p *Generator) options(stops []string) map[string]any {
	o := map[string]any{"temperature": p.Temperature}
	if p.TopP > 0 {
		o["top_p"] = p.TopP
	}
	if p.NumCtx > 0 {
		o["num_ctx"] = p.NumCtx
	}
	if p.MaxTokens > 0 {
		o["num_predict"] = p.MaxTokens
	}
	if p.Seed != 0 {
		o["seed"] = p.Seed
	}
	if len(stops) > 0 {
		o["stop"] = stops
	}
	return o
}

func (p *Generator) keepAlive() *api.Duration {
	if p.KeepAlive == 0 {
		return nil
	}
	return &api.Duration{Duration: p.KeepAlive}
}

// Complete implements memtools.Policy.
func (p *Generator) Complete(ctx context.Context, msgs []stm.Message) (memtools.Completion, error) {
	no := false
	stream := p.OnText != nil
	var c memtools.Completion
	var err error
	switch p.Format {
	case Raw, "":
		c, err = p.raw(ctx, msgs, &no, &stream)
	case Tools, Chat:
		c, err = p.chat(ctx, msgs, &no, &stream)
	default:
		return c, fmt.Errorf("ollama policy: unknown format %q", p.Format)
	}
	return c, p.Client.wrap(p.Model, p.NumCtx, err)
}

func (p *Generator) raw(ctx context.Context, msgs []stm.Message, truncate, stream *bool) (memtools.Completion, error) {
	qm := make([]chat.Message, len(msgs))
	for i, m := range msgs {
		qm[i] = chat.Message{Role: m.Role, Content: m.Content}
	}
	prompt, err := chat.Render(qm, chat.Options{Template: p.Template, AddGenerationPrompt: true})
	if err != nil {
		return memtools.Completion{}, err
	}
	req := &api.GenerateRequest{Model: p.Model, Prompt: prompt, Raw: true, Stream: stream, Truncate: truncate,
		KeepAlive: p.keepAlive(), Options: p.options(Stops)}
	var acc accumulator
	err = p.Client.API.Generate(ctx, req, func(r api.GenerateResponse) error {
		acc.add(r.Thinking, r.Response, p.OnText)
		if r.Done {
			acc.done(r.Metrics, r.DoneReason)
		}
		return nil
	})
	if err != nil {
		return memtools.Completion{}, err
	}
	// A thinking model's parser may have lifted the reasoning out of the
	// raw text; put it back where the model wrote it.
	return acc.completion(func(thinking, text string) string {
		if thinking == "" {
			return text
		}
		return "<think>\n" + strings.Trim(thinking, "\n") + "\n</think>\n\n" + strings.TrimLeft(text, "\n")
	})
}

func (p *Generator) chat(ctx context.Context, msgs []stm.Message, truncate, stream *bool) (memtools.Completion, error) {
	req := &api.ChatRequest{Model: p.Model, Stream: stream, Truncate: truncate, KeepAlive: p.keepAlive(), Options: p.options(nil)}
	if p.Think != nil {
		req.Think = &api.ThinkValue{Value: *p.Think}
	}
	for _, m := range msgs {
		am := api.Message{Role: m.Role, Content: m.Content}
		if m.Role == stm.Tool {
			am.ToolName = m.Name
		}
		req.Messages = append(req.Messages, am)
	}
	if p.Format == Tools {
		req.Tools = MemoryTools()
	}
	var acc accumulator
	var calls []api.ToolCall
	err := p.Client.API.Chat(ctx, req, func(r api.ChatResponse) error {
		calls = append(calls, r.Message.ToolCalls...)
		acc.add(r.Message.Thinking, r.Message.Content, p.OnText)
		if r.Done {
			acc.done(r.Metrics, r.DoneReason)
		}
		return nil
	})
	if err != nil {
		return memtools.Completion{}, err
	}
	if p.Format == Chat {
		return acc.completion(func(_, text string) string { return text })
	}
	var callErr error
	c, err := acc.completion(func(thinking, text string) string {
		var s string
		s, callErr = AgeMemText(thinking, text, calls)
		return s
	})
	if callErr != nil {
		return c, callErr
	}
	return c, err
}

// AgeMemText writes an Ollama chat reply in the AgeMem response format:
// the reasoning in <think> (empty if the model gave none, since the format
// opens every response with one), then either the tool calls as one
// <tool_call> holding their JSON list, in order, names and arguments as
// Ollama parsed them, or the reply as the <answer>. A reply that already
// carries the AgeMem blocks is kept as written.
func AgeMemText(thinking, content string, calls []api.ToolCall) (string, error) {
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
		type call struct {
			Name      string                        `json:"name"`
			Arguments api.ToolCallFunctionArguments `json:"arguments"`
		}
		list := make([]call, len(calls))
		for i, c := range calls {
			list[i] = call{c.Function.Name, c.Function.Arguments}
			if list[i].Arguments.Len() == 0 {
				list[i].Arguments = api.NewToolCallFunctionArguments()
			}
		}
		js, err := json.Marshal(list)
		if err != nil {
			return "", fmt.Errorf("%w: tool calls: %v", ErrResponseInvalid, err)
		}
		b.WriteString("<tool_call>" + string(js) + "</tool_call>")
	}
	return b.String(), nil
}

// MemoryTools are the six AgeMem tools (Figures 6-7) as Ollama tools.
func MemoryTools() api.Tools {
	var tools api.Tools
	for _, s := range memtools.Schemas() {
		fn := api.ToolFunction{Name: s.Name, Description: s.Description}
		fn.Parameters.Type = "object"
		fn.Parameters.Required = s.Parameters.Required
		fn.Parameters.Properties = api.NewToolPropertiesMap()
		// Sorted, so that every request renders the same tool section and
		// Ollama can reuse its prompt cache.
		for _, name := range slices.Sorted(maps.Keys(s.Parameters.Properties)) {
			prop := s.Parameters.Properties[name]
			fn.Parameters.Properties.Set(name, api.ToolProperty{Type: api.PropertyType{prop.Type}, Description: prop.Description})
		}
		tools = append(tools, api.Tool{Type: "function", Function: fn})
	}
	return tools
}

// accumulator gathers a streamed or single response.
type accumulator struct {
	mu                 sync.Mutex
	thinking, text     strings.Builder
	promptN, responseN int
	reason             string
	finished           bool
}

func (a *accumulator) add(thinking, text string, onText func(string)) {
	a.mu.Lock()
	a.thinking.WriteString(thinking)
	a.text.WriteString(text)
	sofar := a.text.String()
	a.mu.Unlock()
	if onText != nil && text != "" {
		onText(sofar)
	}
}

func (a *accumulator) done(m api.Metrics, reason string) {
	a.promptN, a.responseN, a.reason, a.finished = m.PromptEvalCount, m.EvalCount, reason, true
}

func (a *accumulator) completion(render func(thinking, text string) string) (memtools.Completion, error) {
	if !a.finished {
		return memtools.Completion{}, fmt.Errorf("%w: the response ended before Ollama said it was done", ErrResponseInvalid)
	}
	reason := "stop"
	if a.reason == "length" {
		reason = "length"
	}
	return memtools.Completion{
		Text:             render(a.thinking.String(), a.text.String()),
		PromptTokens:     a.promptN,
		CompletionTokens: a.responseN,
		FinishReason:     reason,
	}, nil
}
