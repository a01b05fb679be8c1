package ltm

// The store suite: every test here runs unchanged on each store (the
// in-memory one, SQLite, PostgreSQL), so the three keep one contract.

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/agemem/agemem/embed"
	"github.com/agemem/agemem/kernels/vec"
)

// stores runs f on a fresh namespace of each store.
func stores(t *testing.T, f func(t *testing.T, s Store)) {
	t.Run("memory", func(t *testing.T) { f(t, NewMemStore(1)) })
	dbs(t, func(t *testing.T, db DB) {
		ns, err := db.Namespace("alice")
		if err != nil {
			t.Fatal(err)
		}
		f(t, ns)
	})
}

// dbs runs f on a fresh store of each durable kind.
func dbs(t *testing.T, f func(t *testing.T, db DB)) {
	t.Run("sqlite", func(t *testing.T) {
		db, err := OpenSQLite(filepath.Join(t.TempDir(), "m.db"), SQLiteOptions{})
		if err != nil {
			t.Fatal(err)
		}
		defer db.Close()
		f(t, db)
	})
	t.Run("postgres", func(t *testing.T) { f(t, openPG(t, PostgresOptions{})) })
}

// TestDBHoldsAContentOnce: identical adds, one after another or 32 at
// once, leave one memory, and every caller gets its id (mem0 #6515).
func TestDBHoldsAContentOnce(t *testing.T) {
	ctx := context.Background()
	dbs(t, func(t *testing.T, db DB) {
		s, _ := db.Namespace("alice")
		first, err := s.Add(ctx, entry("Alice's cat is called Tabby.", map[string]any{"src": "chat 1"}))
		if err != nil {
			t.Fatal(err)
		}
		again, err := s.Add(ctx, entry("Alice's cat is called Tabby.", map[string]any{"src": "chat 2"}))
		if err != nil {
			t.Fatal(err)
		}
		if again.ID != first.ID || again.Metadata["src"] != "chat 1" || !again.Created.Equal(first.Created) {
			t.Fatalf("the second add of a content: %+v, want the first entry %+v unchanged", again, first)
		}
		// Concurrent: 4 contents, each added by 8 writers at once.
		var wg sync.WaitGroup
		ids := make([][]string, 4)
		var mu sync.Mutex
		errs := make(chan error, 32)
		for w := range 32 {
			wg.Go(func() {
				c := fmt.Sprintf("fact %d said by every writer", w%4)
				e, err := s.Add(ctx, entry(c, map[string]any{"writer": w}))
				if err != nil {
					errs <- err
					return
				}
				mu.Lock()
				ids[w%4] = append(ids[w%4], e.ID)
				mu.Unlock()
			})
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Fatal(err)
		}
		for c, got := range ids {
			if u := slices.Compact(slices.Sorted(slices.Values(got))); len(got) != 8 || len(u) != 1 {
				t.Fatalf("content %d: 8 concurrent adds returned ids %v, want one", c, got)
			}
		}
		if n, _ := s.Count(ctx); n != 5 {
			t.Fatalf("Count = %d after 33 adds of 5 contents, want 5", n)
		}
		// A content that left (updated away, deleted) can come back.
		if _, err := s.Update(ctx, first.ID, "Alice's cat is called Mog.", enc.One("Alice's cat is called Mog."), nil); err != nil {
			t.Fatal(err)
		}
		back, _ := s.Add(ctx, entry("Alice's cat is called Tabby.", nil))
		if back.ID == first.ID {
			t.Fatal("an add of a content no entry holds any more returned the updated entry")
		}
		if err := s.Delete(ctx, back.ID); err != nil {
			t.Fatal(err)
		}
		if again, _ := s.Add(ctx, entry("Alice's cat is called Tabby.", nil)); again.ID == back.ID {
			t.Fatal("an add of a deleted content returned the deleted id")
		}
		if n, _ := s.Count(ctx); n != 6 {
			t.Fatalf("Count = %d, want 6", n)
		}
	})
}

