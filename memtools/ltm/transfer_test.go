package ltm

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"testing"
	"time"
)

// populated is a SQLite store as a server leaves it: 5 namespaces of
// memories added, updated and deleted, and a duplicate content an older
// build let in.
func populated(t *testing.T) (*SQLite, int) {
	t.Helper()
	ctx := context.Background()
	db, err := OpenSQLite(filepath.Join(t.TempDir(), "src.db"), SQLiteOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	total := 0
	for u := range 5 {
		ns, _ := db.Namespace(fmt.Sprintf("user%d", u))
		var ids []string
		for i := range 60 + 20*u {
			c := fmt.Sprintf("user %d memory %d", u, i)
			e, err := ns.Add(ctx, entry(c, map[string]any{"i": i, "nested": map[string]any{"ok": i%2 == 0}, "big": 1e21}))
			if err != nil {
				t.Fatal(err)
			}
			ids = append(ids, e.ID)
		}
		for i := 0; i < len(ids); i += 7 {
			ns.Update(ctx, ids[i], fmt.Sprintf("user %d memory %d, revised", u, i), enc.One(fmt.Sprint("revised", i)), map[string]any{"rev": true})
		}
		for i := 3; i < len(ids); i += 11 {
			ns.Delete(ctx, ids[i])
		}
		db.Import(ctx, fmt.Sprintf("user%d", u), []Entry{{Content: fmt.Sprintf("user %d memory 1", u), Embedding: enc.One("dup"), Created: time.Unix(0, 1).UTC(), Updated: time.Unix(0, 2).UTC()}})
		n, _ := ns.Count(ctx)
		total += n
	}
	return db, total
}

func order(t *testing.T, db DB, name string) []string {
	t.Helper()
	es, err := list(context.Background(), db, name)
	if err != nil {
		t.Fatal(err)
	}
	ids := make([]string, len(es))
	for i, e := range es {
		ids[i] = e.ID
	}
	return ids
}

func written(rs []CopyReport) int {
	n := 0
	for _, r := range rs {
		n += r.Written
	}
	return n
}

// TestCopyThereAndBack: SQLite to PostgreSQL to a new SQLite file, every
// namespace with the same count, checksum and order on each; run again,
// nothing is written.
func TestCopyThereAndBack(t *testing.T) {
	ctx := context.Background()
	src, total := populated(t)
	pg := openPG(t, PostgresOptions{})
	back, err := OpenSQLite(filepath.Join(t.TempDir(), "back.db"), SQLiteOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer back.Close()
	there, err := Copy(ctx, src, pg, CopyOptions{Batch: 50})
	if err != nil {
		t.Fatal(err)
	}
	again, err := Copy(ctx, pg, back, CopyOptions{Batch: 50})
	if err != nil {
		t.Fatal(err)
	}
	if len(there) != 5 || len(again) != 5 || written(there) != total || written(again) != total {
		t.Fatalf("copied %d then %d memories in %d and %d namespaces, want %d in 5", written(there), written(again), len(there), len(again), total)
	}
	for i, r := range there {
		if !r.Same() || r.ToSum != again[i].ToSum || r.FromCount != again[i].ToCount {
			t.Fatalf("%s: %+v, back: %+v", r.Namespace, r, again[i])
		}
		o := order(t, src, r.Namespace)
		if !slices.Equal(o, order(t, pg, r.Namespace)) || !slices.Equal(o, order(t, back, r.Namespace)) {
			t.Fatalf("%s: the insertion order changed on the way", r.Namespace)
		}
	}
	rerun, err := Copy(ctx, src, pg, CopyOptions{})
	if err != nil || written(rerun) != 0 {
		t.Fatalf("a second run wrote %d memories: %v", written(rerun), err)
	}
}

// TestCopyResumes: a copy cut off half-way (its context ends in the middle
// of a batch) and run again ends as one uninterrupted copy does: every
// memory once, the order kept, the half already there not written again.
func TestCopyResumes(t *testing.T) {
	src, total := populated(t)
	for _, kind := range []string{"postgres", "sqlite"} {
		t.Run(kind, func(t *testing.T) {
			var dst DB
			if kind == "postgres" {
				dst = openPG(t, PostgresOptions{})
			} else {
				s, err := OpenSQLite(filepath.Join(t.TempDir(), "dst.db"), SQLiteOptions{})
				if err != nil {
					t.Fatal(err)
				}
				defer s.Close()
				dst = s
			}
			ctx, cancel := context.WithCancel(context.Background())
			done := 0
			_, err := Copy(ctx, src, dst, CopyOptions{Batch: 20, Progress: func(_ string, _, _ int) {
				if done += 20; done >= total/2 {
					cancel()
				}
			}})
			if !errors.Is(err, context.Canceled) {
				t.Fatalf("the interrupted copy: %v", err)
			}
			var first int
			names, _ := dst.Namespaces(context.Background())
			for _, n := range names {
				first += len(order(t, dst, n))
			}
			if first == 0 || first >= total {
				t.Fatalf("the interrupted copy left %d of %d memories: not half-way", first, total)
			}
			rs, err := Copy(context.Background(), src, dst, CopyOptions{Batch: 20})
			if err != nil {
				t.Fatal(err)
			}
			if w := written(rs); w != total-first {
				t.Fatalf("the second run wrote %d memories; %d were missing", w, total-first)
			}
			for _, r := range rs {
				if !r.Same() || !slices.Equal(order(t, src, r.Namespace), order(t, dst, r.Namespace)) {
					t.Fatalf("%s after resuming: %+v", r.Namespace, r)
				}
			}
		})
	}
}

// TestCopyReportsWhatItWillNotDelete: a destination memory the source
// lacks is reported, and kept.
func TestCopyReportsWhatItWillNotDelete(t *testing.T) {
	ctx := context.Background()
	src, _ := populated(t)
	pg := openPG(t, PostgresOptions{})
	ns, _ := pg.Namespace("user2")
	extra, _ := ns.Add(ctx, entry("only in the destination", nil))
	rs, err := Copy(ctx, src, pg, CopyOptions{})
	if !errors.Is(err, ErrMismatch) || len(rs) != 5 || rs[2].Same() || !rs[1].Same() {
		t.Fatalf("copy over a destination with its own memory: %v %+v", err, rs)
	}
	if _, err := ns.Get(ctx, extra.ID); err != nil {
		t.Fatalf("the destination's own memory: %v", err)
	}
}
