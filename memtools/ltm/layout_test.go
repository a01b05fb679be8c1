package ltm

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/agemem/agemem/embed"
)

var enc384 = embed.NewHashing(384, []int{3, 4})

// embedder recomputes embeddings as the stores in these tests were
// written.
func embedder(_ context.Context, texts []string) ([][]float32, error) {
	out := make([][]float32, len(texts))
	for i, s := range texts {
		out[i] = enc384.One(s)
	}
	return out, nil
}

// count is how many memories namespace ns of the store at path holds.
func count(t *testing.T, path, ns string) int {
	t.Helper()
	s, err := OpenSQLite(path, SQLiteOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	st, _ := s.Namespace(ns)
	n, err := st.Count(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// corpus is n memories over a few namespaces, in insertion order, with
// contents of about clen characters (each unique), metadata and types.
type stored struct {
	ns string
	e  Entry
}

func corpus(n, clen int, seed uint64) []stored {
	r := rand.New(rand.NewPCG(seed, 9))
	words := strings.Fields("the velden bridge crosses river asca marla quenby born oslo capital norway cat tabby grey likes tea at five")
	out := make([]stored, n)
	t0 := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	for i := range out {
		var b strings.Builder
		fmt.Fprintf(&b, "memory %d:", i)
		for b.Len() < clen {
			b.WriteString(" " + words[r.IntN(len(words))])
		}
		content := b.String()
		md := map[string]any{"i": float64(i), "topic": words[r.IntN(len(words))]}
		if i%7 == 0 {
			md = nil
		}
		out[i] = stored{ns: fmt.Sprintf("tenant%d", i%3), e: Entry{ID: formatID(uint32(i + 1)), Content: content, Embedding: enc384.One(content),
			Metadata: md, MemoryType: []string{"", "fact", "preference"}[i%3], Created: t0.Add(time.Duration(i) * time.Second), Updated: t0.Add(time.Duration(i) * time.Minute)}}
	}
	return out
}

// oldStore writes ms into a new store in schema 1's layout (WITHOUT ROWID,
// SQLite's default 4 KiB pages), as the previous build wrote stores, and
// closes it cleanly.
func oldStore(t testing.TB, path string, ms []stored) {
	t.Helper()
	db, err := sql.Open("sqlite", "file:"+path+"?_journal_mode=WAL")
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	db.SetMaxOpenConns(1)
	if _, err := db.Exec(migrations[0] + "; PRAGMA user_version = 1"); err != nil {
		t.Fatal(err)
	}
	tx, _ := db.Begin()
	seq := map[string]int{}
	for _, m := range ms {
		seq[m.ns]++
		md, _ := json.Marshal(orEmpty(m.e.Metadata))
		if _, err := tx.Exec(`INSERT INTO memories (namespace, id, content, embedding, metadata, memory_type, created, updated, seq) VALUES (?,?,?,?,?,?,?,?,?)`,
			m.ns, m.e.ID, m.e.Content, encodeVec(m.e.Embedding), string(md), m.e.MemoryType, m.e.Created.UnixNano(), m.e.Updated.UnixNano(), seq[m.ns]); err != nil {
			t.Fatal(err)
		}
		tx.Exec(`INSERT INTO namespaces VALUES (?, 1) ON CONFLICT(namespace) DO UPDATE SET version = version + 1`, m.ns)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
}

// newStore writes ms into a new store of the current layout.
func newStore(t testing.TB, path string, ms []stored) {
	t.Helper()
	s, err := OpenSQLite(path, SQLiteOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	byNS := map[string][]Entry{}
	var order []string
	for _, m := range ms {
		if byNS[m.ns] == nil {
			order = append(order, m.ns)
		}
		byNS[m.ns] = append(byNS[m.ns], m.e)
	}
	for _, ns := range order {
		if _, _, err := s.Import(context.Background(), ns, byNS[ns]); err != nil {
			t.Fatal(err)
		}
	}
}

func fileSize(t testing.TB, path string) int64 {
	st, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	return st.Size()
}

func sameEntry(a, b Entry) bool {
	if a.ID != b.ID || a.Content != b.Content || a.MemoryType != b.MemoryType || !a.Created.Equal(b.Created) || !a.Updated.Equal(b.Updated) ||
		len(a.Metadata) != len(b.Metadata) || (len(a.Metadata) > 0 && !reflect.DeepEqual(a.Metadata, b.Metadata)) {
		return false
	}
	return slices.Equal(decodeVec(encodeVec(a.Embedding)), b.Embedding)
}

// A store in schema 1's layout is migrated when it opens: every memory
// comes back the same (id, content, embedding to the bit, metadata, type,
// timestamps) and in the same order, including ones whose content
// overflows a page in either layout, and the file shrinks to the new
// layout's size with the new page size.
func TestMigrationKeepsEveryMemory(t *testing.T) {
	ms := corpus(3000, 120, 1)
	ms[10].e.Content = strings.Repeat("a long memory, ", 3000) // 45 KB: overflows in both layouts
	ms[10].e.Embedding = enc384.One(ms[10].e.Content)
	ms[11].e.Content = "ünïcødé 記憶 🧠"
	ms[11].e.Embedding = enc384.One(ms[11].e.Content)
	ms[12].e.Metadata = map[string]any{"a": map[string]any{"b": []any{1.0, "x", map[string]any{"c": true}}}}
	path := filepath.Join(t.TempDir(), "old.db")
	oldStore(t, path, ms)
	before := fileSize(t, path)
	s, err := OpenSQLite(path, SQLiteOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var v, ps int
	s.db.QueryRow("PRAGMA user_version").Scan(&v)
	s.db.QueryRow("PRAGMA page_size").Scan(&ps)
	if v != SchemaVersion || ps != pageSize {
		t.Fatalf("after opening: schema %d, page size %d", v, ps)
	}
	ctx := context.Background()
	for _, ns := range []string{"tenant0", "tenant1", "tenant2"} {
		st, _ := s.Namespace(ns)
		got, err := st.List(ctx)
		if err != nil {
			t.Fatal(err)
		}
		var want []Entry
		for _, m := range ms {
			if m.ns == ns {
				want = append(want, m.e)
			}
		}
		if len(got) != len(want) {
			t.Fatalf("%s: %d memories after the migration, %d before", ns, len(got), len(want))
		}
		for i := range want {
			if !sameEntry(want[i], got[i]) {
				t.Fatalf("%s, memory %d: %+v became %+v", ns, i, want[i], got[i])
			}
		}
	}
	// A write after the migration goes last, as it did before.
	st, _ := s.Namespace("tenant0")
	added, err := st.Add(ctx, Entry{Content: "after the migration", Embedding: enc384.One("after the migration")})
	if err != nil {
		t.Fatal(err)
	}
	all, _ := st.List(ctx)
	if all[len(all)-1].ID != added.ID {
		t.Fatal("a memory added after the migration is not listed last")
	}
	s.Close()
	after := fileSize(t, path)
	t.Logf("3000 memories: %.1f MB in schema 1 -> %.1f MB migrated (%.0f -> %.0f bytes a memory)",
		float64(before)/1e6, float64(after)/1e6, float64(before)/3000, float64(after)/3000)
	if after*2 > before {
		t.Fatalf("the migrated file is %d bytes, the old %d: the layout's space did not come back", after, before)
	}
}

// BenchmarkStorePerMemory measures a store's bytes a memory (embedding
// dimension 384) in the current layout, beside schema 1's layout
// measured in the same run and the bytes of the data itself.
//
//	go test -run '^$' -bench StorePerMemory -benchtime 1x ./memtools/ltm/
func BenchmarkStorePerMemory(b *testing.B) {
	const n = 25000
	for _, clen := range []int{9, 200} {
		b.Run(fmt.Sprintf("content=%d", clen), func(b *testing.B) {
			ms := corpus(n, clen, 2)
			var data int
			for _, m := range ms {
				md, _ := json.Marshal(orEmpty(m.e.Metadata))
				data += len(m.ns) + len(m.e.ID) + len(m.e.Content) + 4*len(m.e.Embedding) + len(md) + len(m.e.MemoryType) + 16
			}
			var cur, old int64
			for b.Loop() {
				dir := b.TempDir()
				oldStore(b, filepath.Join(dir, "old.db"), ms)
				newStore(b, filepath.Join(dir, "new.db"), ms)
				// The current layout's file once checkpointed (Close does).
				cur, old = fileSize(b, filepath.Join(dir, "new.db")), fileSize(b, filepath.Join(dir, "old.db"))
			}
			b.ReportMetric(float64(cur)/n, "B/memory")
			b.ReportMetric(float64(old)/n, "schema1-B/memory")
			b.ReportMetric(float64(data)/n, "data-B/memory")
			b.ReportMetric(float64(cur)/float64(data), "x-data")
			b.ReportMetric(float64(old)/float64(cur), "schema1/current")
		})
	}
}
