package ltm

import (
	"bufio"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/agemem/agemem/embed"
	"github.com/agemem/agemem/kernels"
	"github.com/agemem/agemem/kernels/cpu"
)

var enc = embed.NewHashing(64, []int{3})

func entry(content string, md map[string]any) Entry {
	return Entry{Content: content, Embedding: enc.One(content), Metadata: md, MemoryType: "fact"}
}

func TestStoreCRUDAndRetrieve(t *testing.T) {
	ctx := context.Background()
	stores(t, func(t *testing.T, s Store) {
		a, err := s.Add(ctx, entry("Marla Quenby was born in Oslo.", map[string]any{"type": "bio", "year": 1971}))
		if err != nil {
			t.Fatal(err)
		}
		if !ValidID(a.ID) {
			t.Fatalf("id %q is not mem_ + 8 hex", a.ID)
		}
		b, _ := s.Add(ctx, entry("The Velden Bridge crosses the river Asca.", map[string]any{"type": "place"}))
		c, _ := s.Add(ctx, entry("Oslo is the capital of Norway.", nil))
		if n, _ := s.Count(ctx); n != 3 {
			t.Fatalf("Count = %d", n)
		}
		hits, err := s.Retrieve(ctx, enc.One("Where was Marla Quenby born?"), 2, nil)
		if err != nil {
			t.Fatal(err)
		}
		if len(hits) != 2 || hits[0].ID != a.ID || hits[0].Score < hits[1].Score {
			t.Fatalf("retrieve order: %+v", hits)
		}
		// Metadata filter: exact match on every key; numbers compare as JSON.
		hits, _ = s.Retrieve(ctx, enc.One("Oslo"), 5, map[string]any{"type": "place"})
		if len(hits) != 1 || hits[0].ID != b.ID {
			t.Fatalf("filter type=place: %+v", hits)
		}
		hits, _ = s.Retrieve(ctx, enc.One("Oslo"), 5, map[string]any{"type": "bio", "year": 1971.0})
		if len(hits) != 1 || hits[0].ID != a.ID {
			t.Fatalf("filter type+year: %+v", hits)
		}
		hits, _ = s.Retrieve(ctx, enc.One("Oslo"), 5, map[string]any{"memory_type": "fact"})
		if len(hits) != 3 {
			t.Fatalf("filter memory_type: %d hits", len(hits))
		}
		hits, _ = s.Retrieve(ctx, enc.One("Oslo"), 5, map[string]any{"type": "nope"})
		if len(hits) != 0 {
			t.Fatalf("filter with no match: %+v", hits)
		}
		// Update keeps metadata when none is given, and re-embeds.
		u, err := s.Update(ctx, a.ID, "Marla Quenby was born in Bergen.", enc.One("Marla Quenby was born in Bergen."), nil)
		if err != nil {
			t.Fatal(err)
		}
		if u.Metadata["type"] != "bio" || u.Content != "Marla Quenby was born in Bergen." {
			t.Fatalf("update: %+v", u)
		}
		g, _ := s.Get(ctx, a.ID)
		if g.Content != u.Content || g.Updated.Before(g.Created) {
			t.Fatalf("get after update: %+v", g)
		}
		hits, _ = s.Retrieve(ctx, enc.One("born in Bergen"), 1, nil)
		if hits[0].ID != a.ID {
			t.Fatal("retrieval does not see the updated embedding")
		}
		if err := s.Delete(ctx, c.ID); err != nil {
			t.Fatal(err)
		}
		if _, err := s.Get(ctx, c.ID); !errors.Is(err, ErrNotFound) {
			t.Fatalf("get deleted: %v", err)
		}
		if err := s.Delete(ctx, c.ID); !errors.Is(err, ErrNotFound) {
			t.Fatalf("delete twice: %v", err)
		}
		if _, err := s.Update(ctx, "mem_00000000", "x", enc.One("x"), nil); !errors.Is(err, ErrNotFound) {
			t.Fatalf("update missing: %v", err)
		}
		list, _ := s.List(ctx)
		if len(list) != 2 || list[0].ID != a.ID || list[1].ID != b.ID {
			t.Fatalf("list order: %v", list)
		}
		// Bad input leaves the store as it was.
		if _, err := s.Add(ctx, Entry{Content: "x", Embedding: []float32{1, 2}}); err == nil {
			t.Error("add with a wrong dimension must fail")
		}
		if _, err := s.Add(ctx, Entry{Content: "x"}); err == nil {
			t.Error("add without embedding must fail")
		}
		if _, err := s.Retrieve(ctx, []float32{1}, 3, nil); err == nil {
			t.Error("retrieve with a wrong dimension must fail")
		}
		if n, _ := s.Count(ctx); n != 2 {
			t.Fatalf("failed writes changed the store: Count = %d", n)
		}
	})
}

