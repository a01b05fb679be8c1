package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestCLIToolsRunConfig: a run of tools run written down in a config file
// (the nestful, memtoolagent and workbench sections) is what the command
// plays, and a flag that is given wins over its key. The runs stop
// before any model is asked: on the memory's samples, or the tasks file.
func TestCLIToolsRunConfig(t *testing.T) {
	dir := t.TempDir()
	var lines []string
	for i := range 4 {
		lines = append(lines, fmt.Sprintf(`{"sample_id": "s%d", "input": "What is %d times 3?", "output": [{"name": "multiply", "label": "$var_1", "arguments": {"arg_0": %d, "arg_1": 3}}], "tools": [{"name": "multiply", "description": "multiplies", "parameters": {"arg_0": {"type": "int"}, "arg_1": {"type": "int"}}, "output_parameter": {"result": {"type": "int"}}}], "gold_answer": %d}`, i, i, i, 3*i))
	}
	data := filepath.Join(dir, "nestful_data.jsonl")
	if err := os.WriteFile(data, []byte(strings.Join(lines, "\n")+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	nf, wb := filepath.Join(dir, "nestful.yaml"), filepath.Join(dir, "workbench.yaml")
	os.WriteFile(nf, []byte(fmt.Sprintf("nestful:\n  data: %s\n  test_size: 4\nmemtoolagent:\n  memory: on\n", data)), 0o644)
	os.WriteFile(wb, []byte("memtoolagent:\n  max_steps: 0\n"), 0o644)
	base := []string{"tools", "run", "--model", "m", "--set", "openai.base_url=http://127.0.0.1:9/v1"}
	for _, c := range []struct {
		args []string
		want string
	}{
		// The files' keys: a bad one named, the memory left no samples.
		{[]string{"--config", wb}, "memtoolagent.max_steps: 0: the model needs at least one turn"},
		{[]string{"--config", nf, "--env", "nestful"}, "none left to populate the memory: 4 samples, the first 4 the test set (nestful.test_size), memtoolagent.memory_size 500 (memtoolagent.memory on)"},
		// The flags over them.
		{[]string{"--config", nf, "--env", "nestful", "--limit", "2", "--memory-size", "0"}, "the first 2 the test set (nestful.test_size), memtoolagent.memory_size 0"},
		{[]string{"--config", wb, "--max-steps", "3", "--tasks", filepath.Join(dir, "missing.csv")}, "missing.csv"},
	} {
		_, err := run(t, append(base, c.args...)...)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%v: %v, want %q", c.args, err, c.want)
		}
	}
}
