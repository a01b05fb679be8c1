package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/agemem/agemem/internal/pgtest"
	"github.com/agemem/agemem/memtools/ltm"
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