func TestSQLiteNamespacesAreIsolated(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "m.db")
	db, err := OpenSQLite(path, SQLiteOptions{})
	if err != nil {
		t.Fatal(err)
	}
	alice, _ := db.Namespace("alice")
	bob, _ := db.Namespace("bob")
	a, _ := alice.Add(ctx, entry("alice's secret is 42", nil))
	if _, err := bob.Get(ctx, a.ID); !errors.Is(err, ErrNotFound) {
		t.Fatalf("bob reads alice's entry: %v", err)
	}
	if err := bob.Delete(ctx, a.ID); !errors.Is(err, ErrNotFound) {
		t.Fatalf("bob deletes alice's entry: %v", err)
	}
	if _, err := bob.Update(ctx, a.ID, "x", enc.One("x"), nil); !errors.Is(err, ErrNotFound) {
		t.Fatalf("bob updates alice's entry: %v", err)
	}
	if hits, _ := bob.Retrieve(ctx, enc.One("secret"), 5, nil); len(hits) != 0 {
		t.Fatal("bob retrieves alice's entry")
	}
	if n, _ := bob.Count(ctx); n != 0 {
		t.Fatal("bob counts alice's entry")
	}
	// A second handle (another process, say) writes; the first handle's
	// cached index must notice.
	if hits, _ := alice.Retrieve(ctx, enc.One("secret"), 5, nil); len(hits) != 1 {
		t.Fatalf("before: %d hits", len(hits))
	}
	db2, err := OpenSQLite(path, SQLiteOptions{})
	if err != nil {
		t.Fatal(err)
	}
	alice2, _ := db2.Namespace("alice")
	b, _ := alice2.Add(ctx, entry("alice's second secret is 7", nil))
	db2.Close()
	if hits, _ := alice.Retrieve(ctx, enc.One("second secret"), 5, nil); len(hits) != 2 || hits[0].ID != b.ID {
		t.Fatalf("write from another handle not seen: %+v", hits)
	}
	names, _ := db.Namespaces(ctx)
	if strings.Join(names, ",") != "alice" {
		t.Fatalf("namespaces: %v", names)
	}
	if _, err := db.Namespace(""); err == nil {
		t.Error("empty namespace must be refused")
	}
	db.Close()
	// Reopening finds the entry again.
	db, err = OpenSQLite(path, SQLiteOptions{SyncFull: true})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	alice, _ = db.Namespace("alice")
	if g, err := alice.Get(ctx, a.ID); err != nil || g.Content != a.Content {
		t.Fatalf("after reopen: %v %+v", err, g)
	}
}

func TestSQLiteRejectsBadFiles(t *testing.T) {
	dir := t.TempDir()
	garbage := filepath.Join(dir, "garbage.db")
	os.WriteFile(garbage, []byte(strings.Repeat("not a database ", 100)), 0o644)
	if _, err := OpenSQLite(garbage, SQLiteOptions{}); err == nil || !strings.Contains(err.Error(), garbage) {
		t.Fatalf("garbage file: %v", err)
	}
	future := filepath.Join(dir, "future.db")
	db, err := OpenSQLite(future, SQLiteOptions{})
	if err != nil {
		t.Fatal(err)
	}
	db.db.Exec(fmt.Sprintf("PRAGMA user_version = %d", SchemaVersion+1))
	db.Close()
	if _, err := OpenSQLite(future, SQLiteOptions{}); err == nil || !strings.Contains(err.Error(), "newer") {
		t.Fatalf("future schema: %v", err)
	}
}

