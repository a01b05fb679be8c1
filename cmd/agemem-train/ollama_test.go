package main

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"

	"github.com/ollama/ollama/api"

	"github.com/agemem/agemem/env"
	"github.com/agemem/agemem/internal/testkit"
	"github.com/agemem/agemem/llm/ollama"
	"github.com/agemem/agemem/memtools"
	"github.com/agemem/agemem/model/chat"
	"github.com/agemem/agemem/model/qwen"
)

// ollamaStub answers the calls export and episode make, as Ollama does.
type ollamaStub struct {
	mu       sync.Mutex
	blobs    map[string][]byte
	creates  []api.CreateRequest
	prompts  []string
	response string
}

func newOllamaStub(t *testing.T) (*ollamaStub, string) {
	s := &ollamaStub{blobs: map[string][]byte{}}
	mux := http.NewServeMux()
	fail := func(w http.ResponseWriter, code int, msg string) {
		w.WriteHeader(code)
		json.NewEncoder(w).Encode(map[string]string{"error": msg})
	}
	mux.HandleFunc("POST /api/blobs/{digest}", func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		sum := sha256.Sum256(body)
		if "sha256:"+hex.EncodeToString(sum[:]) != r.PathValue("digest") {
			fail(w, 400, "digest mismatch")
			return
		}
		s.mu.Lock()
		s.blobs[r.PathValue("digest")] = body
		s.mu.Unlock()
		w.WriteHeader(http.StatusCreated)
	})
	mux.HandleFunc("POST /api/create", func(w http.ResponseWriter, r *http.Request) {
		var req api.CreateRequest
		json.NewDecoder(r.Body).Decode(&req)
		s.mu.Lock()
		s.creates = append(s.creates, req)
		s.mu.Unlock()
		json.NewEncoder(w).Encode(api.ProgressResponse{Status: "success"})
	})
	mux.HandleFunc("POST /api/show", func(w http.ResponseWriter, r *http.Request) {
		var req api.ShowRequest
		json.NewDecoder(r.Body).Decode(&req)
		if !strings.HasPrefix(req.Model, "agemem-tiny") {
			fail(w, 404, "model \""+req.Model+"\" not found, try pulling it first")
			return
		}
		// The template the model was created with, as Ollama shows it.
		tmpl := ""
		s.mu.Lock()
		for _, c := range s.creates {
			if c.Model == req.Model {
				tmpl = c.Template
			}
		}
		s.mu.Unlock()
		json.NewEncoder(w).Encode(api.ShowResponse{Template: tmpl, ModelInfo: map[string]any{"general.architecture": "qwen3"}})
	})
	mux.HandleFunc("POST /api/generate", func(w http.ResponseWriter, r *http.Request) {
		var req api.GenerateRequest
		json.NewDecoder(r.Body).Decode(&req)
		s.mu.Lock()
		s.prompts = append(s.prompts, req.Prompt)
		s.mu.Unlock()
		json.NewEncoder(w).Encode(api.GenerateResponse{Response: s.response, Done: true, DoneReason: "stop",
			Metrics: api.Metrics{PromptEvalCount: 10, EvalCount: 5}})
	})
	// /api/chat: a tool call when tools are offered and none was made yet,
	// else an answer naming the last message.
	mux.HandleFunc("POST /api/chat", func(w http.ResponseWriter, r *http.Request) {
		var req api.ChatRequest
		json.NewDecoder(r.Body).Decode(&req)
		msg := api.Message{Role: "assistant", Content: "answer after " + req.Messages[len(req.Messages)-1].Content}
		if len(req.Tools) > 0 && req.Messages[len(req.Messages)-1].Role == "user" {
			args := api.NewToolCallFunctionArguments()
			args.Set("content", "Ada is my sister.")
			msg = api.Message{Role: "assistant", ToolCalls: []api.ToolCall{{Function: api.ToolCallFunction{Name: "Add_memory", Arguments: args}}}}
		}
		json.NewEncoder(w).Encode(api.ChatResponse{Message: msg, Done: true, DoneReason: "stop"})
	})
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	return s, srv.URL
}

