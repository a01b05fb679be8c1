package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/agemem/agemem/agent"
	"github.com/agemem/agemem/bench/stabletoolbench"
	"github.com/agemem/agemem/embed"
	"github.com/agemem/agemem/internal/testkit"
	"github.com/agemem/agemem/llm"
	"github.com/agemem/agemem/llm/openai"
	"github.com/agemem/agemem/model/chat"
	"github.com/agemem/agemem/papers/memtool"
)

// memtool synth writes a benchmark that memtool bench reads; the oracle
// agent gets every turn right in every mode, and the report and the chart
// are written.
func TestCLIMemtool(t *testing.T) {
	dir := t.TempDir()
	mustRun(t, "memtool", "synth", "--companies", "40", "--queries", "30", "--out", dir)
	out := filepath.Join(dir, "out")
	set := []string{"--set", "memtool.bench.queries=" + filepath.Join(dir, "queries.json"), "--set", "memtool.bench.tools=" + filepath.Join(dir, "tools.json"),
		"--set", "memtool.bench.out=" + out, "--set", "memtool.bench.turns=20"}
	got := mustRun(t, append([]string{"memtool", "bench", "--policy", "oracle"}, set...)...)
	for _, mode := range []string{"autonomous", "workflow", "hybrid"} {
		if !strings.Contains(got, "oracle   "+mode) {
			t.Fatalf("no %s row:\n%s", mode, got)
		}
	}
	if !strings.Contains(got, "200 tools, 20 turns, L = 128") || !strings.Contains(got, "1.000     1.000") {
		t.Fatalf("report:\n%s", got)
	}
	var rep struct {
		Modes []struct {
			Counts []int `json:"tool_count_per_turn"`
		} `json:"modes"`
	}
	b, err := os.ReadFile(filepath.Join(out, "report.json"))
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, &rep); err != nil || len(rep.Modes) != 3 || len(rep.Modes[0].Counts) != 20 {
		t.Fatalf("report.json: %v %+v", err, rep)
	}
	if st, err := os.Stat(filepath.Join(out, "tools.png")); err != nil || st.Size() == 0 {
		t.Fatalf("tools.png: %v", err)
	}
	// The built-in engine as the agent and controller: a random tiny model
	// writes nonsense, and the session still runs to its end and is measured.
	model := filepath.Join(dir, "tiny")
	mustRun(t, "init-model", "--preset", "tiny", "--tokenizer", testkit.QwenTokenizer(t), "--out", model)
	got = mustRun(t, append([]string{"memtool", "bench", "--policy", "native", "--native", model, "--set", "memtool.bench.turns=3",
		"--set", "memtool.max_steps=2", "--set", "agent.response_budget=16"}, set[:6]...)...)
	if !strings.Contains(got, "native   hybrid") {
		t.Fatalf("native report:\n%s", got)
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--modes", "auto"}, `--modes: "auto"`},
		{[]string{"--policy", "gpt"}, `--policy "gpt"`},
		{[]string{"--policy", "native"}, "needs --native DIR"},
		{[]string{"--set", "memtool.limit=1"}, "memtool.limit"},
		{[]string{"--set", "memtool.bench.queries=" + filepath.Join(dir, "tools.json")}, "query 0 (query_id 0): no query text"},
		{[]string{"--set", "memtool.bench.judge=model"}, "--judge-model"},
	} {
		_, err := run(t, append(append([]string{"memtool", "bench"}, set...), c.args...)...)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%v: error %v, want %q", c.args, err, c.want)
		}
	}
}

