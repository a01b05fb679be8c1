package main

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/agemem/agemem/agent"
	"github.com/agemem/agemem/internal/testkit"
	"github.com/agemem/agemem/llm/openai"
	"github.com/agemem/agemem/memtools/ltm"
)

// planServer is an OpenAI-compatible server whose model makes the calls of
// plan in order, one a turn, then answers "done: " + the last result; it
// records the tools each request offered.
func planServer(t *testing.T, plan []openai.WireToolCall) (*httptest.Server, *[][]string) {
	var mu sync.Mutex
	var offered [][]string
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var req openai.ChatRequest
		json.NewDecoder(r.Body).Decode(&req)
		mu.Lock()
		var names []string
		for _, tl := range req.Tools {
			names = append(names, tl.Function.Name)
		}
		offered = append(offered, names)
		turn := len(offered) - 1
		mu.Unlock()
		msg := map[string]any{"role": "assistant", "content": ""}
		if turn < len(plan) {
			msg["tool_calls"] = []any{plan[turn]}
		} else {
			msg["content"] = "done: " + req.Messages[len(req.Messages)-1].Content
		}
		json.NewEncoder(w).Encode(map[string]any{"choices": []any{map[string]any{"message": msg, "finish_reason": "stop"}}})
	}))
	t.Cleanup(ts.Close)
	return ts, &offered
}

func plannedCall(name, args string) openai.WireToolCall {
	c := openai.WireToolCall{ID: "c_" + name, Type: "function"}
	c.Function.Name, c.Function.Arguments = name, args
	return c
}

// TestAgentWithMemoryTools: `agemem-train agent --memory` gives the model
// the long-term memory tools on memory.path; what it stores is in the
// store afterwards; --json prints the trace.
func TestAgentWithMemoryTools(t *testing.T) {
	ts, offered := planServer(t, []openai.WireToolCall{plannedCall("Add_memory", `{"content": "Ada is my sister."}`), plannedCall("Retrieve_memory", `{"query": "sister"}`)})
	db := filepath.Join(t.TempDir(), "m.db")
	out := mustRun(t, "agent", "--set", "openai.base_url="+ts.URL+"/v1", "--model", "m", "--memory", "--set", "memory.path="+db,
		"--prompt", "Remember my sister Ada.")
	if !strings.Contains(out, "Add_memory") || !strings.Contains(out, "-> ok") || !strings.Contains(out, "answer: done:") || !strings.Contains(out, "Ada is my sister.") {
		t.Fatalf("trace:\n%s", out)
	}
	if got := (*offered)[0]; len(got) != 4 || !slices.Contains(got, "Add_memory") || !slices.Contains(got, "Retrieve_memory") {
		t.Fatalf("tools offered: %v, want the four long-term memory tools", got)
	}
	s, err := ltm.OpenSQLite(db, ltm.SQLiteOptions{})
	if err != nil {
		t.Fatal(err)
	}
	ns, _ := s.Namespace("default")
	n, _ := ns.Count(t.Context())
	s.Close()
	if n != 1 {
		t.Fatalf("the store holds %d memories", n)
	}
	out = mustRun(t, "agent", "--set", "openai.base_url="+ts.URL+"/v1", "--model", "m", "--prompt", "hi", "--json")
	var tr agent.Trace
	if err := json.Unmarshal([]byte(out), &tr); err != nil || !tr.HasAnswer {
		t.Fatalf("%v: %s", err, out)
	}
	if _, err := run(t, "agent", "--set", "openai.base_url="+ts.URL+"/v1", "--model", "m"); err == nil || !strings.Contains(err.Error(), "--prompt") {
		t.Fatalf("no prompt: %v", err)
	}
}

// memoryServer is node and the reference "memory" MCP server's script
// (npm: make deps); the test skips without node.
func memoryServer(t *testing.T) (node, script string) {
	t.Helper()
	node, err := exec.LookPath("node")
	if err != nil {
		t.Skip("node is not installed")
	}
	return node, filepath.Join(testkit.NPM(t), "node_modules", "@modelcontextprotocol", "server-memory", "dist", "index.js")
}

// TestAgentWithThirdPartyMCPServer: the reference "memory" MCP server
// (npm, started over stdio with --mcp-command) lends its tools to the loop:
// the model creates an entity and reads the graph back.
func TestAgentWithThirdPartyMCPServer(t *testing.T) {
	node, server := memoryServer(t)
	graph := filepath.Join(t.TempDir(), "graph.jsonl")
	t.Setenv("MEMORY_FILE_PATH", graph)
	ts, offered := planServer(t, []openai.WireToolCall{
		plannedCall("create_entities", `{"entities": [{"name": "Ada", "entityType": "person", "observations": ["is the user's sister"]}]}`),
		plannedCall("read_graph", `{}`),
	})
	out := mustRun(t, "agent", "--set", "openai.base_url="+ts.URL+"/v1", "--model", "m", "--mcp-command", node+" "+server, "--prompt", "Remember Ada.")
	if strings.Count(out, "-> ok") != 2 || !strings.Contains(out, "answer: done:") || !strings.Contains(out, "is the user's sister") {
		t.Fatalf("trace:\n%s", out)
	}
	if !strings.Contains(strings.Join((*offered)[0], ","), "create_entities") {
		t.Fatalf("tools offered: %v", (*offered)[0])
	}
	if raw, err := os.ReadFile(graph); err != nil || !strings.Contains(string(raw), "Ada") {
		t.Fatalf("the server's graph file: %v %s", err, raw)
	}
}

