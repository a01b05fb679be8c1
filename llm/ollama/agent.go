package ollama

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"

	"github.com/ollama/ollama/api"

	"github.com/agemem/agemem/agent"
)

// ChatModel is an Ollama model as a function-calling agent.Model, with
// Ollama's native tools: the loop's tools go out as the request's tools
// (the model's own template renders them), its tool calls come back parsed
// by Ollama, and tool results go back as tool messages naming their tool
// and call. Sampling, context size, keep-alive and thinking are the
// Generator's.
type ChatModel struct{ *Generator }

// Chat implements agent.Model.
func (m ChatModel) Chat(ctx context.Context, msgs []agent.Message, specs []agent.Spec) (agent.Reply, error) {
	p := m.Generator
	no := false
	req := &api.ChatRequest{Model: p.Model, Stream: &no, Truncate: &no, KeepAlive: p.keepAlive(), Options: p.options(nil)}
	if p.Think != nil {
		req.Think = &api.ThinkValue{Value: *p.Think}
	}
	for i, msg := range msgs {
		am := api.Message{Role: msg.Role, Content: msg.Content, ToolName: msg.Name, ToolCallID: msg.ToolCallID}
		for _, c := range msg.ToolCalls {
			args := api.NewToolCallFunctionArguments()
			if strings.TrimSpace(c.Arguments) != "" {
				if err := json.Unmarshal([]byte(c.Arguments), &args); err != nil {
					return agent.Reply{}, fmt.Errorf("ollama chat: messages[%d]: the arguments of %s are not a JSON object: %v", i, c.Name, err)
				}
			}
			am.ToolCalls = append(am.ToolCalls, api.ToolCall{ID: c.ID, Function: api.ToolCallFunction{Name: c.Name, Arguments: args}})
		}
		req.Messages = append(req.Messages, am)
	}
	for _, s := range specs {
		fn := api.ToolFunction{Name: s.Name, Description: s.Description}
		if len(s.Parameters) > 0 {
			if err := json.Unmarshal(s.Parameters, &fn.Parameters); err != nil {
				return agent.Reply{}, fmt.Errorf("ollama chat: tool %s: its parameters are not a JSON Schema object Ollama reads: %v", s.Name, err)
			}
		}
		req.Tools = append(req.Tools, api.Tool{Type: "function", Function: fn})
	}
	var r agent.Reply
	var text strings.Builder
	err := p.Client.API.Chat(ctx, req, func(resp api.ChatResponse) error {
		text.WriteString(resp.Message.Content)
		for _, c := range resp.Message.ToolCalls {
			raw, err := json.Marshal(c.Function.Arguments)
			if err != nil {
				return fmt.Errorf("%w: the arguments of %s: %v", ErrResponseInvalid, c.Function.Name, err)
			}
			id := c.ID
			if id == "" {
				id = fmt.Sprintf("call_%d", len(r.Message.ToolCalls))
			}
			r.Message.ToolCalls = append(r.Message.ToolCalls, agent.ToolCall{ID: id, Name: c.Function.Name, Arguments: string(raw)})
		}
		if resp.Done {
			r.PromptTokens, r.CompletionTokens = resp.PromptEvalCount, resp.EvalCount
		}
		return nil
	})
	if err != nil {
		return agent.Reply{}, p.Client.wrap(p.Model, p.NumCtx, err)
	}
	r.Message.Role, r.Message.Content = "assistant", text.String()
	return r, nil
}