// memtool train runs GRPO in the Autonomous mode from the command line:
// rollouts through the native policy, the MemTool reward's parts in the
// metrics, a policy written; the held-out benchmark queries are refused as
// training data.
func TestCLIMemtoolTrain(t *testing.T) {
	dir := t.TempDir()
	mustRun(t, "memtool", "synth", "--companies", "20", "--queries", "12", "--out", dir)
	model := filepath.Join(dir, "tiny")
	mustRun(t, "init-model", "--preset", "tiny", "--tokenizer", testkit.QwenTokenizer(t), "--out", model)
	out := filepath.Join(dir, "rl")
	set := []string{"--set", "memtool.bench.queries=" + filepath.Join(dir, "queries.json"), "--set", "memtool.bench.tools=" + filepath.Join(dir, "tools.json"),
		"--set", "memtool.bench.turns=10", "--set", "memtool.train.turns=1", "--set", "memtool.max_steps=1", "--set", "memtool.limit=8",
		"--set", "agent.response_budget=8", "--set", "rl.init=" + model, "--set", "rl.out=" + out,
		"--set", "rl.k=2", "--set", "rl.batch_tasks=1", "--set", "rl.steps=1", "--set", "rl.save_every=0"}
	got := mustRun(t, append([]string{"memtool", "train"}, set...)...)
	if !strings.Contains(got, "tool correctness") || !strings.Contains(got, "policy written to") {
		t.Fatalf("output:\n%s", got)
	}
	var step map[string]any
	lines := strings.Split(strings.TrimSpace(string(mustRead(t, filepath.Join(out, "metrics.jsonl")))), "\n")
	if err := json.Unmarshal([]byte(lines[len(lines)-1]), &step); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"tool_correctness", "removal_ratio", "under_limit"} {
		if _, ok := step[k].(float64); !ok {
			t.Fatalf("metrics.jsonl has no %s: %s", k, lines[len(lines)-1])
		}
	}
	if _, err := os.Stat(filepath.Join(out, "policy", "model.safetensors")); err != nil {
		t.Fatal(err)
	}
	// Validation on other questions over the same tools: J before the
	// first step and after each, and the best step's policy kept.
	mustRun(t, "memtool", "synth", "--companies", "20", "--queries", "8", "--query-seed", "5", "--out", filepath.Join(dir, "val"))
	val := append(slices.Clone(set), "--set", "memtool.train.val="+filepath.Join(dir, "val", "queries.json"), "--set", "rl.steps=2",
		"--set", "rl.val_every=1", "--set", "rl.val_tasks=2", "--set", "memtool.eval.turns=2", "--set", "rl.keep_best=true", "--set", "rl.out="+filepath.Join(dir, "rl-val"))
	got, err := run(t, append([]string{"memtool", "train"}, val...)...)
	if err != nil || !strings.Contains(got, "policy written to") {
		t.Fatalf("memtool train with validation: %v\n%s", err, got)
	}
	lines = strings.Split(strings.TrimSpace(string(mustRead(t, filepath.Join(dir, "rl-val", "metrics.jsonl")))), "\n")
	js := 0
	for _, l := range lines {
		if strings.Contains(l, `"val_j"`) {
			js++
		}
	}
	if js < 2 {
		t.Fatalf("%d validations in metrics.jsonl, want one per step:\n%s", js, strings.Join(lines, "\n"))
	}
	// Questions about tools the knowledge base lacks (another world) are
	// refused, naming the key.
	mustRun(t, "memtool", "synth", "--companies", "20", "--queries", "8", "--seed", "7", "--out", filepath.Join(dir, "other"))
	val[len(set)+1] = "memtool.train.val=" + filepath.Join(dir, "other", "queries.json")
	if _, err := run(t, append([]string{"memtool", "train"}, val...)...); err == nil || !strings.Contains(err.Error(), "memtool.train.val") {
		t.Fatalf("validation questions over other tools: %v", err)
	}
	// SFT data from the oracle in the same text: each record ends with the
	// oracle's reply, the first of a session a search, and sft reads them.
	data := filepath.Join(dir, "sft.jsonl")
	got = mustRun(t, append([]string{"memtool", "data", "--out", data}, set[:16]...)...)
	if !strings.Contains(got, "wrote ") {
		t.Fatalf("memtool data: %s", got)
	}
	var rec struct {
		Messages []struct{ Role, Content string } `json:"messages"`
	}
	first := strings.SplitN(string(mustRead(t, data)), "\n", 2)[0]
	if err := json.Unmarshal([]byte(first), &rec); err != nil {
		t.Fatal(err)
	}
	last := rec.Messages[len(rec.Messages)-1]
	if rec.Messages[0].Role != "system" || !strings.Contains(rec.Messages[0].Content, "<tools>") || last.Role != "assistant" || !strings.HasPrefix(last.Content, "<tool_call>\n{\"name\": \"SYS_SEARCH_TOOLS\"") {
		t.Fatalf("first record: %s", first)
	}
	mustRun(t, "sft", "--set", "model.path="+model, "--set", "sft.data="+data, "--set", "sft.steps=1", "--set", "sft.eval_every=0",
		"--set", "sft.save_every=0", "--set", "sft.out="+filepath.Join(dir, "sft"), "--set", "sft.eval_fraction=0")
	if _, err := run(t, "memtool", "data", "--out", data, "--chat", "llama"); err == nil || !strings.Contains(err.Error(), `--chat "llama"`) {
		t.Fatalf("--chat llama: %v", err)
	}
	_, err = run(t, append(append([]string{"memtool", "train"}, set...), "--set", "memtool.bench.turns=12")...)
	if err == nil || !strings.Contains(err.Error(), "all in the benchmark's session") {
		t.Fatalf("training on the benchmark's queries: %v", err)
	}
}

