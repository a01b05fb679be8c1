package ltm

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// fill adds n entries to namespace "t" of an open store.
func fill(t *testing.T, s *SQLite, n, dim int) {
	t.Helper()
	st, err := s.Namespace("t")
	if err != nil {
		t.Fatal(err)
	}
	r := rand.New(rand.NewPCG(1, 2))
	for i := range n {
		v := make([]float32, dim)
		for j := range v {
			v[j] = float32(r.NormFloat64())
		}
		if _, err := st.Add(context.Background(), Entry{Content: fmt.Sprintf("memory %d %s", i, strings.Repeat("x", 200)), Embedding: v}); err != nil {
			t.Fatal(err)
		}
	}
}

func count(t *testing.T, path string) int {
	t.Helper()
	s, err := OpenSQLite(path, SQLiteOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	st, _ := s.Namespace("t")
	n, err := st.Count(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// snapshot copies a live store's file and log, as a crash would leave them.
func snapshot(t *testing.T, path, to string) {
	t.Helper()
	for _, suf := range []string{"", "-wal"} {
		if err := copyFile(path+suf, to+suf); err != nil {
			t.Fatal(err)
		}
	}
}

// A log damaged in the middle would lose the acknowledged writes after the
// damage silently in SQLite's recovery; the store refuses to open, says how
// many frames, and repair rebuilds from what is readable, keeping the
// damaged files.
func TestDamagedWALIsRefusedNotSilentlyTruncated(t *testing.T) {
	dir := t.TempDir()
	live := filepath.Join(dir, "live.db")
	s, err := OpenSQLite(live, SQLiteOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	fill(t, s, 60, 16)
	good, bad := filepath.Join(dir, "good.db"), filepath.Join(dir, "bad.db")
	snapshot(t, live, good)
	snapshot(t, live, bad)

	rep, err := CheckWAL(good)
	if err != nil || rep.Frames < 60 || rep.Valid != rep.Frames || rep.Lost != 0 {
		t.Fatalf("an intact log: %+v %v", rep, err)
	}
	if n := count(t, good); n != 60 {
		t.Fatalf("an intact crash snapshot holds %d of 60 memories", n)
	}

	raw, _ := os.ReadFile(bad + "-wal")
	page := int(raw[8])<<24 | int(raw[9])<<16 | int(raw[10])<<8 | int(raw[11])
	off := 32 + (rep.Frames/2)*(24+page) + 24 + 100
	raw[off] ^= 0xff
	os.WriteFile(bad+"-wal", raw, 0o644)
	_, err = OpenSQLite(bad, SQLiteOptions{})
	if !errors.Is(err, ErrDamaged) || !strings.Contains(err.Error(), "frames of acknowledged writes would be dropped") || !strings.Contains(err.Error(), "serve memory repair") {
		t.Fatalf("a damaged log: %v", err)
	}
	if r, _ := Check(bad); r.OK() || r.WAL.Lost == 0 {
		t.Fatalf("check of a damaged log: %+v", r)
	}
	kept, aside, err := Repair(bad)
	if err != nil {
		t.Fatal(err)
	}
	if kept == 0 || kept >= 60 {
		t.Fatalf("repair kept %d of 60 (the part before the damage)", kept)
	}
	if _, err := os.Stat(aside + "-wal"); err != nil {
		t.Fatalf("the damaged log is not kept: %v", err)
	}
	if n := count(t, bad); n != kept {
		t.Fatalf("the repaired store holds %d, repair said %d", n, kept)
	}
}

// Random bytes inside the database file: refused at open, not served with
// 500s and written into.
func TestDamagedFileIsRefused(t *testing.T) {
	path := filepath.Join(t.TempDir(), "m.db")
	s, err := OpenSQLite(path, SQLiteOptions{})
	if err != nil {
		t.Fatal(err)
	}
	fill(t, s, 300, 64)
	s.Close() // checkpoints the log into the file
	raw, _ := os.ReadFile(path)
	r := rand.New(rand.NewPCG(3, 4))
	for i := len(raw) / 2; i < len(raw)/2+16<<10 && i < len(raw); i++ {
		raw[i] = byte(r.Uint32())
	}
	os.WriteFile(path, raw, 0o644)
	if _, err := OpenSQLite(path, SQLiteOptions{}); !errors.Is(err, ErrDamaged) || !strings.Contains(err.Error(), "quick_check") {
		t.Fatalf("a damaged file: %v", err)
	}
	kept, _, err := Repair(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("repair kept %d of 300", kept)
	// How much survives depends on which pages the damage hit (an interior
	// page hides every row below it from a scan): 57-195 of 300 seen.
	if kept == 0 {
		t.Fatal("repair kept nothing of 300")
	}
	if n := count(t, path); n != kept {
		t.Fatalf("the repaired store holds %d, repair said %d", n, kept)
	}
}
