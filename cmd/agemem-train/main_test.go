package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/agemem/agemem/internal/testkit"
	"github.com/agemem/agemem/model/lora"
	"github.com/agemem/agemem/model/qwen"
	"github.com/agemem/agemem/model/tokenizer"
)

func run(t *testing.T, args ...string) (string, error) {
	t.Helper()
	out, _, err := runStreams(args...)
	return out, err
}

// runCombined is run with stderr (logs, progress) after stdout.
func runCombined(t *testing.T, args ...string) (string, error) {
	t.Helper()
	out, errs, err := runStreams(args...)
	return out + errs, err
}

// runStreams runs the CLI and returns what it wrote to stdout and to
// stderr (progress and logs), apart, as a pipe would see them.
func runStreams(args ...string) (string, string, error) {
	root := newRoot()
	var out, errs bytes.Buffer
	root.SetOut(&out)
	root.SetErr(&errs)
	root.SetArgs(args)
	err := root.Execute()
	return out.String(), errs.String(), err
}

// mustRun runs a setup command, failing the test if it fails.
func mustRun(t *testing.T, args ...string) string {
	t.Helper()
	out, err := run(t, args...)
	if err != nil {
		t.Fatalf("agemem-train %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return out
}

func mustRead(t *testing.T, path string) []byte {
	t.Helper()
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return raw
}

func TestCLIDataAndEpisodes(t *testing.T) {
	dir := t.TempDir()
	data := filepath.Join(dir, "synth.json")
	if _, err := run(t, "data", "synth", "--n", "20", "--seed", "5", "--out", data); err != nil {
		t.Fatal(err)
	}
	out, err := run(t, "episode", "--data", data, "--first", "20", "--policy", "no-memory,oracle")
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 3 || !strings.HasPrefix(lines[2], "oracle     20     1.000") {
		t.Fatalf("summary table:\n%s", out)
	}
	out, err = run(t, "episode", "--data", data, "--task", "synth-000004", "--policy", "oracle")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"=== Stage 1", "=== Stage 2", "=== Stage 3", "long-term memory after stage 1: 2 entries", "[tool Retrieve_memory]", "EM 1"} {
		if !strings.Contains(out, want) {
			t.Errorf("trace lacks %q", want)
		}
	}
	out, err = run(t, "episode", "--data", data, "--task", "synth-000004", "--policy", "oracle", "--json")
	if err != nil {
		t.Fatal(err)
	}
	var res struct {
		TaskID string  `json:"task_id"`
		EM     float64 `json:"em"`
	}
	if err := json.Unmarshal([]byte(out), &res); err != nil || res.TaskID != "synth-000004" || res.EM != 1 {
		t.Fatalf("json: %v %+v", err, res)
	}
}

func TestCLIErrors(t *testing.T) {
	dir := t.TempDir()
	data := filepath.Join(dir, "synth.json")
	mustRun(t, "data", "synth", "--n", "3", "--out", data)
	bad := filepath.Join(dir, "bad.yaml")
	os.WriteFile(bad, []byte("agent:\n  max_stepz: 2\n"), 0o644)
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"episode", "--data", data, "--task", "nope"}, `task "nope" is not in`},
		{[]string{"episode", "--data", data, "--first", "2", "--policy", "gpt"}, `--policy "gpt"`},
		{[]string{"episode", "--data", data, "--first", "-2"}, "--first -2"},
		{[]string{"episode", "--data", data, "--first", "1", "--temperature", "-1"}, "--temperature -1"},
		{[]string{"data", "sft", "--policy", "oracle", "--data", data, "--out", filepath.Join(dir, "x.jsonl"), "--n", "-3"}, "--n -3"},
		{[]string{"tokenizer", "train", "--data", data, "--episodes", "-1", "--out", filepath.Join(dir, "tk")}, "--episodes -1"},
		{[]string{"train", "--dry-run", "--device-gib", "0"}, "--device-gib 0"},
		{[]string{"sft", "--gen-eval", "-1"}, "--gen-eval -1"},
		{[]string{"episode", "--data", data}, "exactly one of --task"},
		{[]string{"episode", "--data", filepath.Join(dir, "missing.json"), "--first", "1"}, "no such file"},
		{[]string{"--config", bad, "episode", "--data", data, "--first", "1"}, "unknown key agent.max_stepz"},
		{[]string{"--set", "tools.filter_threshold=2", "config"}, "tools.filter_threshold"},
		{[]string{"data", "synth", "--n", "0", "--out", filepath.Join(dir, "x.json")}, "--n must be at least 1"},
	} {
		if _, err := run(t, tc.args...); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: got %v, want %q", tc.args, err, tc.want)
		}
	}
}