// TestAgentOnTheNativeEngine: --native runs the loop on a local checkpoint
// (a random tiny Qwen3 with the real tokenizer here): whatever it writes,
// the run ends with a trace, not a crash.
func TestAgentOnTheNativeEngine(t *testing.T) {
	model := filepath.Join(t.TempDir(), "m")
	mustRun(t, "init-model", "--preset", "tiny-qwen3", "--tokenizer", testkit.QwenTokenizer(t), "--out", model)
	out := mustRun(t, "agent", "--native", model, "--device", "cpu", "--memory", "--set", "memory.path="+filepath.Join(t.TempDir(), "m.db"),
		"--set", "agent.response_budget=12", "--max-steps", "2", "--prompt", "Remember that Ada is my sister.")
	if !strings.HasPrefix(out, "tools: ") || !strings.Contains(out, "Add_memory") || !(strings.Contains(out, "answer: ") || strings.Contains(out, "no answer")) {
		t.Fatalf("trace:\n%s", out)
	}
	// No turn at all is refused, not played as one.
	if _, err := run(t, "agent", "--native", model, "--device", "cpu", "--max-steps", "0", "--prompt", "hi"); err == nil || !strings.Contains(err.Error(), "--max-steps 0") {
		t.Errorf("--max-steps 0: %v", err)
	}
}

// TestCLILoCoMo: synth writes LoCoMo's layout; score reads predictions,
// prints F1 by category, writes per-question scores, and names a bad
// prediction line. Outputs go into directories that do not exist yet, as
// the README's data/ does on a fresh clone.
func TestCLILoCoMo(t *testing.T) {
	dir := t.TempDir()
	data := filepath.Join(dir, "data", "locomo.json")
	mustRun(t, "locomo", "synth", "--samples", "2", "--sessions", "4", "--out", data)
	preds := filepath.Join(dir, "preds.jsonl")
	os.WriteFile(preds, []byte(`{"sample_id": "conv-1", "qa_index": 0, "prediction": "I do not know", "context": ["D1:1"]}`+"\n"), 0o644)
	scores := filepath.Join(dir, "runs", "scores.jsonl")
	out := mustRun(t, "locomo", "score", "--data", data, "--predictions", preds, "--out", scores)
	if !strings.Contains(out, "overall") || !strings.Contains(out, "questions have no prediction") {
		t.Fatalf("table:\n%s", out)
	}
	if raw := mustRead(t, scores); !strings.Contains(string(raw), `"qa_index":0`) {
		t.Fatalf("scores: %s", raw)
	}
	os.WriteFile(preds, []byte("{\"sample_id\": \"conv-1\", \"qa_index\": \"zero\"}\n"), 0o644)
	if _, err := run(t, "locomo", "score", "--data", data, "--predictions", preds); err == nil || !strings.Contains(err.Error(), "preds.jsonl:1") {
		t.Fatalf("bad line: %v", err)
	}
}

