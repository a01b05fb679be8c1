package ollama

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/ollama/ollama/api"

	"github.com/agemem/agemem/agent"
	"github.com/agemem/agemem/llm"
	"github.com/agemem/agemem/model/chat"
)

// TestChatModelRunsTheAgentLoop: an Ollama model drives the
// function-calling loop with native tools: the loop's tools reach Ollama
// with their schemas, its two calls of one turn come back with their
// arguments in order, the results go back as tool messages naming tool and
// call, and its plain reply ends the run; a missing model says how to get
// it.
func TestChatModelRunsTheAgentLoop(t *testing.T) {
	f, srv := newFake(t, "qwen3:4b")
	f.push(reply{calls: []api.ToolCall{toolCall("add", "a", 2, "b", 3), toolCall("echo", "text", "hi")}},
		reply{chunks: []string{"2 + 3 = ", "5."}})
	var got []string
	add := agent.Tool{Function: chat.Function{Name: "add", Description: "Adds two numbers.",
		Parameters: json.RawMessage(`{"type":"object","properties":{"a":{"type":"number"},"b":{"type":"number"}},"required":["a","b"]}`)},
		Call: func(_ context.Context, raw json.RawMessage) (string, error) {
			got = append(got, string(raw))
			return "5", nil
		}}
	echo := agent.Tool{Function: chat.Function{Name: "echo", Parameters: json.RawMessage(`{"type":"object","properties":{"text":{"type":"string"}}}`)},
		Call: func(_ context.Context, raw json.RawMessage) (string, error) {
			got = append(got, string(raw))
			return "hi", nil
		}}
	ts, err := agent.NewToolset(add, echo)
	if err != nil {
		t.Fatal(err)
	}
	m := &Model{Client: client(t, srv.URL), Name: "qwen3:4b"}
	tr, err := agent.Run(context.Background(), m, ts, []chat.Message{{Role: "user", Content: "Add 2 and 3, and say hi."}}, agent.Limits{MaxSteps: 4})
	if err != nil {
		t.Fatal(err)
	}
	if !tr.HasAnswer || tr.Answer != "2 + 3 = 5." || strings.Join(got, "|") != `{"a":2,"b":3}|{"text":"hi"}` {
		t.Fatalf("answer %q, calls %v", tr.Answer, got)
	}
	first, second := f.chats[0], f.chats[1]
	if len(first.Tools) != 2 || first.Tools[0].Function.Name != "add" || strings.Join(first.Tools[0].Function.Parameters.Required, ",") != "a,b" {
		t.Fatalf("tools sent: %+v", first.Tools)
	}
	if p, ok := first.Tools[0].Function.Parameters.Properties.Get("a"); !ok || p.Type[0] != "number" {
		t.Fatalf("property a: %+v", p)
	}
	if len(second.Messages) != 4 || len(second.Messages[1].ToolCalls) != 2 || second.Messages[2].Role != "tool" ||
		second.Messages[2].ToolName != "add" || second.Messages[2].ToolCallID != second.Messages[1].ToolCalls[0].ID || second.Messages[3].Content != "hi" {
		t.Fatalf("second request: %+v", second.Messages)
	}
	m.Name = "llama9:1b"
	if _, err := m.Chat(context.Background(), llm.Request{Messages: []chat.Message{{Role: "user", Content: "x"}}}); !errors.Is(err, ErrModelNotFound) || !strings.Contains(err.Error(), "ollama pull llama9:1b") {
		t.Fatalf("missing model: %v", err)
	}
}