func TestCLIModelCommands(t *testing.T) {
	tokPath := testkit.QwenTokenizer(t)
	if _, err := os.Stat(tokPath); err != nil {
		t.Fatalf("run `make deps`: %v", err)
	}
	dir := filepath.Join(t.TempDir(), "tiny")
	if _, err := run(t, "init-model", "--preset", "tiny-qwen2", "--tokenizer", tokPath, "--out", dir, "--dtype", "f16"); err != nil {
		t.Fatal(err)
	}
	root := newRoot()
	var out bytes.Buffer
	root.SetOut(&out)
	root.SetIn(strings.NewReader("Hello, world"))
	root.SetArgs([]string{"tokenize", "--model", dir})
	if err := root.Execute(); err != nil || strings.TrimSpace(out.String()) != "[9707,11,1879]" {
		t.Fatalf("tokenize: %q %v", out.String(), err)
	}
	root = newRoot()
	out.Reset()
	root.SetOut(&out)
	root.SetIn(strings.NewReader("[9707,11,1879]"))
	root.SetArgs([]string{"tokenize", "--model", dir, "--decode"})
	if err := root.Execute(); err != nil || out.String() != "Hello, world" {
		t.Fatalf("decode: %q %v", out.String(), err)
	}
	root = newRoot()
	out.Reset()
	root.SetOut(&out)
	root.SetErr(io.Discard)
	root.SetIn(strings.NewReader("Hi\n\n"))
	root.SetArgs([]string{"generate", "--model", dir, "--max-tokens", "5", "--temperature", "0"})
	if err := root.Execute(); err != nil || strings.TrimSpace(out.String()) == "" {
		t.Fatalf("generate: %q %v", out.String(), err)
	}
	root = newRoot()
	out.Reset()
	root.SetOut(&out)
	root.SetErr(io.Discard)
	root.SetIn(strings.NewReader("Hi\n\n"))
	root.SetArgs([]string{"generate", "--model", dir, "--max-tokens", "5", "--temperature", "0", "--quantize", "q8_0"})
	if err := root.Execute(); err != nil || strings.TrimSpace(out.String()) == "" {
		t.Fatalf("generate --quantize q8_0: %q %v", out.String(), err)
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"generate", "--model", dir, "--quantize", "q4"}, `quantize "q4"`},
		{[]string{"generate", "--model", dir, "--temperature", "-0.5"}, "sampling flags: temperature -0.5"},
		{[]string{"generate", "--model", dir, "--top-p", "1.5"}, "sampling flags: top_p 1.5 is outside [0, 1]"},
		{[]string{"generate", "--model", dir, "--top-k", "-1"}, "sampling flags: top_k -1"},
		{[]string{"init-model", "--preset", "huge", "--out", dir}, `--preset "huge"`},
		{[]string{"init-model", "--dtype", "f8", "--out", dir}, `--dtype "f8"`},
		{[]string{"tokenize", "--model", t.TempDir()}, "tokenizer.json"},
	} {
		if _, err := run(t, tc.args...); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: %v", tc.args, err)
		}
	}
}

// TestCLINativeEpisode plays an episode with a random tiny Qwen and the real
// tokenizer: the loop must survive a model that breaks every format rule.
func TestCLINativeEpisode(t *testing.T) {
	tokPath := testkit.QwenTokenizer(t)
	dir := t.TempDir()
	model := filepath.Join(dir, "tiny")
	if _, err := run(t, "init-model", "--preset", "tiny", "--tokenizer", tokPath, "--out", model); err != nil {
		t.Fatal(err)
	}
	data := filepath.Join(dir, "synth.json")
	mustRun(t, "data", "synth", "--n", "2", "--out", data)
	sets := []string{"--set", "agent.response_budget=8", "--set", "agent.max_steps=1", "--set", "episode.stage2_max_turns=1", "--set", "tools.summarizer=policy"}
	out, err := run(t, append([]string{"episode", "--data", data, "--first", "1", "--policy", "native,no-memory", "--model", model}, sets...)...)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out, "native     1") || !strings.Contains(out, "no-memory  1") {
		t.Fatalf("summary:\n%s", out)
	}
	if _, err := run(t, "episode", "--data", data, "--first", "1", "--policy", "native"); err == nil || !strings.Contains(err.Error(), "--model") {
		t.Fatalf("native without --model: %v", err)
	}
}

