package serve

import (
	"context"
	"encoding/json"
	"strings"
	"time"

	"github.com/agemem/agemem/llm"
	"github.com/agemem/agemem/memtools"
	"github.com/agemem/agemem/memtools/stm"
)

// scripted is a backend whose policy follows the AgeMem format without a
// model, so that tests exercise the server, not a model's skill:
//
//	"Remember: X"  → Add_memory(X), then answers "Stored."
//	"Recall: Q"    → Retrieve_memory(Q), then answers with the tool result
//	"Forget: X"    → Filter_context(X), then answers "Filtered."
//	"History?"     → answers with the user messages in its context
//	"Break"        → a broken tool call, every time
//	"Wait"         → blocks until the backend's gate is closed, then answers
//	anything else  → answers "echo: <message>"
type scripted struct {
	gate  chan struct{}
	calls chan string // each policy call's last message, if not nil
	// positions is the context length it reports (0: unknown).
	positions int
}

func newScripted() *scripted { return &scripted{gate: make(chan struct{})} }

func (s *scripted) Count(text string) int { return stm.Words{}.Count(text) }
func (s *scripted) Close()                {}
func (s *scripted) ContextLength() int    { return s.positions }

func think(text string) string { return "<think>" + text + "</think>\n" }

func toolCall(name string, args map[string]any) string {
	b, _ := json.Marshal(map[string]any{"name": name, "arguments": args})
	return think("use "+name) + "<tool_call>[" + string(b) + "]</tool_call>"
}

func answerText(a string) string { return think("answer") + "<answer>" + a + "</answer>" }

func (s *scripted) Chat(ctx context.Context, req llm.Request) (llm.Response, error) {
	last := req.Messages[len(req.Messages)-1]
	if s.calls != nil {
		s.calls <- last.Content
	}
	var user string
	for i := len(req.Messages) - 1; i >= 0; i-- {
		if req.Messages[i].Role == stm.User {
			user = req.Messages[i].Content
			break
		}
	}
	var out string
	switch {
	case user == "Break":
		out = `<think>hmm</think><tool_call>[{"name": "Add_memory", "arguments": {</tool_call>`
	case last.Role == stm.Tool && last.Name == memtools.ToolRetrieve:
		out = answerText(last.Content)
	case last.Role == stm.Tool && last.Name == memtools.ToolAdd:
		out = answerText("Stored.")
	case last.Role == stm.Tool:
		out = answerText("Done: " + last.Name)
	case strings.HasPrefix(user, "Remember: "):
		out = toolCall(memtools.ToolAdd, map[string]any{"content": strings.TrimPrefix(user, "Remember: ")})
	case strings.HasPrefix(user, "Recall: "):
		out = toolCall(memtools.ToolRetrieve, map[string]any{"query": strings.TrimPrefix(user, "Recall: "), "top_k": 1})
	case strings.HasPrefix(user, "Forget: "):
		out = toolCall(memtools.ToolFilter, map[string]any{"criteria": strings.TrimPrefix(user, "Forget: ")})
	case user == "History?":
		var us []string
		for _, m := range req.Messages {
			if m.Role == stm.User {
				us = append(us, m.Content)
			}
		}
		out = answerText(strings.Join(us, " | "))
	case user == "Wait":
		select {
		case <-s.gate:
		case <-ctx.Done():
			return llm.Response{}, ctx.Err()
		}
		out = answerText("waited")
	default:
		out = answerText("echo: " + user)
	}
	if req.OnText != nil {
		// Stream the response in pieces as a model would.
		for i := 1; i <= len(out); i += 7 {
			piece := out[:i]
			req.OnText(func() string { return piece })
			time.Sleep(time.Millisecond)
		}
		req.OnText(func() string { return out })
	}
	n := 0
	for _, m := range req.Messages {
		n += stm.Words{}.Count(m.Content)
	}
	r := llm.Reply(out)
	r.PromptTokens, r.CompletionTokens, r.FinishReason = n, stm.Words{}.Count(out), "stop"
	return r, nil
}
