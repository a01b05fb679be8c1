package agent

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/agemem/agemem/memtools"
	"github.com/agemem/agemem/memtools/stm"
	"github.com/agemem/agemem/model/chat"
)

// PolicyModel is a Model over a memtools.Policy, a policy that takes plain
// messages and returns text: a GRPO rollout's recorder, the native engine,
// an Ollama model on raw prompts. The tools and the conversation's calls
// are written into the messages as the chat template writes them
// (chat.InlineTools), so the policy sees the prompt a native tool-calling
// request renders, and the reply's <tool_call> blocks are parsed back into
// calls. This is how any tool-using environment (MemTool's sessions)
// becomes trainable: every Chat is one Complete, recorded with its tokens.
type PolicyModel struct {
	Policy   memtools.Policy
	Template chat.Template // the policy's chat family (the tools' layout)
}

// Chat implements Model.
func (m PolicyModel) Chat(ctx context.Context, msgs []Message, specs []Spec) (Reply, error) {
	cm, tools, err := ChatMessages(msgs, specs)
	if err != nil {
		return Reply{}, err
	}
	in, err := chat.InlineTools(cm, chat.Options{Template: m.Template, Tools: tools})
	if err != nil {
		return Reply{}, err
	}
	sm := make([]stm.Message, len(in))
	for i, x := range in {
		sm[i] = stm.Message{Role: x.Role, Content: x.Content}
	}
	c, err := m.Policy.Complete(ctx, sm)
	if err != nil {
		return Reply{}, err
	}
	return Reply{Message: ParseReply(c.Text), PromptTokens: c.PromptTokens, CompletionTokens: c.CompletionTokens}, nil
}

// ChatMessages are a conversation and its tools as the chat template takes
// them: calls as structured tool_calls (arguments the model broke rendered
// as the text it wrote, not as broken JSON), tools as function definitions.
func ChatMessages(msgs []Message, specs []Spec) ([]chat.Message, []json.RawMessage, error) {
	cm := make([]chat.Message, len(msgs))
	for i, am := range msgs {
		cm[i] = chat.Message{Role: am.Role, Content: am.Content}
		for _, c := range am.ToolCalls {
			var tc chat.ToolCall
			tc.Function.Name = c.Name
			tc.Function.Arguments = json.RawMessage(c.Arguments)
			if !json.Valid(tc.Function.Arguments) {
				quoted, _ := json.Marshal(c.Arguments)
				tc.Function.Arguments = quoted
			}
			cm[i].ToolCalls = append(cm[i].ToolCalls, tc)
		}
	}
	tools := make([]json.RawMessage, len(specs))
	for i, s := range specs {
		raw, err := json.Marshal(map[string]any{"type": "function", "function": map[string]any{
			"name": s.Name, "description": s.Description, "parameters": s.Parameters}})
		if err != nil {
			return nil, nil, fmt.Errorf("tool %q: %w", s.Name, err)
		}
		tools[i] = raw
	}
	return cm, tools, nil
}

// ParseReply reads a reply's text into an assistant message: the text
// outside <tool_call> blocks is the content, each block a call. A block
// the model broke becomes a call the loop refuses with the parser's reason,
// so the model reads what was wrong.
func ParseReply(text string) Message {
	content, calls := chat.ParseToolCalls(text)
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

// ModelPolicy is PolicyModel the other way round: a Model (a scripted
// oracle, a served model) as a plain-text memtools.Policy. It reads the
// tools back out of the system message (chat.SplitTools) and the calls out
// of the assistant turns, and writes the model's calls as the template
// writes them (ReplyText), so a text environment can be driven by a
// scripted agent and its calls kept as SFT data in exactly the form a
// policy behind PolicyModel reads and writes.
type ModelPolicy struct {
	Model    Model
	Template chat.Template
}

// Complete implements memtools.Policy.
func (p ModelPolicy) Complete(ctx context.Context, msgs []stm.Message) (memtools.Completion, error) {
	var specs []Spec
	am := make([]Message, 0, len(msgs))
	for i, m := range msgs {
		c := m.Content
		if i == 0 && m.Role == stm.System {
			text, tools, ok := chat.SplitTools(c)
			if ok {
				c = text
				for _, raw := range tools {
					var def struct {
						Function Spec `json:"function"`
					}
					if err := json.Unmarshal(raw, &def); err != nil {
						return memtools.Completion{}, fmt.Errorf("tool definition %.80s: %w", raw, err)
					}
					specs = append(specs, def.Function)
				}
				if c == "" {
					continue // the tools section alone: no system message of its own
				}
			}
		}
		if m.Role == stm.Assistant {
			am = append(am, ParseReply(c))
			continue
		}
		am = append(am, Message{Role: m.Role, Content: c, Name: m.Name})
	}
	r, err := p.Model.Chat(ctx, am, specs)
	if err != nil {
		return memtools.Completion{}, err
	}
	text, err := ReplyText(r.Message, p.Template)
	return memtools.Completion{Text: text}, err
}

// ReplyText is an assistant message as its turn's text: the content, then
// each call as a <tool_call> block, as the chat template writes them.
func ReplyText(m Message, t chat.Template) (string, error) {
	cm, _, err := ChatMessages([]Message{m}, nil)
	if err != nil {
		return "", err
	}
	in, err := chat.InlineTools(cm, chat.Options{Template: t})
	if err != nil {
		return "", err
	}
	return in[0].Content, nil
}
