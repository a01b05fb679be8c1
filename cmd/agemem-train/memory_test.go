package main

import (
	"context"
	"path/filepath"
	"strings"
	"testing"

	"github.com/agemem/agemem/embed"
	"github.com/agemem/agemem/memtools/ltm"
)

// TestMemoryMigrate: agemem-train memory migrate is serve's (one
// constructor): here between two SQLite files.
func TestMemoryMigrate(t *testing.T) {
	dir := t.TempDir()
	src := filepath.Join(dir, "a.db")
	db, err := ltm.OpenSQLite(src, ltm.SQLiteOptions{})
	if err != nil {
		t.Fatal(err)
	}
	h := embed.NewHashing(16, nil)
	for _, ns := range []string{"u1", "u2"} {
		st, _ := db.Namespace(ns)
		for _, c := range []string{"one", "two", "three"} {
			if _, err := st.Add(context.Background(), ltm.Entry{Content: ns + " " + c, Embedding: h.One(c)}); err != nil {
				t.Fatal(err)
			}
		}
	}
	db.Close()
	out := mustRun(t, "memory", "migrate", "--from", "sqlite:"+src, "--to", "sqlite:"+filepath.Join(dir, "b.db"))
	if !strings.Contains(out, "2 namespaces") || !strings.Contains(out, "0 differ") || strings.Count(out, " same") != 2 {
		t.Fatalf("migrate:\n%s", out)
	}
}
