package main

import (
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/agemem/agemem/embed"
	"github.com/agemem/agemem/memtools/ltm"
)

func copyTo(t *testing.T, from, to string) {
	t.Helper()
	in, err := os.Open(from)
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close()
	out, _ := os.Create(to)
	io.Copy(out, in)
	out.Close()
}

// `serve memory check` on a log cut inside a frame (the case:
// it said "ok" and exited 0) names the cut and exits non-zero; repair
// rebuilds the store and says what it kept and lost; a store with random
// bytes in it is repaired with every memory on the undamaged pages.
func TestMemoryCheckAndRepair(t *testing.T) {
	dir := t.TempDir()
	live := filepath.Join(dir, "live.db")
	s, err := ltm.OpenSQLite(live, ltm.SQLiteOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ns, _ := s.Namespace("default")
	h := embed.DefaultConfig().Hashing()
	for i := range 300 {
		c := fmt.Sprintf("fact number %d", i)
		if _, err := ns.Add(context.Background(), ltm.Entry{Content: c, Embedding: h.One(c)}); err != nil {
			t.Fatal(err)
		}
	}
	// The files as a killed server leaves them: the index first, as a
	// writer records frames there after writing them to the log.
	cut := filepath.Join(dir, "cut.db")
	for _, suf := range []string{"-shm", "-wal", ""} {
		copyTo(t, live+suf, cut+suf)
	}
	w, _ := ltm.CheckWAL(cut)
	page := int64(16384 + 24)
	os.Truncate(cut+"-wal", 32+int64(w.IndexFrames/2)*page+1000)
	set := "memory.path=" + cut
	out, err := runCLI(t, "memory", "check", "--set", set)
	if err == nil || !strings.Contains(out, "was cut") || !strings.Contains(out, "lost") {
		t.Fatalf("check of a cut log: %v\n%s", err, out)
	}
	if _, err := runCLI(t, "memory", "list", "--set", set); err == nil || !strings.Contains(err.Error(), "serve memory repair") {
		t.Fatalf("a cut store opens: %v", err)
	}
	out, err = runCLI(t, "memory", "repair", "--set", set)
	if err != nil || !strings.Contains(out, "kept") || !strings.Contains(out, "the log had been cut") {
		t.Fatalf("repair: %v\n%s", err, out)
	}
	if out, err := runCLI(t, "memory", "check", "--set", set); err != nil || !strings.Contains(out, ": ok (") {
		t.Fatalf("check after the repair: %v\n%s", err, out)
	}

	// Random bytes in the middle of a cleanly closed store.
	s.Close()
	raw, _ := os.ReadFile(live)
	r := rand.New(rand.NewPCG(1, 2))
	for i := len(raw) / 2; i < len(raw)/2+4096; i++ {
		raw[i] = byte(r.Uint32())
	}
	os.WriteFile(live, raw, 0o644)
	set = "memory.path=" + live
	if out, err := runCLI(t, "memory", "check", "--set", set); err == nil || !strings.Contains(out, "quick_check") {
		t.Fatalf("check of a damaged file: %v\n%s", err, out)
	}
	out, err = runCLI(t, "memory", "repair", "--set", set)
	var kept, total, lost int
	if err != nil || func() bool {
		_, e := fmt.Sscanf(strings.SplitN(out, ": ", 2)[1], "kept %d of %d memories, lost %d", &kept, &total, &lost)
		return e != nil
	}() {
		t.Fatalf("repair: %v\n%s", err, out)
	}
	list, _ := runCLI(t, "memory", "list", "--set", set)
	if total != 300 || kept+lost != 300 || strings.Count(list, "\n") != kept {
		t.Fatalf("repair said kept %d of %d, lost %d; the store lists %d\n%s", kept, total, lost, strings.Count(list, "\n"), out)
	}
	t.Logf("4 KiB of random bytes: %s", strings.ReplaceAll(strings.TrimSpace(out), "\n", "; "))
}