func TestCLITokenizerTrain(t *testing.T) {
	dir := t.TempDir()
	data := filepath.Join(dir, "synth.json")
	mustRun(t, "data", "synth", "--n", "40", "--out", data)
	out := filepath.Join(dir, "tok")
	if _, err := run(t, "tokenizer", "train", "--data", data, "--vocab-size", "800", "--episodes", "10", "--out", out); err != nil {
		t.Fatal(err)
	}
	// The trained tokenizer drives a model directory end to end.
	model := filepath.Join(dir, "m")
	if _, err := run(t, "init-model", "--preset", "tiny", "--tokenizer", filepath.Join(out, "tokenizer.json"), "--out", model); err != nil {
		t.Fatal(err)
	}
	raw := mustRead(t, filepath.Join(out, "tokenizer_config.json"))
	os.WriteFile(filepath.Join(model, "tokenizer_config.json"), raw, 0o644)
	root := newRoot()
	var buf bytes.Buffer
	root.SetOut(&buf)
	root.SetIn(strings.NewReader("<think>Store it.</think>"))
	root.SetArgs([]string{"tokenize", "--model", model})
	if err := root.Execute(); err != nil {
		t.Fatal(err)
	}
	var ids []int
	if err := json.Unmarshal(buf.Bytes(), &ids); err != nil || len(ids) < 3 {
		t.Fatalf("tokenize with the trained tokenizer: %s %v", buf.String(), err)
	}
	tok, err := tokenizer.Load(filepath.Join(out, "tokenizer.json"))
	if err != nil {
		t.Fatal(err)
	}
	open, _ := tok.TokenID("<think>")
	closing, _ := tok.TokenID("</think>")
	if ids[0] != open || ids[len(ids)-1] != closing {
		t.Fatalf("the AgeMem tags are not single added tokens: %v", ids)
	}
	if _, err := run(t, "tokenizer", "train", "--data", data, "--vocab-size", "10", "--out", out); err == nil {
		t.Fatal("a vocabulary below 256 must be refused")
	}
}

func TestCLISFTData(t *testing.T) {
	dir := t.TempDir()
	data := filepath.Join(dir, "synth.json")
	mustRun(t, "data", "synth", "--n", "10", "--out", data)
	// records reads a file data sft wrote: its records' stages and their
	// learned (weight 1) replies, each checked for its shape.
	records := func(args ...string) (stages map[int]int, learned int) {
		out := filepath.Join(dir, "sft.jsonl")
		if _, err := run(t, append([]string{"data", "sft", "--data", data, "--out", out, "--forget-rate", "0.3", "--n", "5"}, args...)...); err != nil {
			t.Fatal(err)
		}
		raw, _ := os.ReadFile(out)
		stages = map[int]int{}
		for _, l := range strings.Split(strings.TrimSpace(string(raw)), "\n") {
			var r struct {
				Stage    int `json:"stage"`
				Messages []struct {
					Role    string `json:"role"`
					Content string `json:"content"`
					Weight  *int   `json:"weight"`
				} `json:"messages"`
			}
			if err := json.Unmarshal([]byte(l), &r); err != nil {
				t.Fatal(err)
			}
			stages[r.Stage]++
			last := r.Messages[len(r.Messages)-1]
			if r.Messages[0].Role != "system" || last.Role != "assistant" || last.Weight == nil || *last.Weight != 1 {
				t.Fatalf("record shape: first %s, last %s %v", r.Messages[0].Role, last.Role, last.Weight)
			}
			for _, m := range r.Messages {
				if m.Role == "assistant" && (m.Weight == nil || !strings.HasPrefix(m.Content, "<think>")) {
					t.Fatalf("assistant message without a weight or think block: %q", m.Content)
				}
				if m.Weight != nil && *m.Weight == 1 {
					learned++
				}
			}
		}
		return stages, learned
	}
	perCall, calls := records("--per-call")
	merged, replies := records()
	if calls < 5*6 || replies != calls || len(perCall) != 3 || len(merged) != 3 {
		t.Fatalf("per call: %d replies in %v records; merged: %d replies in %v", calls, perCall, replies, merged)
	}
	if merged[1] >= perCall[1] || merged[2] >= perCall[2] {
		t.Fatalf("merged records %v are not fewer than one a call %v", merged, perCall)
	}
	if only, _ := records("--stages", "1"); len(only) != 1 || only[1] != merged[1] {
		t.Fatalf("--stages 1 wrote %v", only)
	}
	// The blind spot: no relayed fact stored, every other one stored.
	blind := filepath.Join(dir, "blind.jsonl")
	mustRun(t, "data", "sft", "--data", data, "--out", blind, "--stages", "1", "--forget-relayed-rate", "1")
	raw, _ := os.ReadFile(blind)
	var relayed, storedRelayed, other, storedOther int
	for _, l := range strings.Split(strings.TrimSpace(string(raw)), "\n") {
		var r struct {
			Messages []struct{ Role, Content string }
		}
		if err := json.Unmarshal([]byte(l), &r); err != nil {
			t.Fatal(err)
		}
		for i, m := range r.Messages[:len(r.Messages)-1] {
			if m.Role != "user" {
				continue
			}
			stored := strings.Contains(r.Messages[i+1].Content, "Add_memory")
			if strings.HasPrefix(m.Content, "A friend mentioned this: ") {
				relayed++
				if stored {
					storedRelayed++
				}
			} else if other++; stored {
				storedOther++
			}
		}
	}
	if relayed == 0 || storedRelayed != 0 || storedOther != other {
		t.Fatalf("--forget-relayed-rate 1: stored %d of %d relayed facts and %d of %d others", storedRelayed, relayed, storedOther, other)
	}
	// --reason: the Stage-3 replies to comparisons think the comparison
	// out; without it none does.
	for _, reason := range []bool{false, true} {
		out := filepath.Join(dir, "answers.jsonl")
		args := []string{"data", "sft", "--data", data, "--out", out, "--stages", "3"}
		if reason {
			args = append(args, "--reason")
		}
		mustRun(t, args...)
		raw, _ := os.ReadFile(out)
		verdicts := strings.Count(string(raw), "The earlier is ") + strings.Count(string(raw), "countries.") + strings.Count(string(raw), "The same country.")
		if reason != (verdicts > 0) {
			t.Fatalf("--reason %v: %d reasoned replies", reason, verdicts)
		}
	}
	if _, err := run(t, "data", "sft", "--data", data, "--out", filepath.Join(dir, "x.jsonl"), "--stages", "0"); err == nil || !strings.Contains(err.Error(), "--stages 0") {
		t.Fatalf("stage 0: %v", err)
	}
	for _, flag := range []string{"--forget-rate", "--forget-relayed-rate", "--keep-distractor-rate"} {
		for _, v := range []string{"2", "-0.1", "NaN"} {
			if _, err := run(t, "data", "sft", "--data", data, "--out", filepath.Join(dir, "x.jsonl"), flag, v); err == nil || !strings.Contains(err.Error(), flag) {
				t.Fatalf("%s %s: %v, want an error naming the flag", flag, v, err)
			}
		}
	}
}

