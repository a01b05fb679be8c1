package openai

import (
	"context"

	"github.com/agemem/agemem/embed"
	"github.com/agemem/agemem/llm"
	"github.com/agemem/agemem/model/chat"
)

// Model is a chat model on the server as an llm.Model: the conversation
// with its function calls and tool results as the protocol has them, the
// request's functions as tools, the reply's calls parsed by the server. A
// tool message that answers no structured call (AgeMem's text format,
// where calls are <tool_call> blocks in the content) goes as a user turn
// wrapped in <tool_response>, which is how the Qwen templates render a
// tool message.
type Model struct {
	Client *Client
	Name   string
	// Sampling is a request's when it brings none.
	Sampling llm.Sampling
}

// ChatModel is name on the server (the config's model when empty), sampling
// at temperature 1 up to maxTokens, as policies are trained (callers set
// their own).
func (c Config) ChatModel(cl *Client, name string, maxTokens int) *Model {
	if name == "" {
		name = c.Model
	}
	return &Model{Client: cl, Name: name, Sampling: llm.Sampling{Temperature: 1, TopP: 1, MaxTokens: maxTokens}}
}

// Chat implements llm.Model.
func (m *Model) Chat(ctx context.Context, r llm.Request) (llm.Response, error) {
	s := m.Sampling
	if r.Sampling != nil {
		s = *r.Sampling
		if s.MaxTokens == 0 {
			s.MaxTokens = m.Sampling.MaxTokens
		}
	}
	temp, topP := s.Temperature, s.TopP
	req := ChatRequest{Model: m.Name, MaxTokens: s.MaxTokens, Temperature: &temp, Messages: wireMessages(r.Messages)}
	if topP > 0 {
		req.TopP = &topP
	}
	if seed := int64(s.Seed ^ s.Stream); seed != 0 {
		req.Seed = &seed
	}
	for _, f := range r.Tools {
		var t WireTool
		t.Type = "function"
		t.Function.Name, t.Function.Description, t.Function.Parameters = f.Name, f.Description, f.Parameters
		req.Tools = append(req.Tools, t)
	}
	var onDelta func(string)
	if r.OnText != nil {
		onDelta = func(sofar string) { r.OnText(func() string { return sofar }) }
	}
	resp, err := m.Client.Chat(ctx, req, onDelta)
	if err != nil {
		return llm.Response{}, err
	}
	out := chat.Message{Role: "assistant", Content: resp.Message.Content}
	for _, c := range resp.Message.ToolCalls {
		out.ToolCalls = append(out.ToolCalls, chat.ToolCall{ID: c.ID, Name: c.Function.Name, Arguments: c.Function.Arguments})
	}
	reason := resp.FinishReason
	if reason == "tool_calls" {
		reason = "stop"
	}
	return llm.Response{Message: out, PromptTokens: resp.Usage.PromptTokens, CompletionTokens: resp.Usage.CompletionTokens,
		FinishReason: reason}, nil
}

// wireMessages writes a conversation as the protocol has it.
func wireMessages(msgs []chat.Message) []WireMessage {
	out := make([]WireMessage, 0, len(msgs))
	for _, m := range msgs {
		if m.Role == "tool" && m.ToolCallID == "" {
			out = append(out, WireMessage{Role: "user", Content: "<tool_response>\n" + m.Content + "\n</tool_response>"})
			continue
		}
		w := WireMessage{Role: m.Role, Content: m.Content, ToolCallID: m.ToolCallID, Name: m.Name}
		for _, c := range m.ToolCalls {
			tc := WireToolCall{ID: c.ID, Type: "function"}
			tc.Function.Name, tc.Function.Arguments = c.Name, c.Arguments
			w.ToolCalls = append(w.ToolCalls, tc)
		}
		out = append(out, w)
	}
	return out
}

// NewEmbedder is an embedder over the server's /embeddings
// (embed.backend: openai; embed.Remote).
func NewEmbedder(ctx context.Context, c *Client, model string) (*embed.Remote, error) {
	request := func(ctx context.Context, part []string) ([][]float32, error) {
		return c.Embeddings(ctx, model, part)
	}
	return embed.NewRemote(ctx, request, func(msg string) error {
		return &Error{Server: c.base, Model: model, Status: 200, Attempts: 1, Message: msg}
	})
}

var _ llm.Model = (*Model)(nil)
