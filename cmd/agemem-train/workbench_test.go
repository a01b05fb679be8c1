package main

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/agemem/agemem/bench/workbench"
	"github.com/agemem/agemem/llm/openai"
	"github.com/agemem/agemem/papers/fittext"
)

// TestCLIWorkBench: `tools run --env workbench` plays WorkBench's queries
// through an OpenAI-compatible server whose model makes each query's gold
// calls (one query of its set answered wrongly on purpose), with and
// without memory, and reports accuracy per domain, report.json and the
// chart; bad flags are named.
func TestCLIWorkBench(t *testing.T) {
	tasks, err := workbench.EmbeddedTasks("calendar")
	if err != nil {
		t.Fatal(err)
	}
	gold := map[string][]string{}
	for _, tk := range tasks[:20] {
		gold[tk.Query] = tk.Answer
	}
	wrong := tasks[3].Query
	var mu sync.Mutex
	offered := 0
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var req openai.ChatRequest
		json.NewDecoder(r.Body).Decode(&req)
		mu.Lock()
		offered = max(offered, len(req.Tools))
		mu.Unlock()
		msg := map[string]any{"role": "assistant", "content": "Done."}
		last := req.Messages[len(req.Messages)-1]
		if last.Role == "user" && len(req.Tools) > 0 {
			var calls []any
			acts := gold[last.Content]
			if last.Content == wrong {
				acts = []string{`calendar.delete_event.func(event_id="00000013")`}
			}
			for i, a := range acts {
				act, _ := workbench.ParseAction(a)
				args, _ := json.Marshal(act.Args())
				c := openai.WireToolCall{ID: "c" + string(rune('a'+i)), Type: "function"}
				c.Function.Name, c.Function.Arguments = act.Tool, string(args)
				calls = append(calls, c)
			}
			if len(calls) > 0 {
				msg["tool_calls"] = calls
			}
		}
		// Usage as servers report it: a prompt that grows with the
		// conversation (and the recalled memory), a short reply.
		raw, _ := json.Marshal(req.Messages)
		json.NewEncoder(w).Encode(map[string]any{"choices": []any{map[string]any{"message": msg, "finish_reason": "stop"}},
			"usage": map[string]int{"prompt_tokens": len(raw) / 4, "completion_tokens": 9}})
	}))
	defer srv.Close()
	out := filepath.Join(t.TempDir(), "wb")
	stdout := mustRun(t, "tools", "run", "--env", "workbench", "--memory", "both", "--set", "openai.base_url="+srv.URL+"/v1", "--model", "m",
		"--tasks", writeTasks(t, tasks[:20]), "--out", out)
	if offered != len(workbench.Tools) {
		t.Fatalf("%d tools offered", offered)
	}
	var rs []workbench.Result
	if err := json.Unmarshal(mustRead(t, filepath.Join(out, "report.json")), &rs); err != nil || len(rs) != 2 {
		t.Fatalf("report: %v %d\n%s", err, len(rs), stdout)
	}
	for _, r := range rs {
		n := len(r.Runs)
		if n == 0 || r.Accuracy.Mean < 0.9 || r.Accuracy.Mean == 1 || r.ByDomain["calendar"].N != n {
			t.Fatalf("memory %v: accuracy %+v over %d runs\n%s", r.Memory, r.Accuracy, n, stdout)
		}
	}
	if rs[1].MemorySize == 0 || len(rs[1].Recalled) != len(rs[1].Runs) || !strings.Contains(stdout, "on ") {
		t.Fatalf("memory run %+v\n%s", rs[1], stdout)
	}
	// A fixed count recalls it for every query (the paper's Figure 5
	// baseline).
	mustRun(t, "tools", "run", "--env", "workbench", "--memory", "on", "--recall", "top-1", "--set", "openai.base_url="+srv.URL+"/v1", "--model", "m",
		"--tasks", writeTasks(t, tasks[:20]), "--out", out)
	var top []workbench.Result
	if err := json.Unmarshal(mustRead(t, filepath.Join(out, "report.json")), &top); err != nil || len(top) != 1 {
		t.Fatalf("top-1 report: %v", err)
	}
	for _, n := range top[0].Recalled {
		if n != 1 {
			t.Fatalf("top-1 recalled %v", top[0].Recalled)
		}
	}
	// Tokens a query, as MemToolAgent's Table 5 counts them: two replies
	// of 9 (the calls, then "Done."), and a longer prompt with memory.
	if rs[0].OutputTokens != 18 || rs[1].OutputTokens != 18 || !(rs[1].InputTokens > rs[0].InputTokens) || !strings.Contains(stdout, "output tokens a query") {
		t.Fatalf("tokens: off %v/%v, on %v/%v\n%s", rs[0].InputTokens, rs[0].OutputTokens, rs[1].InputTokens, rs[1].OutputTokens, stdout)
	}
	if _, err := os.Stat(filepath.Join(out, "accuracy.png")); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--env", "nestful"}, "--env"},
		{[]string{"--memory", "maybe"}, "--memory"},
		{[]string{"--tasks", filepath.Join(out, "report.json")}, "report.json"},
		{[]string{"--max-steps", "0"}, "--max-steps 0: the model needs at least one turn"},
		{[]string{"--limit", "-1"}, "--limit -1"},
		{[]string{"--parallel", "0"}, "--parallel 0"},
		{[]string{"--radius", "0"}, "half window R 0"},
		{[]string{"--peak", "0"}, "peak number 0"},
		{[]string{"--fallback", "-1"}, "fallback -1"},
		{[]string{"--recall", "top-0"}, `--recall "top-0"`},
		{[]string{"--recall", "knee"}, `--recall "knee"`},
	} {
		if _, err := run(t, append([]string{"tools", "run", "--model", "m", "--set", "openai.base_url=" + srv.URL + "/v1", "--out", out}, c.args...)...); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%v: %v", c.args, err)
		}
	}
}