func TestCLIMerge(t *testing.T) {
	dir := t.TempDir()
	base := filepath.Join(dir, "base")
	mustRun(t, "init-model", "--preset", "tiny-qwen2", "--out", base, "--dtype", "f32")
	cfg := qwen.Presets["tiny-qwen2"]
	names, shape := cfg.Linears()
	a, err := lora.New(lora.Config{R: 2, Alpha: 4, TargetModules: []string{"o_proj"}}, names, shape, 1, true)
	if err != nil {
		t.Fatal(err)
	}
	ad := filepath.Join(dir, "adapter")
	a.Save(ad)
	out := filepath.Join(dir, "merged")
	if _, err := run(t, "merge", "--base", base, "--adapter", ad, "--out", out); err != nil {
		t.Fatal(err)
	}
	if _, err := qwen.Load(out); err != nil {
		t.Fatal(err)
	}
	if _, err := run(t, "merge", "--base", base, "--adapter", filepath.Join(dir, "missing"), "--out", out); err == nil {
		t.Fatal("a missing adapter must be an error")
	}
	// Greedy generation with the adapter applied at run time equals the
	// merged model's (both directories need the tokenizer).
	tokPath := testkit.QwenTokenizer(t)
	raw, err := os.ReadFile(tokPath)
	if err != nil {
		t.Fatalf("run make deps: %v", err)
	}
	gen := func(args ...string) string {
		root := newRoot()
		var buf bytes.Buffer
		root.SetOut(&buf)
		root.SetErr(io.Discard)
		root.SetIn(strings.NewReader("Hi\n\n"))
		root.SetArgs(append([]string{"generate", "--temperature", "0", "--max-tokens", "6"}, args...))
		if err := root.Execute(); err != nil {
			t.Fatal(err)
		}
		return buf.String()
	}
	// A vocabulary as large as the tokenizer's is needed to generate.
	big := filepath.Join(dir, "big")
	mustRun(t, "init-model", "--preset", "tiny-qwen2", "--tokenizer", tokPath, "--out", big, "--dtype", "f32")
	cfg.VocabSize = 151669
	names, shape = cfg.Linears()
	if a, err = lora.New(lora.Config{R: 2, Alpha: 4, TargetModules: []string{"o_proj", "up_proj"}}, names, shape, 1, true); err != nil {
		t.Fatal(err)
	}
	a.Save(ad)
	if _, err := run(t, "merge", "--base", big, "--adapter", ad, "--out", out); err != nil {
		t.Fatal(err)
	}
	os.WriteFile(filepath.Join(out, "tokenizer.json"), raw, 0o644)
	if g1, g2 := gen("--model", big, "--adapter", ad), gen("--model", out); g1 != g2 {
		t.Fatalf("adapter at run time %q vs merged %q", g1, g2)
	}
}

