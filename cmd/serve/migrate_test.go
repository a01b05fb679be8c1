package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/agemem/agemem/internal/pgtest"
	"github.com/agemem/agemem/llm"
	"github.com/agemem/agemem/memtools/ltm"
	"github.com/agemem/agemem/serve"
	"github.com/agemem/agemem/setup"
)

// TestMemoryCommandsOnPostgres: the memory commands, JSONL export and
// import included, on memory.store postgres.
func TestMemoryCommandsOnPostgres(t *testing.T) {
	dsn, _ := pgtest.Schema(t)
	pg := []string{"--set", "memory.store=postgres", "--set", "memory.dsn=" + dsn}
	cli := func(args ...string) string {
		t.Helper()
		out, err := runCLI(t, append(args, pg...)...)
		if err != nil {
			t.Fatalf("serve %s: %v\n%s", strings.Join(args, " "), err, out)
		}
		return out
	}
	id := strings.TrimSpace(cli("memory", "add", "Alice's cat is called Tabby", "--type", "fact", "--metadata", `{"topic":"pets"}`, "--namespace", "alice"))
	cli("memory", "add", "Alice lives in Velden", "--namespace", "alice")
	if again := strings.TrimSpace(cli("memory", "add", "Alice's cat is called Tabby", "--namespace", "alice")); again != id {
		t.Fatalf("the same content added twice: %s then %s", id, again)
	}
	if out := cli("memory", "search", "what is the cat called", "--top-k", "1", "--namespace", "alice"); !strings.HasPrefix(out, id) {
		t.Fatalf("search: %s", out)
	}
	export := cli("memory", "export", "--namespace", "alice")
	if strings.Count(export, "\n") != 2 {
		t.Fatalf("export: %s", export)
	}
	f := filepath.Join(t.TempDir(), "alice.jsonl")
	os.WriteFile(f, []byte(export), 0o644)
	cli("memory", "import", f, "--namespace", "bob")
	cli("memory", "import", f, "--namespace", "bob") // the same ids: replaced, not doubled
	if out := cli("memory", "list", "--namespace", "bob"); strings.Count(out, "\n") != 2 || !strings.Contains(out, `{"topic":"pets"}`) || !strings.HasPrefix(out, id) {
		t.Fatalf("bob after importing alice's export twice: %s", out)
	}
}

// TestMemoryMigrate: a SQLite store to PostgreSQL and back with the CLI;
// the same counts and checksums on every side, and a second run writes
// nothing.
func TestMemoryMigrate(t *testing.T) {
	dsn, _ := pgtest.Schema(t)
	dir := t.TempDir()
	src := filepath.Join(dir, "m.db")
	for _, ns := range []string{"alice", "bob", "carol"} {
		for _, c := range []string{"likes tea", "lives in Velden", "has a cat called " + ns} {
			if _, err := runCLI(t, "memory", "add", ns+" "+c, "--namespace", ns, "--metadata", `{"who":"`+ns+`"}`, "--set", "memory.path="+src); err != nil {
				t.Fatal(err)
			}
		}
	}
	migrate := func(from, to string) []ltm.CopyReport {
		t.Helper()
		out, err := runCLI(t, "memory", "migrate", "--from", from, "--to", to, "--json")
		if err != nil {
			t.Fatalf("migrate %s -> %s: %v\n%s", from, to, err, out)
		}
		var rs []ltm.CopyReport
		if err := json.Unmarshal([]byte(out[strings.Index(out, "["):]), &rs); err != nil {
			t.Fatalf("%v: %s", err, out)
		}
		return rs
	}
	there := migrate("sqlite:"+src, "postgres:"+dsn)
	back := migrate("postgres:"+dsn, "sqlite:"+filepath.Join(dir, "back.db"))
	if len(there) != 3 || len(back) != 3 {
		t.Fatalf("%d and %d namespaces, want 3", len(there), len(back))
	}
	for i := range there {
		if !there[i].Same() || there[i].FromCount != 3 || there[i].Written != 3 || back[i].ToSum != there[i].FromSum {
			t.Fatalf("%+v then %+v", there[i], back[i])
		}
	}
	for _, r := range migrate("sqlite:"+src, "postgres:"+dsn) {
		if r.Written != 0 || !r.Same() {
			t.Fatalf("the second run: %+v", r)
		}
	}
	out, err := runCLI(t, "memory", "migrate", "--from", "sqlite:"+src, "--to", "postgres://agemem:hunter2@db/x")
	if err == nil || !strings.Contains(err.Error(), "PGPASSWORD") || strings.Contains(err.Error()+out, "hunter2") {
		t.Fatalf("a password on the command line: %v", err)
	}
	if _, err := runCLI(t, "memory", "migrate", "--from", "sqlite:"+filepath.Join(dir, "none.db"), "--to", "sqlite:"+filepath.Join(dir, "x.db")); err == nil {
		t.Fatal("a missing --from file was created")
	}
}