// TestCLIWorkBenchDFSDT: `tools run --agent dfsdt` plays FitText's agent
// through an OpenAI-compatible server whose model writes a pseudo-tool
// for each gold function it has not got (the function's own description),
// makes the gold calls once it has them, then calls Finish: right on
// every query with every function given (--retrieval none) and starting
// from Finish (single); the memory's and the react loop's flags are
// refused with it.
func TestCLIWorkBenchDFSDT(t *testing.T) {
	tasks, err := workbench.EmbeddedTasks("calendar")
	if err != nil {
		t.Fatal(err)
	}
	gold := map[string][]string{}
	for _, tk := range tasks[:12] {
		gold[tk.Query] = tk.Answer
	}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var req openai.ChatRequest
		json.NewDecoder(r.Body).Decode(&req)
		have := map[string]bool{}
		for _, tl := range req.Tools {
			have[tl.Function.Name] = true
		}
		msg := map[string]any{"role": "assistant", "content": ""}
		acts := gold[req.Messages[1].Content]
		done := 0
		for _, m := range req.Messages {
			if m.Role == "tool" {
				done++
			}
		}
		call := func(name string, args []byte) {
			c := openai.WireToolCall{ID: "c", Type: "function"}
			c.Function.Name, c.Function.Arguments = name, string(args)
			msg["tool_calls"] = []any{c}
		}
		if done < len(acts) {
			act, _ := workbench.ParseAction(acts[done])
			if !have[act.Tool] {
				tl, _ := workbench.ByName(act.Tool)
				msg["content"] = fittext.Begin + " " + tl.Description + " " + fittext.End
			} else {
				args, _ := json.Marshal(act.Args())
				call(act.Tool, args)
			}
		} else {
			call("Finish", []byte(`{"return_type":"give_answer","final_answer":"Done."}`))
		}
		json.NewEncoder(w).Encode(map[string]any{"choices": []any{map[string]any{"message": msg, "finish_reason": "stop"}}})
	}))
	defer srv.Close()
	out := filepath.Join(t.TempDir(), "wb")
	base := []string{"tools", "run", "--env", "workbench", "--agent", "dfsdt", "--set", "openai.base_url=" + srv.URL + "/v1", "--model", "m",
		"--tasks", writeTasks(t, tasks[:12]), "--out", out}
	stdout := mustRun(t, append(base, "--retrieval", "none,single")...)
	var rs []workbench.Result
	if err := json.Unmarshal(mustRead(t, filepath.Join(out, "report.json")), &rs); err != nil || len(rs) != 2 {
		t.Fatalf("report: %v %d\n%s", err, len(rs), stdout)
	}
	for i, want := range []string{"none", "single"} {
		r := rs[i]
		if r.Search == nil || r.Search.Retrieval != want || r.Accuracy.Mean != 1 || r.Accuracy.N == 0 || r.Search.Answered != 1 {
			t.Fatalf("%s: %+v %+v\n%s", want, r.Accuracy, r.Search, stdout)
		}
	}
	if rs[0].Search.Retrievals != 0 || rs[1].Search.Retrievals < 1 || !strings.Contains(stdout, "dfsdt single") {
		t.Fatalf("retrievals %v and %v\n%s", rs[0].Search.Retrievals, rs[1].Search.Retrievals, stdout)
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--retrieval", "query"}, `--retrieval "query"`},
		{[]string{"--retrieval", "single,single"}, "named twice"},
		{[]string{"--memory", "on"}, "--memory on"},
		{[]string{"--agent", "tree"}, `--agent "tree"`},
		{[]string{"--set", "fittext.dfsdt.width=0"}, "dfsdt.width"},
	} {
		if _, err := run(t, append(base, c.args...)...); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%v: %v", c.args, err)
		}
	}
	if _, err := run(t, "tools", "run", "--retrieval", "single", "--model", "m", "--out", out); err == nil || !strings.Contains(err.Error(), "--agent dfsdt") {
		t.Errorf("--retrieval with react: %v", err)
	}
}

// writeTasks writes tasks as a queries-and-answers CSV file.
func writeTasks(t *testing.T, tasks []workbench.Task) string {
	t.Helper()
	var b strings.Builder
	b.WriteString("query,answer,base_template,chosen_template,domains\n")
	q := func(s string) string { return `"` + strings.ReplaceAll(s, `"`, `""`) + `"` }
	for _, tk := range tasks {
		var acts []string
		for _, a := range tk.Answer {
			acts = append(acts, "'"+a+"'")
		}
		b.WriteString(strings.Join([]string{q(tk.Query), q("[" + strings.Join(acts, ", ") + "]"), q(tk.BaseTemplate), q(tk.ChosenTemplate), q("['calendar']")}, ",") + "\n")
	}
	path := filepath.Join(t.TempDir(), "tasks.csv")
	if err := os.WriteFile(path, []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}