// oracleServer is an OpenAI-compatible server whose model is
// memtool.Oracle (the agent and the controller, by native function calls)
// and a judge that always says 1: memtool bench over the openai backend.
// kb is the knowledge base its keywords are chosen in (nil: the queries'
// api_lists).
func oracleServer(t *testing.T, queries string, kb *agent.Catalog) (*httptest.Server, *atomic.Int32) {
	t.Helper()
	qs, err := stabletoolbench.LoadQueries(queries)
	if err != nil {
		t.Fatal(err)
	}
	o := memtool.Oracle{Gold: map[string][]string{}}
	for _, q := range qs {
		o.Gold[q.Text] = q.Gold
	}
	// The tools of the queries' api_lists are the same tools as the
	// collection's.
	if kb == nil {
		if kb, err = agent.NewCatalog(context.Background(), embed.NewHashing(16, nil), stabletoolbench.QueryTools(qs)); err != nil {
			t.Fatal(err)
		}
	}
	o.KB = kb
	var judged atomic.Int32
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var req openai.ChatRequest
		if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
			http.Error(w, err.Error(), 400)
			return
		}
		var msgs []chat.Message
		for _, m := range req.Messages {
			am := chat.Message{Role: m.Role, Content: m.Content, ToolCallID: m.ToolCallID, Name: m.Name}
			for _, c := range m.ToolCalls {
				am.ToolCalls = append(am.ToolCalls, chat.ToolCall{ID: c.ID, Name: c.Function.Name, Arguments: c.Function.Arguments})
			}
			msgs = append(msgs, am)
		}
		var ss []chat.Function
		for _, tl := range req.Tools {
			params, _ := json.Marshal(tl.Function.Parameters)
			ss = append(ss, chat.Function{Name: tl.Function.Name, Parameters: params})
		}
		msg := map[string]any{"role": "assistant", "content": ""}
		if strings.HasPrefix(msgs[0].Content, "You grade") {
			judged.Add(1)
			msg["content"] = "1"
		} else {
			rep, err := o.Chat(r.Context(), llm.Request{Messages: msgs, Tools: ss})
			if err != nil {
				http.Error(w, err.Error(), 500)
				return
			}
			msg["content"] = rep.Message.Content
			var calls []any
			for i, c := range rep.Message.ToolCalls {
				calls = append(calls, map[string]any{"id": fmt.Sprintf("call_%d", i), "type": "function",
					"function": map[string]any{"name": c.Name, "arguments": c.Arguments}})
			}
			if calls != nil {
				msg["tool_calls"] = calls
			}
		}
		json.NewEncoder(w).Encode(map[string]any{"choices": []any{map[string]any{"message": msg, "finish_reason": "stop"}}})
	}))
	t.Cleanup(ts.Close)
	return ts, &judged
}

// memtool bench on an OpenAI-compatible server, by native function calls:
// the agent, a separate controller model and the LLM judge all answer
// there, and a competent model gets every turn right in every mode.
func TestCLIMemtoolOverOpenAI(t *testing.T) {
	dir := t.TempDir()
	mustRun(t, "memtool", "synth", "--companies", "30", "--queries", "12", "--out", dir)
	ts, judged := oracleServer(t, filepath.Join(dir, "queries.json"), nil)
	got := mustRun(t, "memtool", "bench", "--policy", "openai", "--model", "agent", "--controller-model", "controller", "--judge-model", "judge",
		"--set", "openai.base_url="+ts.URL+"/v1", "--set", "memtool.bench.judge=model",
		"--set", "memtool.bench.queries="+filepath.Join(dir, "queries.json"), "--set", "memtool.bench.tools="+filepath.Join(dir, "tools.json"),
		"--set", "memtool.bench.out="+filepath.Join(dir, "out"), "--set", "memtool.bench.turns=12")
	for _, mode := range []string{"autonomous", "workflow", "hybrid"} {
		if !strings.Contains(got, "openai   "+mode) {
			t.Fatalf("no %s row:\n%s", mode, got)
		}
	}
	if strings.Count(got, "1.000     1.000") != 3 || judged.Load() != 36 {
		t.Fatalf("want tool correctness and task completion 1 in every mode, 36 judge calls (got %d):\n%s", judged.Load(), got)
	}
}

