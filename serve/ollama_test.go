package serve

import (
	"encoding/json"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/ollama/ollama/api"

	"github.com/agemem/agemem/llm/ollama"
	"github.com/agemem/agemem/memtools"
)

// ollamaChat is a stand-in Ollama whose model stores what the user says
// with a native tool call, then answers, streaming NDJSON as Ollama does.
type ollamaChat struct {
	mu   sync.Mutex
	reqs []api.ChatRequest
}

func (o *ollamaChat) handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /api/chat", func(w http.ResponseWriter, r *http.Request) {
		var req api.ChatRequest
		json.NewDecoder(r.Body).Decode(&req)
		o.mu.Lock()
		o.reqs = append(o.reqs, req)
		o.mu.Unlock()
		if req.Model != "qwen3:4b" {
			w.WriteHeader(http.StatusNotFound)
			json.NewEncoder(w).Encode(map[string]string{"error": "model \"" + req.Model + "\" not found, try pulling it first"})
			return
		}
		last := req.Messages[len(req.Messages)-1]
		enc := json.NewEncoder(w)
		m := api.Metrics{PromptEvalCount: 50, EvalCount: 7}
		if last.Role == "user" {
			tc := api.ToolCall{Function: api.ToolCallFunction{Name: "Add_memory", Arguments: api.NewToolCallFunctionArguments()}}
			tc.Function.Arguments.Set("content", last.Content)
			enc.Encode(api.ChatResponse{Message: api.Message{Role: "assistant", Thinking: "Worth keeping.", ToolCalls: []api.ToolCall{tc}}})
			enc.Encode(api.ChatResponse{Done: true, DoneReason: "stop", Metrics: m})
			return
		}
		for _, part := range []string{"Stored", " it for", " later."} {
			enc.Encode(api.ChatResponse{Message: api.Message{Role: "assistant", Content: part}})
			w.(http.Flusher).Flush()
		}
		enc.Encode(api.ChatResponse{Done: true, DoneReason: "stop", Metrics: m})
	})
	return mux
}

// A server whose policy is an Ollama model: the model's native tool call
// is executed against the caller's namespace, its reply is the answer,
// streamed or not; an Ollama that is down or lacks the model gets a 502
// that says so, and the server keeps serving.
func TestOllamaBackend(t *testing.T) {
	oc := &ollamaChat{}
	osrv := httptest.NewServer(oc.handler())
	defer osrv.Close()
	c := testConfig(t)
	c.Ollama.Format = "tools"
	client, err := ollama.New(osrv.URL, nil)
	if err != nil {
		t.Fatal(err)
	}
	m := c.Ollama.ChatModel(client, "qwen3:4b", false, c.Agent.ContextBudget, c.Agent.ResponseBudget)
	be := Remote{Model: memtools.FunctionCalling{Model: m}, Context: m.NumCtx}
	ts := start(t, c, be)

	got, resp := answer(t, ts, aliceKey, "", "My cat is called Tabby.")
	if got != "Stored it for later." {
		t.Fatalf("answer %q", got)
	}
	if u := resp["usage"].(map[string]any); u["completion_tokens"].(float64) != 14 || u["prompt_tokens"].(float64) != 100 {
		t.Errorf("usage %v", u)
	}
	ns, _ := ts.db.Namespace("alice")
	all, _ := ns.List(t.Context())
	if len(all) != 1 || all[0].Content != "My cat is called Tabby." {
		t.Fatalf("alice's memory: %+v", all)
	}
	if req := oc.reqs[0]; len(req.Tools) != 6 || req.Options["temperature"] != 1.0 || req.Options["num_ctx"] == nil {
		t.Errorf("request to Ollama: tools %d options %v", len(req.Tools), req.Options)
	}

	r := do(t, "POST", ts.URL+"/v1/chat/completions", aliceKey, chatBody("", "My dog is Rex.", "stream", true, "temperature", 0.2))
	if got := readSSE(t, r.Body); r.Status != 200 || got.content != "Stored it for later." || got.finish != "stop" {
		t.Fatalf("stream: %d %+v", r.Status, got)
	}
	if o := oc.reqs[len(oc.reqs)-1].Options; o["temperature"] != 0.2 {
		t.Errorf("request temperature not passed through: %v", o)
	}

	m.Name = "qwen3:14b"
	r = do(t, "POST", ts.URL+"/v1/chat/completions", aliceKey, chatBody("", "hello"))
	if r.Status != http.StatusBadGateway || r.errorCode(t) != "backend_unavailable" || !strings.Contains(string(r.Body), "ollama pull qwen3:14b") {
		t.Fatalf("missing model: %d %s", r.Status, r.Body)
	}
	ln, _ := net.Listen("tcp", "127.0.0.1:0")
	dead := ln.Addr().String()
	ln.Close()
	down, _ := ollama.New(dead, nil)
	m.Client, m.Name = down, "qwen3:4b"
	r = do(t, "POST", ts.URL+"/v1/chat/completions", aliceKey, chatBody("", "hello"))
	if r.Status != http.StatusBadGateway || !strings.Contains(string(r.Body), "cannot reach Ollama at http://"+dead) {
		t.Fatalf("Ollama down: %d %s", r.Status, r.Body)
	}
	m.Client = client
	if got, _ := answer(t, ts, aliceKey, "", "Back again."); got != "Stored it for later." {
		t.Fatalf("after the errors: %q", got)
	}
}