// TestStoreRetrieveIsExact: top-k against a brute-force scan of List, with
// exact ties (identical embeddings) broken by insertion order, after
// deletes and updates, with and without a filter: every store returns the
// same ids with the same scores.
func TestStoreRetrieveIsExact(t *testing.T) {
	ctx := context.Background()
	stores(t, func(t *testing.T, s Store) {
		r := rand.New(rand.NewPCG(7, 8))
		const dim = 32
		randVec := func() []float32 {
			v := make([]float32, dim)
			for i := range v {
				v[i] = float32(r.NormFloat64())
			}
			return v
		}
		var ids []string
		for i := range 300 {
			v := randVec()
			if i%10 == 9 { // the same direction as the entry before: a tie
				v = slices.Clone(s2v(t, s, ids[len(ids)-1]))
			}
			e, err := s.Add(ctx, Entry{Content: fmt.Sprintf("memory %d", i), Embedding: v, Metadata: map[string]any{"g": i % 3}})
			if err != nil {
				t.Fatal(err)
			}
			ids = append(ids, e.ID)
		}
		for i := 0; i < len(ids); i += 17 {
			if err := s.Delete(ctx, ids[i]); err != nil {
				t.Fatal(err)
			}
		}
		for i := 5; i < len(ids); i += 23 {
			if i%17 != 0 {
				if _, err := s.Update(ctx, ids[i], fmt.Sprintf("memory %d, updated", i), randVec(), nil); err != nil {
					t.Fatal(err)
				}
			}
		}
		all, err := s.List(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for qi := range 30 {
			q := randVec()
			if qi%5 == 0 { // a stored direction: its tie group on top
				q = slices.Clone(all[qi*7].Embedding)
			}
			for _, filter := range []map[string]any{nil, {"g": 1}} {
				got, err := s.Retrieve(ctx, q, 10, filter)
				if err != nil {
					t.Fatal(err)
				}
				want := bruteForce(all, q, 10, filter)
				if len(got) != len(want) {
					t.Fatalf("query %d filter %v: %d hits, want %d", qi, filter, len(got), len(want))
				}
				for i := range want {
					if got[i].ID != want[i].ID || got[i].Score != want[i].Score {
						t.Fatalf("query %d filter %v hit %d: %s %.9f, want %s %.9f", qi, filter, i, got[i].ID, got[i].Score, want[i].ID, want[i].Score)
					}
				}
			}
		}
	})
}

func s2v(t *testing.T, s Store, id string) []float32 {
	e, err := s.Get(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	return e.Embedding
}

// bruteForce is top-k by a scan: cosine of the normalised vectors, ties
// to the earlier entry of List.
func bruteForce(all []Entry, q []float32, k int, filter map[string]any) []Scored {
	qn := slices.Clone(q)
	embed.Normalize(qn)
	type hit struct {
		Scored
		pos int
	}
	var hits []hit
	for i, e := range all {
		if !Matches(e, filter) {
			continue
		}
		v := slices.Clone(e.Embedding)
		embed.Normalize(v)
		hits = append(hits, hit{Scored{e, float64(vec.Dot(qn, v))}, i})
	}
	slices.SortFunc(hits, func(a, b hit) int {
		if a.Score != b.Score {
			return cmp.Compare(b.Score, a.Score)
		}
		return cmp.Compare(a.pos, b.pos)
	})
	out := make([]Scored, 0, k)
	for _, h := range hits[:min(k, len(hits))] {
		out = append(out, h.Scored)
	}
	return out
}

// TestDBRefusesWhatItCannotKeep: text a DB cannot keep as it is
// (PostgreSQL holds no NUL and no invalid UTF-8) is refused by both, and
// the store is left as it was.
func TestDBRefusesWhatItCannotKeep(t *testing.T) {
	ctx := context.Background()
	dbs(t, func(t *testing.T, db DB) {
		s, _ := db.Namespace("alice")
		ok, err := s.Add(ctx, entry("a fine memory", nil))
		if err != nil {
			t.Fatal(err)
		}
		for name, e := range map[string]Entry{
			"NUL in content":    entry("a\x00b", nil),
			"invalid UTF-8":     entry("caf\xe9", nil),
			"NUL in metadata":   entry("fine", map[string]any{"k": "a\x00b"}),
			"NUL in nested key": entry("fine", map[string]any{"k": map[string]any{"a\x00": 1}}),
			"no embedding":      {Content: "x"},
			"wrong dimension":   {Content: "x", Embedding: []float32{1, 2}},
			"empty embedding":   {Content: "y", Embedding: []float32{}},
		} {
			if _, err := s.Add(ctx, e); err == nil {
				t.Errorf("%s: Add succeeded", name)
			}
		}
		if _, err := s.Update(ctx, ok.ID, "x\x00", enc.One("x"), nil); err == nil {
			t.Error("Update to content with NUL succeeded")
		}
		// A literal backslash-u sequence is text like any other.
		if _, err := s.Add(ctx, entry(`the escape \u0000 in JSON`, map[string]any{"k": `\u0000`})); err != nil {
			t.Errorf("content with a literal \\u0000: %v", err)
		}
		if n, _ := s.Count(ctx); n != 2 {
			t.Fatalf("Count = %d, want 2", n)
		}
		if g, _ := s.Get(ctx, ok.ID); g.Content != "a fine memory" {
			t.Fatalf("the refused update changed the entry: %+v", g)
		}
		if hits, err := s.Retrieve(ctx, enc.One("fine"), 3, map[string]any{"k": "a\x00b"}); err != nil || len(hits) != 0 {
			t.Fatalf("a filter with NUL: %v %v", hits, err)
		}
		if _, _, err := db.Import(ctx, "alice", []Entry{{Content: "a\x00", Embedding: enc.One("a")}}); err == nil {
			t.Error("Import of content with NUL succeeded")
		}
	})
}

// TestDBNamespacesStayApartUnderConcurrency: writers of 8 namespaces at once
// on one handle never see or write each other's memories (graphiti #1676).
func TestDBNamespacesStayApartUnderConcurrency(t *testing.T) {
	ctx := context.Background()
	dbs(t, func(t *testing.T, db DB) {
		var wg sync.WaitGroup
		errs := make(chan error, 64)
		for w := range 32 {
			wg.Go(func() {
				name := fmt.Sprintf("tenant%d", w%8)
				ns, err := db.Namespace(name)
				if err != nil {
					errs <- err
					return
				}
				for i := range 10 {
					c := fmt.Sprintf("%s fact %d of writer %d", name, i, w)
					e, err := ns.Add(ctx, entry(c, map[string]any{"tenant": name}))
					if err == nil && i%3 == 0 {
						_, err = ns.Update(ctx, e.ID, c+" (revised)", enc.One(c+" revised"), nil)
					}
					if err == nil {
						var hits []Scored
						hits, err = ns.Retrieve(ctx, enc.One(c), 5, nil)
						for _, h := range hits {
							if !strings.HasPrefix(h.Content, name+" ") {
								err = fmt.Errorf("%s retrieved %q", name, h.Content)
							}
						}
					}
					if err != nil {
						errs <- err
						return
					}
				}
			})
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Fatal(err)
		}
		names, err := db.Namespaces(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if len(names) != 8 {
			t.Fatalf("namespaces %v, want 8", names)
		}
		for _, name := range names {
			ns, _ := db.Namespace(name)
			all, _ := ns.List(ctx)
			if len(all) != 40 {
				t.Fatalf("%s holds %d memories, want 40", name, len(all))
			}
			for _, e := range all {
				if !strings.HasPrefix(e.Content, name+" ") || e.Metadata["tenant"] != name {
					t.Fatalf("%s holds %q of %v", name, e.Content, e.Metadata["tenant"])
				}
			}
		}
	})
}

// TestDBImport: ids and timestamps kept, the same import twice replaces
// instead of duplicating, and a bad entry writes nothing.
func TestDBImport(t *testing.T) {
	ctx := context.Background()
	dbs(t, func(t *testing.T, db DB) {
		at := time.Date(2024, 3, 1, 12, 0, 0, 123456789, time.UTC)
		es := []Entry{
			{ID: "mem_0000beef", Content: "one", Embedding: enc.One("one"), Metadata: map[string]any{"n": 1.5}, MemoryType: "fact", Created: at, Updated: at.Add(time.Second)},
			{ID: "mem_0000cafe", Content: "two", Embedding: enc.One("two")},
			{ID: "not-an-id", Content: "three", Embedding: enc.One("three")},
		}
		added, replaced, err := db.Import(ctx, "bob", es)
		if err != nil || added != 3 || replaced != 0 {
			t.Fatalf("first import: %d added, %d replaced, %v", added, replaced, err)
		}
		added, replaced, err = db.Import(ctx, "bob", es[:2])
		if err != nil || added != 0 || replaced != 2 {
			t.Fatalf("second import: %d added, %d replaced, %v", added, replaced, err)
		}
		bad := []Entry{{ID: "mem_00000001", Content: "four", Embedding: enc.One("four")}, {Content: "five", Embedding: []float32{1, 2}}}
		if _, _, err := db.Import(ctx, "bob", bad); err == nil {
			t.Fatal("an import with a wrong dimension succeeded")
		}
		ns, _ := db.Namespace("bob")
		all, _ := ns.List(ctx)
		if len(all) != 3 {
			t.Fatalf("bob holds %d memories, want 3", len(all))
		}
		g, err := ns.Get(ctx, "mem_0000beef")
		if err != nil || !g.Created.Equal(at) || !g.Updated.Equal(at.Add(time.Second)) || g.Metadata["n"] != 1.5 || g.MemoryType != "fact" {
			t.Fatalf("imported entry: %+v %v", g, err)
		}
		if !ValidID(all[2].ID) || all[2].Content != "three" {
			t.Fatalf("an entry without a valid id: %+v", all[2])
		}
		if _, err := ns.Get(ctx, "mem_00000001"); !errors.Is(err, ErrNotFound) {
			t.Fatalf("an entry of the failed import is there: %v", err)
		}
	})
}
