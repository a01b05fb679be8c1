package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func runCLI(t *testing.T, args ...string) (string, error) {
	t.Helper()
	root := newRoot()
	var out bytes.Buffer
	root.SetOut(&out)
	root.SetErr(&out)
	root.SetArgs(args)
	err := root.Execute()
	return out.String(), err
}

func TestMemoryCommands(t *testing.T) {
	dir := t.TempDir()
	db := "memory.path=" + filepath.Join(dir, "m.db")
	id, err := runCLI(t, "memory", "add", "Alice's cat is called Tabby", "--type", "fact", "--metadata", `{"topic":"pets"}`, "--namespace", "alice", "--set", db)
	if err != nil {
		t.Fatal(err)
	}
	id = strings.TrimSpace(id)
	id2, _ := runCLI(t, "memory", "add", "Alice lives in Velden", "--namespace", "alice", "--set", db)
	id2 = strings.TrimSpace(id2)
	out, _ := runCLI(t, "memory", "search", "what is the cat called", "--top-k", "1", "--namespace", "alice", "--set", db)
	if !strings.HasPrefix(out, id) || !strings.Contains(out, "Tabby") {
		t.Fatalf("search: %s", out)
	}
	out, _ = runCLI(t, "memory", "search", "anything", "--metadata", `{"topic":"pets"}`, "--namespace", "alice", "--set", db)
	if strings.Count(out, "\n") != 1 {
		t.Fatalf("filtered search: %s", out)
	}
	// Another user sees nothing.
	if out, _ := runCLI(t, "memory", "list", "--namespace", "bob", "--set", db); out != "" {
		t.Fatalf("bob sees: %s", out)
	}
	if _, err := runCLI(t, "memory", "update", id, "Alice's cat is called Tiger", "--namespace", "alice", "--set", db); err != nil {
		t.Fatal(err)
	}
	export, _ := runCLI(t, "memory", "export", "--namespace", "alice", "--set", db)
	if strings.Count(export, "\n") != 2 || !strings.Contains(export, "Tiger") {
		t.Fatalf("export: %s", export)
	}
	f := filepath.Join(dir, "alice.jsonl")
	os.WriteFile(f, []byte(export), 0o644)
	if _, err := runCLI(t, "memory", "import", f, "--namespace", "bob", "--set", db); err != nil {
		t.Fatal(err)
	}
	if out, _ := runCLI(t, "memory", "list", "--namespace", "bob", "--set", db); !strings.Contains(out, "Tiger") || !strings.Contains(out, `{"topic":"pets"}`) {
		t.Fatalf("bob after import: %s", out)
	}
	// A malformed import writes nothing.
	bad := filepath.Join(dir, "bad.jsonl")
	os.WriteFile(bad, []byte(`{"content":"ok"}`+"\n"+`{"content": 5}`+"\n"), 0o644)
	if _, err := runCLI(t, "memory", "import", bad, "--namespace", "carol", "--set", db); err == nil || !strings.Contains(err.Error(), "bad.jsonl:2: content is a JSON number where a string belongs") {
		t.Fatalf("bad import: %v", err)
	}
	if out, _ := runCLI(t, "memory", "list", "--namespace", "carol", "--set", db); out != "" {
		t.Fatalf("a failed import wrote: %s", out)
	}
	if _, err := runCLI(t, "memory", "delete", id, "--namespace", "alice", "--set", db); err != nil {
		t.Fatal(err)
	}
	if _, err := runCLI(t, "memory", "get", id, "--namespace", "alice", "--set", db); err == nil || !strings.Contains(err.Error(), "not found") {
		t.Fatalf("get deleted: %v", err)
	}
	if _, err := runCLI(t, "memory", "add", "x", "--metadata", "[1]", "--set", db); err == nil || !strings.Contains(err.Error(), "--metadata") {
		t.Fatalf("bad metadata: %v", err)
	}
	// Blank content or query is refused, as the server's API refuses it,
	// and nothing is stored.
	for _, args := range [][]string{{"add", " "}, {"update", id2, ""}, {"search", "\t"}} {
		if _, err := runCLI(t, append(append([]string{"memory"}, args...), "--namespace", "alice", "--set", db)...); err == nil || !strings.Contains(err.Error(), "the text is empty") {
			t.Errorf("%q: %v", args, err)
		}
	}
	if out, _ := runCLI(t, "memory", "list", "--namespace", "alice", "--set", db); strings.Count(out, "mem_") != 1 || !strings.Contains(out, "Velden") {
		t.Errorf("after the refusals:\n%s", out)
	}
}