// TestCLIAgentOnOllama: --model ollama:NAME runs the agent loop on
// Ollama's own API with native tools; a model the server lacks is named.
func TestCLIAgentOnOllama(t *testing.T) {
	_, url := newOllamaStub(t)
	db := filepath.Join(t.TempDir(), "m.db")
	out := mustRun(t, "agent", "--set", "ollama.host="+url, "--model", "ollama:agemem-tiny", "--memory", "--set", "memory.path="+db, "--prompt", "Remember Ada.")
	if !strings.Contains(out, "Add_memory") || !strings.Contains(out, "answer after") {
		t.Fatalf("trace:\n%s", out)
	}
	if _, err := run(t, "agent", "--set", "ollama.host="+url, "--model", "ollama:nope", "--prompt", "hi"); err == nil || !strings.Contains(err.Error(), "ollama pull nope") {
		t.Fatalf("missing model: %v", err)
	}
	// FitText's Memetic retrieval through the same model.
	dir := t.TempDir()
	mustRun(t, "tools", "synth", "--providers", "10", "--queries", "3", "--out", dir)
	out = mustRun(t, "tools", "retrieve", "--strategy", "memetic", "--first", "2", "--set", "ollama.host="+url, "--model", "ollama:agemem-tiny",
		"--data", filepath.Join(dir, "queries.jsonl"), "--corpus", filepath.Join(dir, "tools.jsonl"))
	if !strings.Contains(out, "memetic      all                 2") {
		t.Fatalf("memetic on Ollama:\n%s", out)
	}
}

// export writes GGUF files and publishes a policy to Ollama; an episode
// then plays that model through --policy ollama with raw prompts.
func TestCLIExportAndOllamaEpisode(t *testing.T) {
	tokPath := testkit.QwenTokenizer(t)
	dir := t.TempDir()
	model := filepath.Join(dir, "tiny")
	if _, err := run(t, "init-model", "--preset", "tiny", "--tokenizer", tokPath, "--out", model); err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(dir, "gguf", "tiny.gguf") // a directory export makes
	out, err := runCombined(t, "export", "--outtype", "q8_0", "--out", file, model)
	if err != nil || !strings.Contains(out, "wrote "+file) || !strings.Contains(out, " Q8_0") || strings.Contains(out, "map[") ||
		!regexp.MustCompile(`step (\d+)/(\d+) tensors written`).MatchString(out) {
		t.Fatalf("export: %v\n%s", err, out)
	}
	if raw, _ := os.ReadFile(file); !bytes.HasPrefix(raw, []byte("GGUF\x03\x00\x00\x00")) {
		t.Fatalf("%s is not GGUF v3", file)
	}

	stub, url := newOllamaStub(t)
	host := []string{"--set", "ollama.host=" + url}
	out, err = runCombined(t, append([]string{"export", "--to", "ollama", "--name", "agemem-tiny", model}, host...)...)
	if err != nil || !strings.Contains(out, "ollama run agemem-tiny") {
		t.Fatalf("export --to ollama: %v\n%s", err, out)
	}
	if len(stub.creates) != 1 {
		t.Fatalf("%d creates", len(stub.creates))
	}
	cr := stub.creates[0]
	blob := stub.blobs[cr.Files["model.gguf"]]
	sys, _ := memtools.SystemPromptFor("paper")
	if cr.Model != "agemem-tiny" || !bytes.HasPrefix(blob, []byte("GGUF")) || cr.System != sys || !strings.Contains(cr.Template, "<|im_start|>") {
		t.Fatalf("create %+v (blob %d bytes)", cr, len(blob))
	}

	data := filepath.Join(dir, "synth.json")
	mustRun(t, "data", "synth", "--n", "2", "--out", data)
	stub.response = "<think>I do not know.</think><answer>unknown</answer>"
	out, err = run(t, append([]string{"episode", "--data", data, "--first", "1", "--policy", "ollama", "--ollama-model", "agemem-tiny",
		"--set", "episode.stage2_max_turns=1"}, host...)...)
	if err != nil || !strings.Contains(out, "ollama") {
		t.Fatalf("episode: %v\n%s", err, out)
	}
	if len(stub.prompts) == 0 || !strings.HasPrefix(stub.prompts[0], "<|im_start|>system\n") || !strings.HasSuffix(stub.prompts[0], "<|im_start|>assistant\n") {
		t.Fatalf("raw prompts: %q", stub.prompts)
	}

	ln, _ := net.Listen("tcp", "127.0.0.1:0")
	dead := ln.Addr().String()
	ln.Close()
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"export", "--outtype", "q4_k", "--out", file, model}, `"q4_k" is not one of f32, f16, bf16, q8_0`},
		{[]string{"export", "--format", "safetensors", "--out", file, model}, "only gguf"},
		{[]string{"export", model}, "--out FILE"},
		{[]string{"export", "--to", "ollama", model}, "--name"},
		{[]string{"export", "--to", "lmstudio", "--name", "x", model}, "only ollama"},
		{[]string{"export", "--out", file, dir}, "config.json"},
		{[]string{"export", "--to", "ollama", "--name", "x", model, "--set", "ollama.host=" + dead}, "cannot reach Ollama at http://" + dead},
		{append([]string{"episode", "--data", data, "--first", "1", "--policy", "ollama", "--ollama-model", "qwen3:4b"}, host...), "ollama pull qwen3:4b"},
		{[]string{"episode", "--data", data, "--first", "1", "--policy", "ollama"}, "--ollama-model"},
	} {
		if _, err := run(t, tc.args...); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: %v, want %q", tc.args, err, tc.want)
		}
	}
}

