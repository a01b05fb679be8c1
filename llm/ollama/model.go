package ollama

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/ollama/ollama/api"

	"github.com/agemem/agemem/llm"
	"github.com/agemem/agemem/model/chat"
)

// Model is a model on an Ollama server as an llm.Model.
//
// With Raw, the conversation (and any functions) is rendered here with
// the Qwen chat template, exactly as the native engine renders it, and
// sent to /api/generate as a raw prompt that stops at <|im_end|>: the
// model's text comes back as written (AgeMem's blocks, <tool_call> blocks
// parsed into calls when the request offered functions), for policies
// trained here and any Qwen-template model. Without, the conversation goes
// to /api/chat with the functions as Ollama tools: the model's own
// template renders them and Ollama parses its calls (qwen3:4b), its
// thinking returned as the message's Reasoning.
type Model struct {
	Client *Client
	Name   string
	Raw    bool
	// Template renders Raw prompts (Qwen3's or Qwen2.5's).
	Template chat.Template
	// NumCtx is the context Ollama allocates (0: the model's default).
	NumCtx int
	// Sampling is a request's when it brings none (MaxTokens 0 lets the
	// model stop itself; Seed 0 leaves Ollama's).
	Sampling  llm.Sampling
	KeepAlive time.Duration
	// Think asks a thinking model to think (chat API); nil keeps the
	// model's default.
	Think *bool
}

// Stops are the stop sequences of the Qwen chat format.
var Stops = []string{"<|im_end|>", "<|endoftext|>"}

func (m *Model) options(s *llm.Sampling, stops []string) map[string]any {
	if s == nil {
		s = &m.Sampling
	}
	o := map[string]any{"temperature": s.Temperature}
	if s.TopP > 0 {
		o["top_p"] = s.TopP
	}
	if s.TopK > 0 {
		o["top_k"] = s.TopK
	}
	if m.NumCtx > 0 {
		o["num_ctx"] = m.NumCtx
	}
	n := s.MaxTokens
	if n == 0 {
		n = m.Sampling.MaxTokens
	}
	if n > 0 {
		o["num_predict"] = n
	}
	if seed := s.Seed ^ s.Stream; seed != 0 {
		o["seed"] = int(seed)
	}
	if len(stops) > 0 {
		o["stop"] = stops
	}
	return o
}

func (m *Model) keepAlive() *api.Duration {
	if m.KeepAlive == 0 {
		return nil
	}
	return &api.Duration{Duration: m.KeepAlive}
}

// Chat implements llm.Model. Ollama is asked never to truncate a prompt
// silently: one too long for num_ctx is an error naming the remedy.
func (m *Model) Chat(ctx context.Context, r llm.Request) (llm.Response, error) {
	var resp llm.Response
	var err error
	if m.Raw {
		resp, err = m.raw(ctx, r)
	} else {
		resp, err = m.chat(ctx, r)
	}
	return resp, m.Client.wrap(m.Name, m.NumCtx, err)
}

func (m *Model) raw(ctx context.Context, r llm.Request) (llm.Response, error) {
	defs, err := chat.Definitions(r.Tools)
	if err != nil {
		return llm.Response{}, err
	}
	prompt, err := chat.Render(r.Messages, chat.Options{Template: m.Template, Tools: defs, AddGenerationPrompt: true})
	if err != nil {
		return llm.Response{}, err
	}
	no, stream := false, r.OnText != nil
	req := &api.GenerateRequest{Model: m.Name, Prompt: prompt, Raw: true, Stream: &stream, Truncate: &no,
		KeepAlive: m.keepAlive(), Options: m.options(r.Sampling, Stops)}
	var acc accumulator
	err = m.Client.API.Generate(ctx, req, func(g api.GenerateResponse) error {
		acc.add(g.Thinking, g.Response, r.OnText)
		if g.Done {
			acc.done(g.Metrics, g.DoneReason)
		}
		return nil
	})
	if err != nil {
		return llm.Response{}, err
	}
	resp, err := acc.response()
	if err != nil {
		return resp, err
	}
	// A thinking model's parser may have lifted the reasoning out of the
	// raw text; it goes back where the model wrote it.
	if th := acc.thinking.String(); th != "" {
		resp.Message.Content = "<think>\n" + strings.Trim(th, "\n") + "\n</think>\n\n" + strings.TrimLeft(resp.Message.Content, "\n")
	}
	if len(r.Tools) > 0 {
		resp.Message = chat.ReplyMessage(resp.Message.Content)
	}
	return resp, nil
}