// TestCLISFTErrors: bad settings and missing inputs are named before any
// training starts.
func TestCLISFTErrors(t *testing.T) {
	dir := t.TempDir()
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"sft", "--set", "sft.lr=-1"}, "sft.lr: -1 must be positive"},
		{[]string{"sft", "--set", "sft.loss_on=some"}, `sft.loss_on: "some" is not one of last, all`},
		{[]string{"sft", "--devices", "0,tpu"}, `model.devices[1]: "tpu" is not cpu, cuda or cuda:N`},
		{[]string{"sft", "--set", "model.path=" + dir}, "tokenizer.json"},
		{[]string{"tokenizer", "train", "--out", dir, "--template", "llama"}, `--template "llama"`},
		{[]string{"tokenizer", "train", "--out", dir, "--pretokenizer", "gpt2"}, `--pretokenizer "gpt2"`},
		{[]string{"pretrain", "--set", "pretrain.span_max=2"}, "pretrain.span_max: 2"},
		{[]string{"pretrain", "--set", "pretrain.init=" + dir}, "tokenizer.json"},
		{[]string{"sft", "--set", "sft.copy_sequences=-1"}, "sft.copy_sequences: -1"},
		{[]string{"sft", "--set", "sft.copy_weight=0.5"}, "sft.copy_weight: 0.5 must be at least 1"},
		{[]string{"init-model", "--config", "../../configs/tiny.yaml", "--out", dir}, "--tokenizer is required"},
	} {
		if _, err := run(t, tc.args...); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: %v, want %q", tc.args, err, tc.want)
		}
	}
}

// cliPolicy makes, through the CLI, n synthetic tasks (seed 9) in
// dir/synth.json and a random tiny policy with a tokenizer learned on them
// in dir/m.
func cliPolicy(t *testing.T, dir string, n int) (data, model string) {
	data = filepath.Join(dir, "synth.json")
	mustRun(t, "data", "synth", "--n", strconv.Itoa(n), "--seed", "9", "--out", data)
	tok := filepath.Join(dir, "tok")
	mustRun(t, "tokenizer", "train", "--data", data, "--vocab-size", "600", "--episodes", "5", "--out", tok)
	model = filepath.Join(dir, "m")
	mustRun(t, "init-model", "--preset", "tiny", "--tokenizer", filepath.Join(tok, "tokenizer.json"), "--out", model)
	os.WriteFile(filepath.Join(model, "tokenizer_config.json"), mustRead(t, filepath.Join(tok, "tokenizer_config.json")), 0o644)
	return data, model
}