// The encoder workflow from the CLI: synthetic data, a random BERT, a
// short SimCSE run, an evaluation table, and bad input named.
func TestCLIEmbed(t *testing.T) {
	dir := t.TempDir()
	data := filepath.Join(dir, "simcse")
	if out, err := run(t, "embed", "data", "--out", data, "--n", "2000"); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	enc := filepath.Join(dir, "enc")
	if out, err := run(t, "embed", "init", "--corpus", filepath.Join(data, "corpus.txt"), "--out", enc, "--hidden", "32", "--layers", "1", "--heads", "2", "--intermediate", "64", "--max-positions", "64"); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	sets := []string{"--set", "simcse.init=" + enc, "--set", "simcse.data=" + filepath.Join(data, "corpus.txt"), "--set", "simcse.steps=6",
		"--set", "simcse.batch=8", "--set", "simcse.eval_every=3", "--set", "simcse.save_every=3", "--set", "simcse.sts=" + filepath.Join(data, "sts-dev.tsv"),
		"--set", "simcse.tasks=" + filepath.Join(data, "tasks-eval.json"), "--set", "simcse.out=" + filepath.Join(dir, "run"), "--set", "simcse.pooling=mean"}
	out, err := runCombined(t, append([]string{"embed", "train"}, sets...)...)
	if err != nil || !strings.Contains(out, "spearman") || !strings.Contains(out, "recall@3") {
		t.Fatalf("train: %v\n%s", err, out)
	}
	out, err = run(t, "embed", "eval", "hashing", enc, filepath.Join(dir, "run", "encoder"), "--pooling", "mean",
		"--sts", filepath.Join(data, "sts-test.tsv"), "--tasks", filepath.Join(data, "tasks-eval.json"))
	if err != nil || strings.Count(out, "\n") != 4 || !strings.Contains(out, "hashing") {
		t.Fatalf("eval: %v\n%s", err, out)
	}
	sup := append(sets, "--set", "simcse.mode=sup")
	if _, err := run(t, append([]string{"embed", "train"}, sup...)...); err == nil || !strings.Contains(err.Error(), "supervised SimCSE wants anchor, entailment, contradiction") {
		t.Errorf("sup on a corpus: %v", err)
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"embed", "eval", "hashing"}, "--sts"},
		{[]string{"embed", "eval", dir, "--sts", filepath.Join(data, "sts-dev.tsv")}, "config.json"},
		{[]string{"embed", "eval", enc, "--sts", filepath.Join(data, "corpus.txt")}, "columns"},
		{[]string{"embed", "init", "--corpus", filepath.Join(dir, "none.txt"), "--out", enc}, "none.txt"},
		{[]string{"embed", "init", "--corpus", filepath.Join(data, "corpus.txt"), "--hidden", "30", "--heads", "4", "--out", enc}, "multiple of num_attention_heads"},
		{[]string{"embed", "data", "--n", "5"}, "at least 100"},
		{[]string{"embed", "eval", "hashing", "--tasks", filepath.Join(data, "tasks-eval.json"), "--k", "0"}, "recall@0: k must be at least 1"},
	} {
		if _, err := run(t, tc.args...); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: %v, want %q", tc.args, err, tc.want)
		}
	}
}

