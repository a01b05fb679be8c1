package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestSystemsOnRealOllama runs the four tool-use systems end to end on the
// Ollama at OLLAMA_HOST with native tools (--model ollama:NAME,
// AGEMEM_OLLAMA_MODEL, default qwen3:0.6b), skipped when none is set: MemToolAgent on
// WorkBench with and without memory, TA-Mem on a synthetic LoCoMo
// conversation, FitText's Memetic retrieval, MemTool's three modes. It
// checks that each completes and reports, not what a small model scores.
func TestSystemsOnRealOllama(t *testing.T) {
	host := os.Getenv("OLLAMA_HOST")
	if host == "" {
		t.Skip("set OLLAMA_HOST (and AGEMEM_OLLAMA_MODEL) to run against a real Ollama")
	}
	model := os.Getenv("AGEMEM_OLLAMA_MODEL")
	if model == "" {
		model = "qwen3:0.6b"
	}
	on := []string{"--set", "ollama.host=" + host, "--model", "ollama:" + model}
	dir := t.TempDir()

	out := mustRun(t, append([]string{"tools", "run", "--env", "workbench", "--memory", "both", "--limit", "12", "--max-steps", "4", "--out", filepath.Join(dir, "wb")}, on...)...)
	if !strings.Contains(out, "on ") || !strings.Contains(out, "off ") {
		t.Fatalf("workbench:\n%s", out)
	}

	data := filepath.Join(dir, "locomo.json")
	mustRun(t, "locomo", "synth", "--samples", "1", "--sessions", "2", "--out", data)
	preds := filepath.Join(dir, "preds.jsonl")
	mustRun(t, append([]string{"locomo", "run", "--data", data, "--method", "ta-mem", "--out", preds}, on...)...)
	if out := mustRun(t, "locomo", "score", "--data", data, "--predictions", preds); !strings.Contains(out, "overall") {
		t.Fatalf("ta-mem score:\n%s", out)
	}

	mustRun(t, "tools", "synth", "--providers", "10", "--queries", "4", "--out", dir)
	out = mustRun(t, append([]string{"tools", "retrieve", "--strategy", "query,memetic", "--data", filepath.Join(dir, "queries.jsonl"),
		"--corpus", filepath.Join(dir, "tools.jsonl")}, on...)...)
	if !strings.Contains(out, "memetic") {
		t.Fatalf("fittext:\n%s", out)
	}

	mt := filepath.Join(dir, "memtool")
	mustRun(t, "memtool", "synth", "--companies", "20", "--queries", "6", "--out", mt)
	out = mustRun(t, append([]string{"memtool", "bench", "--policy", "openai", "--set", "memtool.bench.queries=" + filepath.Join(mt, "queries.json"),
		"--set", "memtool.bench.tools=" + filepath.Join(mt, "tools.json"), "--set", "memtool.bench.out=" + filepath.Join(mt, "out"), "--set", "memtool.bench.turns=6"}, on...)...)
	if !strings.Contains(out, "autonomous") {
		t.Fatalf("memtool:\n%s", out)
	}
}