// TestCLIEvalExtraMethods: eval plays any task file and adds a row per
// --method NAME=DIR to the same table (the paper's ablations are trained
// policies side by side), writing the JSON and chart; bad --method values
// are named.
func TestCLIEvalExtraMethods(t *testing.T) {
	dir := t.TempDir()
	data, model := cliPolicy(t, dir, 20)
	sets := []string{"--set", "data.eval=" + data, "--set", "eval.tasks=2", "--set", "eval.out=" + filepath.Join(dir, "reports", "eval.json"),
		"--set", "agent.response_budget=8", "--set", "agent.max_steps=1", "--set", "episode.stage1_max_turns=1", "--set", "episode.stage2_max_turns=1",
		"--norl", model, "--trained", model}
	out := mustRun(t, append([]string{"eval", "--method", "Answer-Only=" + model, "--method", "LTM-only=" + model + ",tools=ltm"}, sets...)...)
	if !strings.Contains(out, "\nAnswer-Only  2 ") || !strings.Contains(out, "\nAgeMem       2 ") || !strings.Contains(out, "\nLTM-only     2 ") {
		t.Fatalf("table:\n%s", out)
	}
	var rows []map[string]any
	if err := json.Unmarshal(mustRead(t, filepath.Join(dir, "reports", "eval.json")), &rows); err != nil || len(rows) != 5 || rows[3]["policy"] != "Answer-Only" {
		t.Fatalf("eval.json: %v %v", err, rows)
	}
	if _, err := os.Stat(filepath.Join(dir, "reports", "eval.png")); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ method, want string }{
		{"Answer-Only", "want NAME=DIR"},
		{"AgeMem=" + model, `already has a row "AgeMem"`},
		{"X=" + dir, "not a model directory"},
		{"X=" + model + ",tools=rag", `tools="rag" is not all, ltm or stm`},
		{"X=" + model + ",tool=ltm", `unknown option "tool=ltm"`},
	} {
		if _, err := run(t, append([]string{"eval", "--method", c.method}, sets...)...); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("--method %s: %v", c.method, err)
		}
	}
	// A model behind an OpenAI-compatible server is a row too: the tool
	// server's model stores every casual turn and retrieves for the
	// question, so its memory quality is the table's best.
	ts := toolServer(t)
	defer ts.Close()
	api := append([]string{"eval", "--method", "Server=openai:m", "--set", "openai.base_url=" + ts.URL + "/v1", "--set", "openai.format=tools"}, sets...)
	out = mustRun(t, api...)
	if err := json.Unmarshal(mustRead(t, filepath.Join(dir, "reports", "eval.json")), &rows); err != nil || len(rows) != 4 || rows[3]["policy"] != "Server" {
		t.Fatalf("eval.json with an API row: %v %v\n%s", err, rows, out)
	}
	if mq := rows[3]["mq"].(map[string]any)["mean"].(float64); mq <= 0 {
		t.Fatalf("the server's row stored nothing: %v", rows[3])
	}
	for _, c := range []struct{ method, want string }{
		{"X=openai:", "needs a model"},
		{"X=ollama:m", "ollama"},
	} {
		args := append([]string{"eval", "--method", c.method, "--set", "ollama.host=http://127.0.0.1:1", "--set", "openai.base_url=" + ts.URL + "/v1"}, sets...)
		if _, err := run(t, args...); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("--method %s: %v", c.method, err)
		}
	}
	// A task file that cannot be scored (no tasks; HotpotQA's test split,
	// without answers) is named, and the last table is kept.
	before := mustRead(t, filepath.Join(dir, "reports", "eval.json"))
	empty, unanswered := filepath.Join(dir, "empty.json"), filepath.Join(dir, "test.json")
	os.WriteFile(empty, []byte("[]\n"), 0o644)
	os.WriteFile(unanswered, []byte(`[{"_id":"q1","question":"Who?","supporting_facts":[],"context":[["A",["A is here."]]]}]`), 0o644)
	for file, want := range map[string]string{empty: empty + " holds no tasks", unanswered: unanswered + `: record 0 (_id "q1") has no answer`} {
		args := append(append([]string{"eval"}, sets...), "--set", "data.eval="+file)
		if _, err := run(t, args...); err == nil || !strings.Contains(err.Error(), "data.eval: "+want) {
			t.Errorf("data.eval=%s: %v", file, err)
		}
		if b := mustRead(t, filepath.Join(dir, "reports", "eval.json")); !bytes.Equal(b, before) {
			t.Errorf("data.eval=%s rewrote eval.json", file)
		}
	}
	// A missing policy is named before any row is played.
	for _, flag := range []string{"--trained", "--norl"} {
		args := append(append([]string{"eval"}, sets...), flag, dir)
		out, err := runCombined(t, args...)
		if err == nil || !strings.Contains(err.Error(), dir+" is not a model directory") || strings.Contains(out, "elapsed") {
			t.Errorf("%s %s: %v\n%s", flag, dir, err, out)
		}
	}
}