// TestSQLiteSurvivesKill9 starts a child process that adds entries and
// prints each id after Add returns; the parent kills it with SIGKILL
// mid-stream and checks that every acknowledged id is in the reopened file.
func TestSQLiteSurvivesKill9(t *testing.T) {
	if path := os.Getenv("AGEMEM_LTM_CHILD"); path != "" {
		db, err := OpenSQLite(path, SQLiteOptions{})
		if err != nil {
			fmt.Println("ERR", err)
			os.Exit(1)
		}
		ns, _ := db.Namespace("crash")
		for i := 0; ; i++ {
			e, err := ns.Add(context.Background(), entry(fmt.Sprintf("fact number %d", i), map[string]any{"i": i}))
			if err != nil {
				fmt.Println("ERR", err)
				os.Exit(1)
			}
			fmt.Println(e.ID)
		}
	}
	path := filepath.Join(t.TempDir(), "crash.db")
	cmd := exec.Command(os.Args[0], "-test.run=^TestSQLiteSurvivesKill9$")
	cmd.Env = append(os.Environ(), "AGEMEM_LTM_CHILD="+path)
	out, _ := cmd.StdoutPipe()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var acked []string
	sc := bufio.NewScanner(out)
	deadline := time.Now().Add(20 * time.Second)
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, "ERR") {
			t.Fatal(line)
		}
		if ValidID(line) {
			acked = append(acked, line)
		}
		if len(acked) >= 200 || time.Now().After(deadline) {
			break
		}
	}
	cmd.Process.Signal(syscall.SIGKILL)
	cmd.Wait()
	if len(acked) < 10 {
		t.Fatalf("child acknowledged only %d entries", len(acked))
	}
	db, err := OpenSQLite(path, SQLiteOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	ns, _ := db.Namespace("crash")
	for _, id := range acked {
		if _, err := ns.Get(context.Background(), id); err != nil {
			t.Fatalf("acknowledged entry %s lost after kill -9: %v", id, err)
		}
	}
	t.Logf("%d acknowledged entries all survived SIGKILL", len(acked))
}

func BenchmarkSQLiteAdd(b *testing.B) {
	db, _ := OpenSQLite(filepath.Join(b.TempDir(), "b.db"), SQLiteOptions{})
	defer db.Close()
	ns, _ := db.Namespace("bench")
	e := entry("a memory about the Velden Bridge and the river Asca", nil)
	e.Embedding = embed.NewHashing(384, []int{3}).One(e.Content)
	for b.Loop() {
		if _, err := ns.Add(context.Background(), e); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "adds/s")
}

// BenchmarkSQLiteRetrieve retrieves top-3 from a namespace of 1,000 entries
// of dimension 384, a large personal memory.
func BenchmarkSQLiteRetrieve(b *testing.B) {
	db, _ := OpenSQLite(filepath.Join(b.TempDir(), "b.db"), SQLiteOptions{})
	defer db.Close()
	ns, _ := db.Namespace("bench")
	h := embed.NewHashing(384, []int{3})
	for i := range 1000 {
		c := fmt.Sprintf("memory %d about topic %d", i, i%37)
		ns.Add(context.Background(), Entry{Content: c, Embedding: h.One(c)})
	}
	q := h.One("topic 5")
	for b.Loop() {
		if _, err := ns.Retrieve(context.Background(), q, 3, nil); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "retrieves/s")
}

// BenchmarkNewMemory is the cost of a rollout's fresh LTM with one entry.
func BenchmarkNewMemory(b *testing.B) {
	e := entry("a fact", nil)
	for b.Loop() {
		m := NewMemStore(1)
		m.Add(context.Background(), e)
	}
}

