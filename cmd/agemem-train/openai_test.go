package main

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"

	"github.com/agemem/agemem/llm/openai"
)

// toolServer is an OpenAI-compatible server whose model uses the memory
// tools natively: it stores every casual user turn, retrieves for the
// question, and answers from what the retrieval returned.
func toolServer(t *testing.T) *httptest.Server {
	return httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var req openai.ChatRequest
		if err := json.NewDecoder(r.Body).Decode(&req); err != nil || len(req.Tools) != 6 {
			t.Errorf("request: %v, %d tools", err, len(req.Tools))
		}
		last := req.Messages[len(req.Messages)-1]
		msg := map[string]any{"role": "assistant", "content": ""}
		call := func(name string, args map[string]any) {
			raw, _ := json.Marshal(args)
			msg["tool_calls"] = []any{map[string]any{"id": "x", "type": "function", "function": map[string]any{"name": name, "arguments": string(raw)}}}
		}
		switch {
		case last.Role == "tool" && last.Name == "Retrieve_memory":
			msg["content"] = "retrieved"
		case last.Role == "tool":
			msg["content"] = "Noted."
		case strings.HasPrefix(last.Content, "Question:"):
			call("Retrieve_memory", map[string]any{"query": last.Content})
		default:
			call("Add_memory", map[string]any{"content": last.Content})
		}
		json.NewEncoder(w).Encode(map[string]any{"choices": []any{map[string]any{"message": msg, "finish_reason": "stop"}}})
	}))
}

// TestEpisodeOnOpenAIServer: `episode --policy openai` plays whole episodes
// on an OpenAI-compatible server in tools format, its native calls run as
// AgeMem tool calls; without a base_url it says what to set.
func TestEpisodeOnOpenAIServer(t *testing.T) {
	ts := toolServer(t)
	defer ts.Close()
	dir := t.TempDir()
	data := filepath.Join(dir, "synth.json")
	mustRun(t, "data", "synth", "--n", "3", "--seed", "5", "--out", data)
	out := mustRun(t, "episode", "--data", data, "--first", "3", "--policy", "openai", "--openai-model", "m",
		"--set", "openai.base_url="+ts.URL+"/v1", "--set", "openai.format=tools", "--json")
	var sums []summary
	if err := json.Unmarshal([]byte(out), &sums); err != nil || len(sums) != 1 {
		t.Fatalf("%v: %s", err, out)
	}
	s := sums[0]
	if s.Answered != 1 || s.ToolCalls["Add_memory"] < 1 || s.ToolCalls["Retrieve_memory"] != 1 || s.FormatErrors != 0 {
		t.Fatalf("summary %+v", s)
	}
	if _, err := run(t, "episode", "--data", data, "--first", "1", "--policy", "openai", "--openai-model", "m"); err == nil || !strings.Contains(err.Error(), "openai.base_url") {
		t.Fatalf("no base_url: %v", err)
	}
}