// TestDryRunSaysWhetherItFits: --dry-run of the paper's configs (shapes
// only: a config.json) on 8 GPUs: the 4B and the 7B fit the paper's 24 GiB
// card (the 7B's bf16 checkpoints and MLP chunks), a smaller card does not
// and the largest item is named with what would shrink it;
// rollouts share the trainer's weights on GPUs, the KV line follows
// rl.kv_budget; without a budget and on the CPU tape the largest item is
// the KV caches' upper bound; a large enough card fits; full fine-tuning
// holds a bf16 reference, none at rl.beta 0.
func TestDryRunSaysWhetherItFits(t *testing.T) {
	shape := func(name string) string {
		dir := t.TempDir()
		if err := qwen.WriteConfig(dir, qwen.Presets[name], "bf16"); err != nil {
			t.Fatal(err)
		}
		return dir
	}
	dryRun := func(config, dir string, extra ...string) string {
		t.Helper()
		out, err := run(t, append([]string{"train", "--config", "../../configs/" + config, "--set", "model.path=" + dir, "--set", "rl.init=" + dir, "--dry-run"}, extra...)...)
		if err != nil {
			t.Fatal(err)
		}
		return out
	}
	check := func(what, out string, wants ...string) {
		t.Helper()
		for _, w := range wants {
			if !strings.Contains(out, w) {
				t.Errorf("%s: output lacks %q:\n%s", what, w, out)
			}
		}
	}
	q7, q4 := shape("qwen2.5-7b-shape"), shape("qwen3-4b-shape")
	check("7B", dryRun("qwen2.5-7b-instruct.yaml", q7),
		"weights (bf16 frozen base, f32 adapters)                   14.34 GiB",
		"rollout engine weights (the trainer's, shared)             0.00 GiB",
		// The pool holds one whole rollout (10,240 positions) beside the
		// prefix cache's 8,192: 18,432 · 28·2·512·4 B.
		"KV caches (rl.kv_budget)                                   1.97 GiB",
		// One 10,240-token rollout: bf16 layer inputs 1.91, one layer's
		// backward 1.51 (its MLP 885 rows at a time).
		"activations of a micro-batch (bf16 checkpoints)            3.43 GiB",
		"total (approximate)                                        20.31 GiB", "fits in 24 GiB per device")
	check("7B on a 16 GiB card", dryRun("qwen2.5-7b-instruct.yaml", q7, "--device-gib", "16"),
		"does not fit in 16 GiB per device", "the largest item is weights", "model.train_dtype: q8_0")
	// Q8_0 projections: 6.53e9 values at 36 bytes per 32, embeddings and
	// head (1.09e9) in bf16, adapters in f32.
	check("7B, Q8_0 base, on a 16 GiB card", dryRun("qwen2.5-7b-instruct.yaml", q7, "--device-gib", "16", "--set", "model.train_dtype=q8_0"),
		"weights (Q8_0 projections, bf16 embeddings, f32 adapters)  9.02 GiB",
		"total (approximate)                                        15.00 GiB", "fits in 16 GiB per device")
	if _, err := run(t, "train", "--config", "../../configs/qwen2.5-7b-instruct.yaml", "--set", "model.path="+q7, "--set", "rl.init="+q7,
		"--set", "model.train_dtype=q8_0", "--set", "lora.enabled=false", "--dry-run"); err == nil || !strings.Contains(err.Error(), "model.train_dtype: q8_0 holds a frozen base") {
		t.Errorf("full fine-tuning over a Q8_0 base: error %v, want one naming model.train_dtype", err)
	}
	check("7B, f32 training", dryRun("qwen2.5-7b-instruct.yaml", q7, "--set", "model.train_dtype=f32"),
		"activations of a micro-batch                               5.35 GiB")
	check("4B", dryRun("qwen3-4b-instruct.yaml", q4), "fits in 24 GiB per device")
	check("7B on the CPU tape, no budget", dryRun("qwen2.5-7b-instruct.yaml", q7, "--set", "rl.kv_budget=0", "--set", "model.devices=[]"),
		"rollout engine weights                                     28.37 GiB",
		"the largest item is the KV caches (70.00 GiB); to shrink it: rl.kv_budget")
	check("7B on a large card", dryRun("qwen2.5-7b-instruct.yaml", q7, "--device-gib", "200"), "fits in 200 GiB per device")
	// Full fine-tuning of the 4B (4.02e9 parameters) with sharded moments:
	// the bf16 reference is 7.49 GiB, none at rl.beta 0; the sharded
	// optimiser line is the largest and the fix does not offer sharding
	// again.
	full := []string{"--set", "lora.enabled=false", "--set", "model.zero_stage=1"}
	check("4B full fine-tuning", dryRun("qwen3-4b-instruct.yaml", q4, full...),
		"reference policy                                           7.49 GiB",
		"gradients + AdamW moments (1/8 of them)                    18.73 GiB",
		"to shrink it: model.zero_stage: 2 (the gradients split too)")
	check("4B full fine-tuning at rl.beta 0", dryRun("qwen3-4b-instruct.yaml", q4, append(full, "--set", "rl.beta=0")...),
		"reference policy                                           0.00 GiB")
	// ZeRO-2: bf16 working copies (7.49 GiB) and 1/8 of the f32 masters
	// (1.87); 1/8 of the gradients (1.87) and the largest stage's of the
	// others' (the tied embedding, 151936 x 2560 floats: 1.45), 1/8 of the
	// moments (3.75).
	z2 := []string{"--set", "lora.enabled=false", "--set", "model.zero_stage=2"}
	check("4B full fine-tuning, ZeRO-2", dryRun("qwen3-4b-instruct.yaml", q4, z2...),
		"weights (bf16 working copies, 1/8 of the f32 masters)      9.37 GiB",
		"gradients (1/8 and a layer's) + AdamW moments (1/8)        7.07 GiB",
		"then the reference policy (7.49 GiB): model.offload_reference: true")
	// With the reference in host memory (its embedding 0.72 GiB and a
	// layer on the device) and without the prefix cache's second KV pool,
	// full fine-tuning of the 4B at the paper's rl.beta fits the paper's
	// card.
	z2 = append(z2, "--set", "model.offload_reference=true")
	check("4B full fine-tuning, ZeRO-2, offloaded reference", dryRun("qwen3-4b-instruct.yaml", q4, z2...),
		"reference policy (in host memory, a layer at a time)       0.91 GiB",
		"total (approximate)                                        25.81 GiB",
		"rl.prefix_cache: false")
	check("4B full fine-tuning that fits", dryRun("qwen3-4b-instruct.yaml", q4, append(z2, "--set", "rl.prefix_cache=false")...),
		"total (approximate)                                        23.56 GiB", "fits in 24 GiB per device")
}