// answers is a model that answers every request at once: the serve run
// below writes memories through the memory API, not the model.
type answers struct{}

func (answers) Chat(context.Context, llm.Request) (llm.Response, error) {
	return llm.Reply("<think>ok</think><answer>ok</answer>"), nil
}

// TestMigrateAServeRun: the SQLite store a serve run wrote (memory API
// writes with Idempotency-Keys, imports, in six namespaces) to PostgreSQL
// with the migrate command, killed half-way and run again, then back to a
// new SQLite file: the counts and checksums are the same on every side,
// and the second run wrote only what the first had not.
func TestMigrateAServeRun(t *testing.T) {
	dsn, schema := pgtest.Schema(t)
	dir := t.TempDir()
	src := filepath.Join(dir, "serve.db")
	cfg := setup.Default()
	cfg.Memory.Path = src
	cfg.Serve.Addr = "127.0.0.1:0"
	cfg.Serve.KeysEnv = ""
	cfg.Serve.Keys = []serve.APIKey{{Key: "sk-admin-000001", Admin: true}}
	ctx, stop := context.WithCancel(context.Background())
	addr := make(chan string, 1)
	done := make(chan error, 1)
	go func() { done <- runOn(ctx, cfg, serve.Remote{Model: answers{}}, addr) }()
	base := "http://" + <-addr
	const spaces, perSpace = 6, 400
	post := func(path, ns, key, body string) {
		t.Helper()
		req, _ := http.NewRequest("POST", base+path, strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer sk-admin-000001")
		req.Header.Set("X-AgeMem-Namespace", ns)
		req.Header.Set("Idempotency-Key", key)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		raw, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode/100 != 2 {
			t.Fatalf("POST %s: %d %s", path, resp.StatusCode, raw)
		}
	}
	for s := range spaces {
		ns := fmt.Sprint("user", s)
		var lines strings.Builder
		for i := range perSpace - 10 {
			fmt.Fprintf(&lines, `{"content": "%s keeps note %d", "metadata": {"n": %d}}`+"\n", ns, i, i)
		}
		post("/v1/memories/import", ns, "import-"+ns, lines.String())
		for i := range 10 {
			post("/v1/memories", ns, fmt.Sprint("add-", ns, i), fmt.Sprintf(`{"content": "%s said %d", "memory_type": "fact"}`, ns, i))
		}
	}
	stop()
	if err := <-done; err != nil {
		t.Fatal(err)
	}

	// The first run is killed once a third of the memories are across.
	c := pgtest.Conn(t, dsn)
	cmd := child("memory", "migrate", "--from", "sqlite:"+src, "--to", "postgres:"+dsn, "--batch", "1")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var across int
	for across < spaces*perSpace/3 {
		time.Sleep(5 * time.Millisecond)
		if err := c.QueryRow(context.Background(), "SELECT count(*) FROM "+schema+".agemem_memories").Scan(&across); err != nil {
			across = 0 // the first run has not made the table yet
		}
	}
	cmd.Process.Signal(syscall.SIGKILL)
	cmd.Wait()
	c.QueryRow(context.Background(), "SELECT count(*) FROM "+schema+".agemem_memories").Scan(&across)
	if across >= spaces*perSpace {
		t.Fatalf("the first run copied all %d memories before it was killed", across)
	}
	migrate := func(from, to string) []ltm.CopyReport {
		t.Helper()
		out, err := runCLI(t, "memory", "migrate", "--from", from, "--to", to, "--json")
		if err != nil {
			t.Fatalf("migrate %s -> %s: %v\n%s", from, to, err, out)
		}
		var rs []ltm.CopyReport
		if err := json.Unmarshal([]byte(out[strings.Index(out, "["):]), &rs); err != nil {
			t.Fatalf("%v: %s", err, out)
		}
		return rs
	}
	there := migrate("sqlite:"+src, "postgres:"+dsn)
	back := migrate("postgres:"+dsn, "sqlite:"+filepath.Join(dir, "back.db"))
	written := 0
	for i, r := range there {
		written += r.Written
		if !r.Same() || r.FromCount != perSpace || back[i].Namespace != r.Namespace || !back[i].Same() || back[i].ToSum != r.FromSum || back[i].Written != perSpace {
			t.Fatalf("%s: there %+v, back %+v", r.Namespace, r, back[i])
		}
	}
	if len(there) != spaces || written != spaces*perSpace-across {
		t.Fatalf("the second run wrote %d memories of %d namespaces; %d of %d were across", written, len(there), across, spaces*perSpace)
	}
	t.Logf("%d memories in %d namespaces; the killed run copied %d, the second %d; back: the same checksums", spaces*perSpace, spaces, across, written)
}