// Concurrent writers on one file (the server's requests) all succeed:
// none fails with "database is locked".
func TestSQLiteConcurrentWriters(t *testing.T) {
	s, err := OpenSQLite(filepath.Join(t.TempDir(), "m.db"), SQLiteOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	var wg sync.WaitGroup
	errs := make(chan error, 64*5)
	for g := range 64 {
		wg.Go(func() {
			ns, _ := s.Namespace(fmt.Sprintf("user%d", g%4))
			for i := range 5 {
				e, err := ns.Add(context.Background(), Entry{Content: fmt.Sprint("fact ", g, i), Embedding: []float32{1, float32(i), float32(g)}})
				if err == nil {
					_, err = ns.Update(context.Background(), e.ID, "updated", []float32{float32(i), 1, 0}, nil)
				}
				if err != nil {
					errs <- err
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	ns, _ := s.Namespace("user0")
	if n, _ := ns.Count(context.Background()); n != 16*5 {
		t.Fatalf("user0 holds %d entries, want 80", n)
	}
}

// TestSQLiteLargeNamespaceOnDevice: a namespace that crosses
// embed.DeviceMinFloats asks SQLiteOptions.Device for a device once and
// retrieves through it the same memories, filters included, as a store
// scanning on the CPU.
func TestSQLiteLargeNamespaceOnDevice(t *testing.T) {
	ctx := context.Background()
	asked := 0
	devEnc := embed.NewHashing(1024, []int{3})
	open := func(opt SQLiteOptions) Store {
		db, err := OpenSQLite(filepath.Join(t.TempDir(), "m.db"), opt)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { db.Close() })
		ns, _ := db.Namespace("big")
		return ns
	}
	onDev := open(SQLiteOptions{Device: func() kernels.TopKer { asked++; return cpu.New() }})
	onCPU := open(SQLiteOptions{})
	rows := embed.DeviceMinFloats / 1024
	for i := range rows {
		text := fmt.Sprintf("fact %d about city %d and river %d", i, i%37, i%11)
		for _, s := range []Store{onDev, onCPU} {
			if _, err := s.Add(ctx, Entry{Content: text, Embedding: devEnc.One(text), Metadata: map[string]any{"odd": i%2 == 1}}); err != nil {
				t.Fatal(err)
			}
		}
	}
	q := devEnc.One("city 5 and river 3")
	for _, filter := range []map[string]any{nil, {"odd": true}} {
		got, err := onDev.Retrieve(ctx, q, 5, filter)
		if err != nil {
			t.Fatal(err)
		}
		want, _ := onCPU.Retrieve(ctx, q, 5, filter)
		for i := range want {
			if got[i].Content != want[i].Content {
				t.Fatalf("filter %v hit %d: %q on the device, %q scanned", filter, i, got[i].Content, want[i].Content)
			}
		}
	}
	if asked != 1 {
		t.Fatalf("the device was asked for %d times, want once", asked)
	}
}

// TestWriterGoneFreesTheWriteSlot: a writer whose context ends while it
// holds the write slot (a client hanging up mid-request) must free it,
// including when database/sql has already rolled the transaction back on
// its own; otherwise every later write waits forever.
func TestWriterGoneFreesTheWriteSlot(t *testing.T) {
	s, err := OpenSQLite(filepath.Join(t.TempDir(), "m.db"), SQLiteOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	// The deterministic case: the context ends, database/sql rolls back,
	// then the writer's deferred Rollback sees ErrTxDone.
	ctx, cancel := context.WithCancel(context.Background())
	tx, err := s.begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	cancel()
	for deadline := time.Now().Add(5 * time.Second); ; {
		if _, err := tx.ExecContext(context.Background(), "SELECT 1"); errors.Is(err, sql.ErrTxDone) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("database/sql did not roll back the cancelled transaction")
		}
		time.Sleep(time.Millisecond)
	}
	tx.Rollback()
	// Writers cut off at random moments, then one with time to spare.
	ns, _ := s.Namespace("u")
	for i := range 300 {
		ctx, cancel := context.WithTimeout(context.Background(), time.Duration(i%50)*10*time.Microsecond)
		ns.Add(ctx, Entry{Content: fmt.Sprint("fact ", i), Embedding: []float32{1, float32(i)}})
		cancel()
	}
	ctx, cancel = context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := ns.Add(ctx, Entry{Content: "after", Embedding: []float32{1, 2}}); err != nil {
		t.Fatalf("a write after writers that hung up: %v (the write slot was never freed)", err)
	}
}

// Metadata nested deeper or larger than the limits is refused at the
// store, with ErrMetadata, by every write and by a search filter; within
// them it is stored as given.
func TestMetadataLimits(t *testing.T) {
	ctx := context.Background()
	db, err := OpenSQLite(filepath.Join(t.TempDir(), "m.db"), SQLiteOptions{Metadata: MetadataLimits{MaxBytes: 1024, MaxDepth: 4}})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	ns, _ := db.Namespace("alice")
	nest := func(n int) map[string]any {
		var v any = "leaf"
		for range n - 1 {
			v = map[string]any{"a": v}
		}
		return map[string]any{"a": v}
	}
	if _, err := ns.Add(ctx, entry("deep enough", nest(4))); err != nil {
		t.Fatalf("depth 4 of 4: %v", err)
	}
	for name, md := range map[string]map[string]any{
		"depth 5":    nest(5),
		"depth 5000": nest(5000),
		"2 KiB":      {"x": strings.Repeat("y", 2048)},
		"array deep": {"a": []any{[]any{[]any{[]any{1.0}}}}},
	} {
		if _, err := ns.Add(ctx, entry("too much", md)); !errors.Is(err, ErrMetadata) {
			t.Errorf("%s: add: %v", name, err)
		}
		if _, _, err := db.Import(ctx, "alice", []Entry{entry("too much", md)}); !errors.Is(err, ErrMetadata) {
			t.Errorf("%s: import: %v", name, err)
		}
		if _, err := ns.Retrieve(ctx, enc.One("x"), 3, md); !errors.Is(err, ErrMetadata) {
			t.Errorf("%s: filter: %v", name, err)
		}
	}
	if n, _ := ns.Count(ctx); n != 1 {
		t.Fatalf("%d memories stored, want the one within the limits", n)
	}
}