// TestTrainValidates: `train` with data.val validates the policy before
// the first step and after the others, says so in its log, and with
// rl.keep_best installs the best step's weights as rl.out/policy; a
// data.val that does not load is named.
func TestTrainValidates(t *testing.T) {
	dir := t.TempDir()
	data, model := cliPolicy(t, dir, 12)
	val := filepath.Join(dir, "val.json")
	mustRun(t, "data", "synth", "--n", "3", "--seed", "5", "--out", val)
	sets := []string{"train", "--set", "rl.init=" + model, "--set", "model.path=" + model, "--set", "data.train=" + data,
		"--set", "agent.response_budget=8", "--set", "agent.max_steps=1", "--set", "episode.stage1_max_turns=1", "--set", "episode.stage2_max_turns=1",
		"--set", "rl.k=2", "--set", "rl.batch_tasks=1", "--set", "rl.steps=2", "--set", "rl.val_every=1", "--set", "rl.val_tasks=2",
		"--set", "rl.keep_best=true", "--set", "rl.out=" + filepath.Join(dir, "rl")}
	out, err := runCombined(t, append(sets, "--set", "data.val="+val)...)
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	for _, want := range []string{"validation after step 0: J", "validation after step 2: J", "policy: the weights after step"} {
		if !strings.Contains(out, want) {
			t.Errorf("the log lacks %q:\n%s", want, out)
		}
	}
	if _, err := os.Stat(filepath.Join(dir, "rl", "policy", "model.safetensors")); err != nil {
		t.Fatal(err)
	}
	if _, err := run(t, append(sets, "--set", "data.val="+filepath.Join(dir, "none.json"))...); err == nil || !strings.Contains(err.Error(), "data.val") {
		t.Errorf("a missing data.val: %v", err)
	}
	empty := filepath.Join(dir, "empty.json")
	os.WriteFile(empty, []byte("[]"), 0o644)
	if _, err := run(t, append(sets, "--set", "data.val="+empty)...); err == nil || !strings.Contains(err.Error(), "holds no tasks") {
		t.Errorf("an empty data.val: %v", err)
	}
	if _, err := run(t, sets...); err == nil || !strings.Contains(err.Error(), "rl.keep_best") {
		t.Errorf("keep_best without data.val: %v", err)
	}
}

// probe scores a model on a task file's which-was-earlier reasoning; a
// file without such questions is an error that names it.
func TestCLIProbe(t *testing.T) {
	dir := t.TempDir()
	data := filepath.Join(dir, "synth.json")
	mustRun(t, "data", "synth", "--n", "30", "--seed", "4", "--out", data)
	tok := filepath.Join(dir, "tok")
	mustRun(t, "tokenizer", "train", "--data", data, "--vocab-size", "600", "--episodes", "2", "--out", tok)
	model := filepath.Join(dir, "m")
	mustRun(t, "init-model", "--preset", "tiny", "--tokenizer", filepath.Join(tok, "tokenizer.json"), "--out", model)
	out := mustRun(t, "probe", "--model", model, "--data", data)
	var n, year, name, other int
	if _, err := fmt.Sscanf(out, "%d which-was-earlier questions: verdict year right %d, the name's first token right %d (the other option's %d)", &n, &year, &name, &other); err != nil || n < 3 || year > n || name+other > n {
		t.Fatalf("probe of a random model: %q (%v)", out, err)
	}
	bridges := filepath.Join(dir, "bridges.json")
	os.WriteFile(bridges, []byte(`[{"_id":"a","question":"In what year was the founder of X born?","answer":"1900","type":"bridge","context":[["X",["X was founded by Y."]],["Y",["Y was born in 1900."]]],"supporting_facts":[["X",0],["Y",0]]}]`), 0o644)
	if _, err := run(t, "probe", "--model", model, "--data", bridges); err == nil || !strings.Contains(err.Error(), "bridges.json") || !strings.Contains(err.Error(), "which was earlier") {
		t.Fatalf("a file without comparisons: %v", err)
	}
}
