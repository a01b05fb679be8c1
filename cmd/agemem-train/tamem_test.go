package main

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/agemem/agemem/internal/testkit"
	"github.com/agemem/agemem/llm/openai"
	"github.com/agemem/agemem/papers/tamem"
)

// TestCLILoCoMoTAMem: `locomo run --method ta-mem` over an OpenAI-compatible
// server whose model extracts one note a session (its speakers, a fact per
// message) and answers each question after one retrieval: the predictions
// carry the retrieved pages' dialogue ids, which score reads as evidence
// recall; the database file is reused by a second run without extracting
// again.
func TestCLILoCoMoTAMem(t *testing.T) {
	dir := t.TempDir()
	data := filepath.Join(dir, "locomo.json")
	mustRun(t, "locomo", "synth", "--samples", "1", "--sessions", "3", "--out", data)
	lineRe := regexp.MustCompile(`(?m)^\[(\d+)\] ([^:]+): (.*)$`)
	extractions := 0
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var req openai.ChatRequest
		json.NewDecoder(r.Body).Decode(&req)
		msg := map[string]any{"role": "assistant", "content": "Not mentioned"}
		switch {
		case strings.HasPrefix(req.Messages[0].Content, "You build a memory"):
			extractions++
			var nt tamem.Note
			for _, m := range lineRe.FindAllStringSubmatch(req.Messages[1].Content, -1) {
				n, _ := strconv.Atoi(m[1])
				nt.End = n
				nt.Persons = append(nt.Persons, m[2])
				nt.Facts = append(nt.Facts, tamem.Fact{Person: m[2], Fact: m[3]})
			}
			nt.Tag = "chat"
			raw, _ := json.Marshal([]tamem.Note{nt})
			msg["content"] = string(raw)
		case req.Messages[len(req.Messages)-1].Role == "user" && len(req.Tools) > 0:
			c := openai.WireToolCall{ID: "c1", Type: "function"}
			q, _ := json.Marshal(map[string]string{"query": req.Messages[len(req.Messages)-1].Content})
			c.Function.Name, c.Function.Arguments = "match_facts", string(q)
			msg["tool_calls"] = []any{c}
			msg["content"] = ""
		}
		json.NewEncoder(w).Encode(map[string]any{"choices": []any{map[string]any{"message": msg, "finish_reason": "stop"}},
			"usage": map[string]int{"prompt_tokens": 50, "completion_tokens": 5}})
	}))
	defer srv.Close()
	preds, db := filepath.Join(dir, "preds.jsonl"), filepath.Join(dir, "tamem.db")
	args := []string{"locomo", "run", "--data", data, "--method", "ta-mem", "--db", db, "--set", "openai.base_url=" + srv.URL + "/v1", "--model", "m", "--out", preds}
	mustRun(t, args...)
	if extractions != 3 {
		t.Fatalf("%d extraction calls for 3 sessions", extractions)
	}
	raw := string(mustRead(t, preds))
	if !strings.Contains(raw, `"prediction":"Not mentioned"`) || !strings.Contains(raw, `"context":["D`) {
		t.Fatalf("predictions: %.400s", raw)
	}
	out := mustRun(t, "locomo", "score", "--data", data, "--predictions", preds)
	if !strings.Contains(out, "evidence recall:") || !strings.Contains(out, "adversarial") {
		t.Fatalf("score:\n%s", out)
	}
	// The agent's retrieval by category: it calls match_facts, then
	// answers; 2 calls of 55 tokens a question.
	if !strings.Contains(out, "the retrieval agent by category") || !regexp.MustCompile(`overall \(1-4\)\s+\d+\s+2\.00\s+110\s+1\.00`).MatchString(out) {
		t.Fatalf("agent table:\n%s", out)
	}
	mustRun(t, args...)
	if extractions != 3 {
		t.Fatalf("the database was extracted again: %d calls", extractions)
	}
	// Figure 3's budget: one turn, which the agent spends on its call,
	// then it is asked for the answer.
	mustRun(t, append(args, "--max-turns", "1")...)
	if out := mustRun(t, "locomo", "score", "--data", data, "--predictions", preds); !regexp.MustCompile(`overall \(1-4\)\s+\d+\s+1\.00\s`).MatchString(out) {
		t.Fatalf("a budget of 1:\n%s", out)
	}
	if _, err := run(t, append(args, "--max-turns", "0")...); err == nil || !strings.Contains(err.Error(), "--max-turns 0") {
		t.Fatalf("--max-turns 0: %v", err)
	}
	// The chunking ablation: chunks of 40 words are more than one a
	// session, each extracted on its own, into pages the same database
	// keeps apart from the agent's; then chunks by meaning.
	mustRun(t, append(args, "--chunking", "fixed", "--chunk-tokens", "40")...)
	fixed := extractions - 3
	if fixed <= 3 {
		t.Fatalf("%d extraction calls for 40-word chunks of 3 sessions", fixed)
	}
	if raw := string(mustRead(t, preds)); !strings.Contains(raw, `"context":["D`) {
		t.Fatalf("fixed-chunk predictions: %.400s", raw)
	}
	mustRun(t, append(args, "--chunking", "semantic")...)
	if extractions-3-fixed < 3 {
		t.Fatalf("%d extraction calls for semantic chunks of 3 sessions", extractions-3-fixed)
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--chunking", "topics"}, `--chunking "topics"`},
		{[]string{"--chunking", "fixed", "--chunk-overlap", "1"}, "--chunk-overlap 1"},
		{[]string{"--chunking", "semantic", "--split-percentile", "101"}, "--split-percentile 101"},
		{[]string{"--chunking", "fixed", "--retrieval-only"}, "--chunking is TA-Mem's extraction"},
	} {
		if _, err := run(t, append(args, c.args...)...); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%v: %v", c.args, err)
		}
	}
}

// TestCLILoCoMoAgeMem: `locomo run --method agemem` plays a synthetic
// conversation through the memory runtime with a local checkpoint (a random
// tiny Qwen3: what it stores and answers is noise, the run is the point)
// and writes a prediction per question for score.
func TestCLILoCoMoAgeMem(t *testing.T) {
	dir := t.TempDir()
	data := filepath.Join(dir, "locomo.json")
	mustRun(t, "locomo", "synth", "--samples", "1", "--sessions", "2", "--out", data)
	model := filepath.Join(dir, "tiny")
	mustRun(t, "init-model", "--preset", "tiny", "--tokenizer", testkit.QwenTokenizer(t), "--out", model)
	preds := filepath.Join(dir, "preds.jsonl")
	mustRun(t, "locomo", "run", "--data", data, "--method", "agemem", "--native", model, "--chunk", "8",
		"--set", "agent.response_budget=8", "--set", "agent.max_steps=1", "--set", "agent.system_prompt=compact", "--out", preds)
	raw := string(mustRead(t, preds))
	if n := strings.Count(raw, "\n"); n == 0 || !strings.Contains(raw, `"qa_index":0`) {
		t.Fatalf("predictions: %.300s", raw)
	}
	if out := mustRun(t, "locomo", "score", "--data", data, "--predictions", preds); !strings.Contains(out, "overall") {
		t.Fatalf("score:\n%s", out)
	}
	if _, err := run(t, "locomo", "run", "--data", data, "--method", "agemem", "--out", preds); err == nil || !strings.Contains(err.Error(), "--native DIR") {
		t.Fatalf("no policy: %v", err)
	}
}
