package main

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/agemem/agemem/bench/nestful"
	"github.com/agemem/agemem/llm/openai"
)

// TestCLINestful: `tools run --env nestful` on NESTFUL-format data through
// an OpenAI-compatible server whose model answers each query with its
// gold sequence (one query with a wrong divisor), with and without the
// memory, executing the calls with NESTFUL-layout Python functions for the
// win rate; bad flags and data are named.
func TestCLINestful(t *testing.T) {
	if _, err := exec.LookPath("python3"); err != nil {
		t.Skip("no python3 for the win rate")
	}
	dir := t.TempDir()
	tools := `[{"name": "multiply", "description": "multiplies two numbers", "parameters": {"arg_0": {"type": "int or float"}, "arg_1": {"type": "int or float"}}, "output_parameter": {"result": {"type": "int or float"}}}, {"name": "divide", "description": "divides two numbers", "parameters": {"arg_0": {"type": "int or float"}, "arg_1": {"type": "int or float"}}, "output_parameter": {"result": {"type": "int or float"}}}]`
	var lines []string
	gold := map[string]string{}
	for i := range 6 {
		q := fmt.Sprintf("What is %d times 3, halved?", i+1)
		calls := fmt.Sprintf(`[{"name": "multiply", "label": "$var_1", "arguments": {"arg_0": %d, "arg_1": 3}}, {"name": "divide", "label": "$var_2", "arguments": {"arg_0": "$var_1.result$", "arg_1": 2}}]`, i+1)
		gold[q] = calls
		lines = append(lines, fmt.Sprintf(`{"sample_id": "s%d", "input": %q, "output": %s, "tools": %s, "gold_answer": %g}`, i, q, calls, tools, float64(i+1)*3/2))
	}
	wrong := "What is 2 times 3, halved?"
	gold[wrong] = strings.Replace(gold[wrong], `"arg_1": 2}`, `"arg_1": 4}`, 1)
	data := filepath.Join(dir, "nestful_data.jsonl")
	if err := os.WriteFile(data, []byte(strings.Join(lines, "\n")+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	fn := filepath.Join(dir, "executable_functions")
	os.MkdirAll(fn, 0o755)
	os.WriteFile(filepath.Join(fn, "basic_functions.py"), []byte("def multiply(arg_0, arg_1):\n    return arg_0 * arg_1\ndef divide(arg_0, arg_1):\n    return arg_0 / arg_1\n"), 0o644)
	os.WriteFile(filepath.Join(fn, "func_file_map.json"), []byte("{}"), 0o644)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var req openai.ChatRequest
		json.NewDecoder(r.Body).Decode(&req)
		content := "The agent divided by the wrong number."
		if last := req.Messages[len(req.Messages)-1].Content; gold[last] != "" {
			content = gold[last]
		}
		json.NewEncoder(w).Encode(map[string]any{"choices": []any{map[string]any{"message": map[string]any{"role": "assistant", "content": content}, "finish_reason": "stop"}},
			"usage": map[string]int{"prompt_tokens": 50, "completion_tokens": 20}})
	}))
	defer srv.Close()
	out := filepath.Join(dir, "runs", "nestful")
	base := []string{"tools", "run", "--env", "nestful", "--set", "openai.base_url=" + srv.URL + "/v1", "--model", "m", "--data", data}
	stdout := mustRun(t, append(base, "--functions", fn, "--limit", "3", "--memory-size", "3", "--memory", "both", "--out", out)...)
	var rs []nestful.Result
	if err := json.Unmarshal(mustRead(t, filepath.Join(out, "report.json")), &rs); err != nil || len(rs) != 2 {
		t.Fatalf("report: %v\n%s", err, stdout)
	}
	for _, r := range rs {
		// s1 is the wrong one: 2 of 3 full and winning; its partial 1/2.
		if len(r.Runs) != 3 || r.Full.Mean != 2.0/3 || r.Win.Mean != 2.0/3 || r.Win.N != 3 || r.Partial.Mean != (1+0.5+1)/3.0 {
			t.Fatalf("memory %v: %+v\n%s", r.Memory, r, stdout)
		}
	}
	if rs[0].MemorySize != 0 || rs[1].MemorySize != 3 || rs[1].Runs[0].Recalled == 0 || !strings.Contains(stdout, "win rate") {
		t.Fatalf("memory sizes %d, %d\n%s", rs[0].MemorySize, rs[1].MemorySize, stdout)
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"tools", "run", "--env", "nestful", "--model", "m"}, "--env nestful needs --data"},
		{append(base, "--tasks", data), "--tasks is WorkBench's"},
		{append(base, "--agent", "dfsdt"), "--agent dfsdt"},
		{[]string{"tools", "run", "--env", "workbench", "--functions", fn}, "--functions and --memory-size are NESTFUL's"},
		{append(base, "--functions", dir), "not NESTFUL's executable_functions folder"},
		{append(base, "--limit", "6", "--memory", "on"), "none left to populate the memory"},
		{[]string{"tools", "run", "--env", "nestful", "--model", "m", "--data", filepath.Join(out, "report.json")}, "report.json"},
		{[]string{"tools", "run", "--env", "moon"}, `--env "moon"`},
	} {
		if _, err := run(t, c.args...); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%v: %v", c.args[2:], err)
		}
	}
}