// TestOllamaSeesTheNativePrompt: a policy whose tokenizer_config holds
// Qwen2.5's template on a qwen3 model (the embedded default's) is published
// with Qwen2.5's Ollama template, and an episode played through Ollama
// sends, call after call of a multi-turn AgeMem episode, byte for byte the
// prompt the native engine renders for the same messages (the architecture
// alone would have picked Qwen3's).
func TestOllamaSeesTheNativePrompt(t *testing.T) {
	dir := t.TempDir()
	data := filepath.Join(dir, "synth.json")
	mustRun(t, "data", "synth", "--n", "4", "--seed", "3", "--out", data)
	tok := filepath.Join(dir, "tok")
	// Qwen's regex: export refuses the default words pre-tokenizer, which
	// Ollama would not cut as the policy was trained.
	mustRun(t, "tokenizer", "train", "--data", data, "--vocab-size", "600", "--episodes", "2", "--pretokenizer", "qwen", "--out", tok)
	model := filepath.Join(dir, "policy")
	// init-model shows its progress, and takes the template that sits
	// beside the tokenizer.
	if out, err := runCombined(t, "init-model", "--preset", "tiny", "--tokenizer", filepath.Join(tok, "tokenizer.json"), "--out", model); err != nil ||
		!strings.Contains(out, "100/100 percent of") || !strings.Contains(out, "parameters drawn") {
		t.Fatalf("init-model: %v\n%s", err, out)
	}
	// The same policy with the names pre-tokenizer is refused, by name.
	words := filepath.Join(dir, "tok-names")
	mustRun(t, "tokenizer", "train", "--data", data, "--vocab-size", "600", "--episodes", "2", "--pretokenizer", "names", "--out", words)
	refused := filepath.Join(dir, "policy-names")
	mustRun(t, "init-model", "--preset", "tiny", "--tokenizer", filepath.Join(words, "tokenizer.json"), "--out", refused)
	if _, err := run(t, "export", "--out", filepath.Join(dir, "x.gguf"), refused); err == nil || !strings.Contains(err.Error(), "Qwen's regex") ||
		!strings.Contains(err.Error(), "tokenizer.json") {
		t.Fatalf("export of a names-tokenizer policy: %v", err)
	}
	if _, err := os.Stat(filepath.Join(dir, "x.gguf")); !os.IsNotExist(err) {
		t.Fatal("a refused export left a file")
	}
	if tm, err := chat.Detect(model, "qwen3"); err != nil || tm != chat.Qwen25 {
		t.Fatalf("the policy's template: %v %v", tm, err)
	}
	stub, url := newOllamaStub(t)
	host := []string{"--set", "ollama.host=" + url}
	mustRun(t, append([]string{"export", "--to", "ollama", "--name", "agemem-tiny-25", model}, host...)...)
	if len(stub.creates) != 1 || stub.creates[0].Template != ollama.Qwen25Template {
		t.Fatalf("published with template %.80q", stub.creates[0].Template)
	}
	mc, _ := qwen.LoadConfig(model)
	if n, _ := stub.creates[0].Parameters["num_ctx"].(float64); int(n) != min(8192+256, mc.MaxPositions) || mc.MaxPositions >= 8192+256 {
		t.Fatalf("num_ctx %v: want the model's %d positions (the budgets ask 8448)", stub.creates[0].Parameters["num_ctx"], mc.MaxPositions)
	}
	stub.response = "<think>Nothing to keep.</think>\n<answer>Noted.</answer>"
	out := mustRun(t, append([]string{"episode", "--data", data, "--task", "synth-000001", "--policy", "ollama", "--ollama-model", "agemem-tiny-25",
		"--set", "episode.stage2_max_turns=2", "--set", "agent.system_prompt=compact", "--json"}, host...)...)
	var res env.Result
	if err := json.Unmarshal([]byte(out), &res); err != nil {
		t.Fatalf("%v: %.200s", err, out)
	}
	var want []string
	for _, st := range res.Stages {
		for _, turn := range st {
			for _, step := range turn.Trace.Steps {
				qm := make([]chat.Message, len(step.Prompt))
				for i, m := range step.Prompt {
					qm[i] = chat.Message{Role: m.Role, Content: m.Content}
				}
				text, err := chat.Render(qm, chat.Options{Template: chat.Qwen25, AddGenerationPrompt: true})
				if err != nil {
					t.Fatal(err)
				}
				want = append(want, text)
			}
		}
	}
	if len(want) < 5 || len(stub.prompts) != len(want) {
		t.Fatalf("%d calls in the trace, %d prompts sent", len(want), len(stub.prompts))
	}
	for i := range want {
		if stub.prompts[i] != want[i] {
			t.Fatalf("call %d: Ollama received\n%q\nthe engine renders\n%q", i, stub.prompts[i], want[i])
		}
	}
}
