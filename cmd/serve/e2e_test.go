package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/agemem/agemem/internal/testkit"
	"github.com/agemem/agemem/model/qwen"
	"github.com/agemem/agemem/model/safetensors"
)

// The test binary doubles as the serve command, so the end-to-end tests
// run the real program in its own process.
func TestMain(m *testing.M) {
	if args := os.Getenv("AGEMEM_SERVE_CHILD"); args != "" {
		os.Args = append([]string{"serve"}, strings.Split(args, "\x1f")...)
		main()
		os.Exit(0)
	}
	os.Exit(m.Run())
}

func child(args ...string) *exec.Cmd {
	cmd := exec.Command(os.Args[0])
	cmd.Env = append(os.Environ(), "AGEMEM_SERVE_CHILD="+strings.Join(args, "\x1f"),
		"AGEMEM_API_KEYS=sk-alice-0001=alice, sk-bob-00001=bob")
	return cmd
}

// randomPolicyDir writes a random tiny Qwen3 with the real Qwen3 tokenizer.
func randomPolicyDir(t *testing.T) string {
	t.Helper()
	src := testkit.QwenTokenizerDir(t)
	dir := filepath.Join(t.TempDir(), "policy")
	os.MkdirAll(dir, 0o755)
	for _, f := range []string{"tokenizer.json", "tokenizer_config.json"} {
		raw, err := os.ReadFile(filepath.Join(src, f))
		if err != nil {
			t.Fatalf("run `make deps`: %v", err)
		}
		os.WriteFile(filepath.Join(dir, f), raw, 0o644)
	}
	cfg := qwen.Presets["tiny-qwen3"]
	cfg.VocabSize = 151669
	if err := qwen.InitRandom(dir, cfg, safetensors.BF16, 2); err != nil {
		t.Fatal(err)
	}
	return dir
}

type proc struct {
	cmd  *exec.Cmd
	url  string
	logs *bytes.Buffer
}

// startServe runs serve and waits for its "listening" log line.
func startServe(t *testing.T, cfgPath string) *proc {
	t.Helper()
	cmd := child("--config", cfgPath)
	stderr, _ := cmd.StderrPipe()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p := &proc{cmd: cmd, logs: &bytes.Buffer{}}
	addr := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			p.logs.WriteString(sc.Text() + "\n")
			var l map[string]any
			if json.Unmarshal(sc.Bytes(), &l) == nil && l["msg"] == "listening" {
				addr <- l["addr"].(string)
			}
		}
		close(addr)
	}()
	select {
	case a, ok := <-addr:
		if !ok {
			cmd.Wait()
			t.Fatalf("serve exited before listening:\n%s", p.logs)
		}
		p.url = "http://" + a
	case <-time.After(60 * time.Second):
		cmd.Process.Kill()
		t.Fatal("serve did not start")
	}
	return p
}

// stop sends SIGTERM and waits for a clean exit.
func (p *proc) stop(t *testing.T) {
	t.Helper()
	p.cmd.Process.Signal(syscall.SIGTERM)
	done := make(chan error, 1)
	go func() { done <- p.cmd.Wait() }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("serve exited with %v:\n%s", err, p.logs)
		}
	case <-time.After(30 * time.Second):
		p.cmd.Process.Kill()
		t.Fatal("serve did not stop on SIGTERM")
	}
}

func call(t *testing.T, method, url, key, body string) (int, string) {
	t.Helper()
	req, _ := http.NewRequest(method, url, strings.NewReader(body))
	if key != "" {
		req.Header.Set("Authorization", "Bearer "+key)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(raw)
}

// TestServeProcess runs the serve program on a random tiny policy and a
// SQLite file: keys from the environment, memory written over HTTP kept
// across a SIGTERM and a restart and invisible to the other key, a model
// that breaks the tool format answered with 422, structured logs, and the
// memory tools over MCP on stdio with the SDK's client.
func TestServeProcess(t *testing.T) {
	if testing.Short() {
		t.Skip("starts processes")
	}
	dir := t.TempDir()
	cfgPath := filepath.Join(dir, "serve.yaml")
	yaml := fmt.Sprintf("memory:\n  path: %s\nagent:\n  system_prompt: compact\n  response_budget: 8\n  max_steps: 1\nserve:\n  addr: 127.0.0.1:0\n  policy: %s\n",
		filepath.Join(dir, "memory.db"), randomPolicyDir(t))
	os.WriteFile(cfgPath, []byte(yaml), 0o644)

	p := startServe(t, cfgPath)
	if code, body := call(t, "POST", p.url+"/v1/memories", "sk-alice-0001", `{"content": "Alice's locker code is 4711"}`); code != 201 {
		t.Fatalf("add: %d %s", code, body)
	}
	code, body := call(t, "POST", p.url+"/v1/chat/completions", "sk-alice-0001", `{"model": "agemem", "messages": [{"role": "user", "content": "hi"}]}`)
	if code != 422 || !strings.Contains(body, "tool_format_error") {
		t.Fatalf("random model: %d %s", code, body)
	}
	if code, _ := call(t, "GET", p.url+"/v1/memories", "sk-wrong-0001", ""); code != 401 {
		t.Fatalf("wrong key: %d", code)
	}
	p.stop(t)
	if !strings.Contains(p.logs.String(), `"msg":"request"`) || !strings.Contains(p.logs.String(), `"msg":"stopped"`) {
		t.Fatalf("logs:\n%s", p.logs)
	}

	p = startServe(t, cfgPath)
	if _, body := call(t, "GET", p.url+"/v1/memories", "sk-alice-0001", ""); !strings.Contains(body, "4711") {
		t.Fatalf("after restart: %s", body)
	}
	if _, body := call(t, "GET", p.url+"/v1/memories", "sk-bob-00001", ""); strings.Contains(body, "4711") {
		t.Fatalf("bob after restart: %s", body)
	}
	p.stop(t)

	// MCP over stdio on alice's namespace.
	cmd := child("mcp", "--stdio", "--namespace", "alice", "--config", cfgPath)
	c := mcp.NewClient(&mcp.Implementation{Name: "test", Version: "1"}, nil)
	cs, err := c.Connect(context.Background(), &mcp.CommandTransport{Command: cmd}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer cs.Close()
	tools, err := cs.ListTools(context.Background(), nil)
	if err != nil || len(tools.Tools) != 4 {
		t.Fatalf("tools: %v %v", tools, err)
	}
	res, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "Retrieve_memory", Arguments: map[string]any{"query": "locker code"}})
	if err != nil || res.IsError || !strings.Contains(res.Content[0].(*mcp.TextContent).Text, "4711") {
		t.Fatalf("Retrieve_memory over stdio: %v %v", res, err)
	}
}