// TestCLILoCoMoRun: run --retrieval-only writes the retrieved turns, which
// score turns into evidence recall; run with a model writes answers; bad
// method combinations are refused.
func TestCLILoCoMoRun(t *testing.T) {
	dir := t.TempDir()
	data := filepath.Join(dir, "locomo.json")
	mustRun(t, "locomo", "synth", "--samples", "2", "--sessions", "5", "--out", data)
	preds := filepath.Join(dir, "runs", "rag", "preds.jsonl") // directories made for it
	mustRun(t, "locomo", "run", "--data", data, "--method", "rag", "--k", "3", "--retrieval-only", "--out", preds)
	// Retrieval-only predictions have no answers: the zero F1s say why.
	out := mustRun(t, "locomo", "score", "--data", data, "--predictions", preds)
	if !strings.Contains(out, "evidence recall:") || !strings.Contains(out, "no prediction states an answer") {
		t.Fatalf("score:\n%s", out)
	}
	ts, _ := planServer(t, nil) // answers "done: <prompt>" at once
	mustRun(t, "locomo", "run", "--data", data, "--method", "full-context", "--set", "openai.base_url="+ts.URL+"/v1", "--model", "m", "--out", preds)
	if raw := mustRead(t, preds); !strings.Contains(string(raw), `"prediction":"done:`) {
		t.Fatalf("predictions: %.300s", raw)
	}
	if out := mustRun(t, "locomo", "score", "--data", data, "--predictions", preds); !strings.Contains(out, "overall") || strings.Contains(out, "no prediction states") {
		t.Fatalf("score of answers:\n%s", out)
	}
	if _, err := run(t, "locomo", "run", "--data", data, "--method", "full-context", "--retrieval-only", "--out", preds); err == nil || !strings.Contains(err.Error(), "--method rag or ta-mem") {
		t.Fatalf("retrieval-only without a retriever: %v", err)
	}
	// TA-Mem's database with no model: every question gets k turns of the
	// conversation, and score measures them.
	mustRun(t, "locomo", "run", "--data", data, "--method", "ta-mem", "--k", "3", "--retrieval-only", "--out", preds)
	var p struct {
		Context []string `json:"context"`
	}
	lines := strings.Split(strings.TrimSpace(string(mustRead(t, preds))), "\n")
	for _, l := range lines {
		if err := json.Unmarshal([]byte(l), &p); err != nil || len(p.Context) != 3 {
			t.Fatalf("prediction %s: %v", l, err)
		}
	}
	if out := mustRun(t, "locomo", "score", "--data", data, "--predictions", preds); !strings.Contains(out, "evidence recall:") {
		t.Fatalf("score:\n%s", out)
	}
	if _, err := run(t, "locomo", "run", "--data", data, "--method", "ta-mem", "--window", "0", "--retrieval-only", "--out", preds); err == nil || !strings.Contains(err.Error(), "--window 0") {
		t.Fatalf("window 0: %v", err)
	}
	if _, err := run(t, "locomo", "run", "--data", data, "--method", "rag", "--k", "-1", "--retrieval-only", "--out", preds); err == nil || !strings.Contains(err.Error(), "--k -1: want at least 1") {
		t.Fatalf("k -1: %v", err)
	}
}

// TestCLIToolsScore: tools score evaluates a TREC run against qrels at the
// asked cutoffs and writes per-query values.
func TestCLIToolsScore(t *testing.T) {
	dir := t.TempDir()
	qrels, runf := filepath.Join(dir, "qrels"), filepath.Join(dir, "run")
	os.WriteFile(qrels, []byte("q1 0 a 1\nq2 0 b 1\nq3 0 c 1\n"), 0o644)
	os.WriteFile(runf, []byte("q1 Q0 a 1 2 x\nq1 Q0 z 2 1 x\nq2 Q0 z 1 2 x\nq2 Q0 b 2 1 x\n"), 0o644)
	out := mustRun(t, "tools", "score", "--qrels", qrels, "--run", runf, "--k", "1,2", "--out", filepath.Join(dir, "pq.jsonl"))
	// @1: q1 hit, q2 miss -> recall 0.5; @2: both found -> recall 1.
	if !strings.Contains(out, "1  0.5000  0.5000") || !strings.Contains(out, "2  ") || !strings.Contains(out, "1 judged queries have no ranking") {
		t.Fatalf("table:\n%s", out)
	}
	if raw := mustRead(t, filepath.Join(dir, "pq.jsonl")); strings.Count(string(raw), "\n") != 2 {
		t.Fatalf("per-query: %s", raw)
	}
}

// TestAgentMCPServersFromConfig: the same third-party server named in the
// config's mcp.servers, its env reading ${GRAPH} from the environment when
// it starts; a variable that is not set is an error naming server and key.
func TestAgentMCPServersFromConfig(t *testing.T) {
	node, server := memoryServer(t)
	graph := filepath.Join(t.TempDir(), "graph.jsonl")
	cfg := filepath.Join(t.TempDir(), "agent.yaml")
	body := fmt.Sprintf("mcp:\n  servers:\n    - name: memory\n      command: [%q, %q]\n      env: {MEMORY_FILE_PATH: \"${GRAPH}\"}\n", node, server)
	if err := os.WriteFile(cfg, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	ts, _ := planServer(t, []openai.WireToolCall{
		plannedCall("create_entities", `{"entities": [{"name": "Ada", "entityType": "person", "observations": ["likes tea"]}]}`),
	})
	args := []string{"agent", "--config", cfg, "--set", "openai.base_url=" + ts.URL + "/v1", "--model", "m", "--prompt", "Remember Ada."}
	t.Setenv("GRAPH", "")
	os.Unsetenv("GRAPH")
	if _, err := run(t, args...); err == nil || !strings.Contains(err.Error(), `MCP server "memory": env MEMORY_FILE_PATH names ${GRAPH}`) {
		t.Fatalf("GRAPH unset: %v", err)
	}
	t.Setenv("GRAPH", graph)
	out := mustRun(t, args...)
	if !strings.Contains(out, "-> ok") || !strings.Contains(out, "create_entities") {
		t.Fatalf("trace:\n%s", out)
	}
	if raw, err := os.ReadFile(graph); err != nil || !strings.Contains(string(raw), "likes tea") {
		t.Fatalf("the server's graph file (from the config's env): %v %s", err, raw)
	}
}