// memtool bench --live: the knowledge base is a live MCP server's tools
// (given by --mcp-url, so named url1 in the queries' relevant APIs), the
// oracle's calls run on it, and its answers state what the server returned.
func TestCLIMemtoolLive(t *testing.T) {
	srv := mcp.NewServer(&mcp.Implementation{Name: "weather", Version: "1"}, nil)
	var calls atomic.Int32
	for _, city := range []string{"Oslo", "Lima", "Pune", "Kobe"} {
		for _, what := range []string{"temperature", "rainfall"} {
			text := fmt.Sprintf("%s %s: %d", city, what, len(city)*len(what))
			srv.AddTool(&mcp.Tool{Name: strings.ToLower(city) + "_" + what, Description: fmt.Sprintf("Today's %s in %s.", what, city), InputSchema: map[string]any{"type": "object"}},
				func(context.Context, *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
					calls.Add(1)
					return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: text}}}, nil
				})
		}
	}
	hs := httptest.NewServer(mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return srv }, nil))
	defer hs.Close()
	dir := t.TempDir()
	query := func(id int, text string, rel ...string) map[string]any {
		var apis []map[string]any
		var relevant [][]string
		for _, r := range rel {
			server, tool, _ := strings.Cut(r, "/")
			apis = append(apis, map[string]any{"tool_name": server, "api_name": tool, "api_description": "-"})
			relevant = append(relevant, []string{server, tool})
		}
		return map[string]any{"query_id": id, "query": text, "api_list": apis, "relevant APIs": relevant}
	}
	writeQueries := func(name string, qs ...map[string]any) string {
		b, _ := json.Marshal(qs)
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, b, 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	good := writeQueries("queries.json",
		query(1, "How warm is it in Oslo?", "url1/oslo_temperature"),
		query(2, "Is it raining in Lima, and how warm is it?", "url1/lima_rainfall", "url1/lima_temperature"))
	args := []string{"memtool", "bench", "--live", "--mcp-url", hs.URL, "--modes", "autonomous", "--set", "memtool.limit=10", "--set", "memtool.top_k=2",
		"--set", "memtool.bench.turns=2", "--set", "memtool.bench.out=" + filepath.Join(dir, "out")}
	got := mustRun(t, append(args, "--set", "memtool.bench.queries="+good)...)
	if !strings.Contains(got, "8 tools, 2 turns") || !strings.Contains(got, "1.000     1.000") || calls.Load() != 3 {
		t.Fatalf("live bench (%d calls on the server):\n%s", calls.Load(), got)
	}
	b, err := os.ReadFile(filepath.Join(dir, "out", "report.json"))
	if err != nil || !strings.Contains(string(b), "Lima rainfall: 32") {
		t.Fatalf("report.json does not carry the server's results: %v", err)
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--set", "memtool.bench.queries=" + writeQueries("bad.json", query(7, "Snow in Oslo?", "url1/oslo_snow"))}, `query 7: relevant API "oslo_snow" of "url1" is not in the knowledge base (as "oslo_snow_for_url1", or as a tool of the MCP server "url1")`},
		{[]string{"--set", "memtool.bench.queries=" + writeQueries("other.json", query(8, "Warm in Oslo?", "weather/oslo_temperature"))}, `or as a tool of the MCP server "weather")`},
		{[]string{"--set", "memtool.bench.queries=" + good, "--mcp-header", "nocolon"}, `--mcp-header "nocolon"`},
	} {
		if _, err := run(t, append(slices.Clone(args), c.args...)...); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%v: error %v, want %q", c.args, err, c.want)
		}
	}
	if _, err := run(t, "memtool", "bench", "--live", "--set", "memtool.bench.queries="+good); err == nil || !strings.Contains(err.Error(), "--live: no MCP server") {
		t.Errorf("--live without a server: %v", err)
	}
}

// The reference "memory" MCP server (npm, started over stdio, so named
// command1) as the live knowledge base: the oracle reads its graph with its
// read_graph tool.
func TestCLIMemtoolLiveThirdParty(t *testing.T) {
	node, server := memoryServer(t)
	dir := t.TempDir()
	t.Setenv("MEMORY_FILE_PATH", filepath.Join(dir, "graph.jsonl"))
	qs := `[{"query_id": 1, "query": "Show me everything in the knowledge graph.",
	  "api_list": [{"tool_name": "command1", "api_name": "read_graph"}], "relevant APIs": [["command1", "read_graph"]]}]`
	if err := os.WriteFile(filepath.Join(dir, "q.json"), []byte(qs), 0o644); err != nil {
		t.Fatal(err)
	}
	got := mustRun(t, "memtool", "bench", "--live", "--mcp-command", node+" "+server, "--modes", "autonomous", "--set", "memtool.limit=12",
		"--set", "memtool.top_k=2", "--set", "memtool.bench.queries="+filepath.Join(dir, "q.json"), "--set", "memtool.bench.out="+filepath.Join(dir, "out"))
	if !strings.Contains(got, "1 turns") || !strings.Contains(got, "1.000     1.000") {
		t.Fatalf("live bench over the reference server:\n%s", got)
	}
	b, err := os.ReadFile(filepath.Join(dir, "out", "report.json"))
	if err != nil || !strings.Contains(string(b), `read_graph: {`) {
		t.Fatalf("report.json: %v\n%.2000s", err, b)
	}
}