func (m *Model) chat(ctx context.Context, r llm.Request) (llm.Response, error) {
	no, stream := false, r.OnText != nil
	req := &api.ChatRequest{Model: m.Name, Stream: &stream, Truncate: &no, KeepAlive: m.keepAlive(), Options: m.options(r.Sampling, nil)}
	if m.Think != nil {
		req.Think = &api.ThinkValue{Value: *m.Think}
	}
	for i, msg := range r.Messages {
		am := api.Message{Role: msg.Role, Content: msg.Content, ToolName: msg.Name, ToolCallID: msg.ToolCallID}
		for _, c := range msg.ToolCalls {
			args := api.NewToolCallFunctionArguments()
			if strings.TrimSpace(c.Arguments) != "" {
				if err := json.Unmarshal([]byte(c.Arguments), &args); err != nil {
					return llm.Response{}, fmt.Errorf("ollama chat: messages[%d]: the arguments of %s are not a JSON object: %v", i, c.Name, err)
				}
			}
			am.ToolCalls = append(am.ToolCalls, api.ToolCall{ID: c.ID, Function: api.ToolCallFunction{Name: c.Name, Arguments: args}})
		}
		req.Messages = append(req.Messages, am)
	}
	for _, f := range r.Tools {
		fn := api.ToolFunction{Name: f.Name, Description: f.Description}
		if len(f.Parameters) > 0 {
			if err := json.Unmarshal(f.Parameters, &fn.Parameters); err != nil {
				return llm.Response{}, fmt.Errorf("ollama chat: tool %s: its parameters are not a JSON Schema object Ollama reads: %v", f.Name, err)
			}
		}
		req.Tools = append(req.Tools, api.Tool{Type: "function", Function: fn})
	}
	var acc accumulator
	var calls []chat.ToolCall
	err := m.Client.API.Chat(ctx, req, func(c api.ChatResponse) error {
		for _, tc := range c.Message.ToolCalls {
			raw, err := json.Marshal(tc.Function.Arguments)
			if err != nil {
				return fmt.Errorf("%w: the arguments of %s: %v", ErrResponseInvalid, tc.Function.Name, err)
			}
			id := tc.ID
			if id == "" {
				id = fmt.Sprintf("call_%d", len(calls))
			}
			calls = append(calls, chat.ToolCall{ID: id, Name: tc.Function.Name, Arguments: string(raw)})
		}
		acc.add(c.Message.Thinking, c.Message.Content, r.OnText)
		if c.Done {
			acc.done(c.Metrics, c.DoneReason)
		}
		return nil
	})
	if err != nil {
		return llm.Response{}, err
	}
	resp, err := acc.response()
	resp.Message.ToolCalls = calls
	if th := acc.thinking.String(); th != "" {
		resp.Message.Reasoning = &th
	}
	return resp, err
}

// accumulator gathers a streamed or single response.
type accumulator struct {
	mu                 sync.Mutex
	thinking, text     strings.Builder
	promptN, responseN int
	reason             string
	finished           bool
}

func (a *accumulator) add(thinking, text string, onText func(func() string)) {
	a.mu.Lock()
	a.thinking.WriteString(thinking)
	a.text.WriteString(text)
	sofar := a.text.String()
	a.mu.Unlock()
	if onText != nil && text != "" {
		onText(func() string { return sofar })
	}
}

func (a *accumulator) done(m api.Metrics, reason string) {
	a.promptN, a.responseN, a.reason, a.finished = m.PromptEvalCount, m.EvalCount, reason, true
}

func (a *accumulator) response() (llm.Response, error) {
	if !a.finished {
		return llm.Response{}, fmt.Errorf("%w: the response ended before Ollama said it was done", ErrResponseInvalid)
	}
	reason := "stop"
	if a.reason == "length" {
		reason = "length"
	}
	return llm.Response{Message: chat.Message{Role: "assistant", Content: a.text.String()},
		PromptTokens: a.promptN, CompletionTokens: a.responseN, FinishReason: reason}, nil
}

var _ llm.Model = (*Model)(nil)
