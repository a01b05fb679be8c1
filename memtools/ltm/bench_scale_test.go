package ltm

// BenchmarkStoresAtScale: search latency (p50, p99) and queries per second
// of SQLite's exact scan (the anchor), PostgreSQL's exact scan and
// PostgreSQL as configured by default (a namespace from memory.hnsw.min_rows
// on through its own HNSW index, with its recall@10 against exact), with
// many small namespaces and with one large one, then write throughput of
// 32 writers on each store. One run prints the whole table.
//
// Sizes come from the environment; the defaults are a quick run. The full
// run of the issue (1M memories over 10k namespaces, one namespace of
// 200k, dimension 384):
//
//	AGEMEM_BENCH_ROWS=1000000 AGEMEM_BENCH_NAMESPACES=10000 AGEMEM_BENCH_BIG=200000 \
//	  go test -run '^$' -bench StoresAtScale -benchtime 1x -timeout 3h ./memtools/ltm/
//
// AGEMEM_BENCH_DIR keeps the SQLite file and AGEMEM_BENCH_KEEP=1 the
// PostgreSQL schema between runs (a later run of the same sizes reuses
// them instead of loading again).

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/agemem/agemem/internal/pgtest"
)

func envInt(name string, def int) int {
	if v, err := strconv.Atoi(os.Getenv(name)); err == nil && v > 0 {
		return v
	}
	return def
}

type benchSizes struct {
	rows, namespaces, big, dim, queries, clients, writers, writes, topics int
}

func (s benchSizes) nsName(j int) string { return fmt.Sprintf("user%06d", j) }

// load writes the data set into db, namespace by namespace: the same
// memories for every store (seeded per namespace).
func (s benchSizes) load(b *testing.B, db DB, l *latent, what string) {
	ctx := context.Background()
	start := time.Now()
	put := func(ns string, seed uint64, n int) {
		r := rand.New(rand.NewPCG(seed, 7))
		home := r.IntN(s.topics) // a user's memories lean to a few topics
		for lo := 0; lo < n; lo += 2000 {
			es := make([]Entry, 0, min(2000, n-lo))
			for i := lo; i < lo+cap(es); i++ {
				t := home
				if r.IntN(2) == 0 {
					t = r.IntN(s.topics)
				}
				es = append(es, Entry{ID: formatID(uint32(i)), Content: fmt.Sprintf("%s memory %d on topic %d", ns, i, t),
					Embedding: l.vec(r, t), Metadata: map[string]any{"i": i % 10}, MemoryType: "fact"})
			}
			if _, _, err := db.Import(ctx, ns, es); err != nil {
				b.Fatal(err)
			}
		}
	}
	per := s.rows / s.namespaces
	for j := range s.namespaces {
		put(s.nsName(j), uint64(j), per)
		if j%1000 == 999 {
			b.Logf("%s: %d of %d namespaces loaded (%.0f s)", what, j+1, s.namespaces, time.Since(start).Seconds())
		}
	}
	put("big", 1<<40, s.big)
	b.Logf("%s: loaded %d memories in %.0f s", what, s.rows+s.big, time.Since(start).Seconds())
}

// holds reports whether db already holds the data set (a kept store).
func (s benchSizes) holds(db DB) bool {
	ctx := context.Background()
	for _, ns := range []string{"big", s.nsName(s.namespaces - 1)} {
		st, _ := db.Namespace(ns)
		n, err := st.Count(ctx)
		if err != nil || (ns == "big" && n != s.big) || (ns != "big" && n != s.rows/s.namespaces) {
			return false
		}
	}
	return true
}

type benchQuery struct {
	ns string
	q  []float32
}

type searchRun struct {
	lat  []time.Duration
	wall time.Duration
	hits [][]Scored
}

func (r searchRun) pct(p float64) time.Duration {
	s := slices.Clone(r.lat)
	slices.Sort(s)
	return s[min(len(s)-1, int(p*float64(len(s))))]
}

func (r searchRun) qps() float64 { return float64(len(r.lat)) / r.wall.Seconds() }

// search runs every query once to warm the store (SQLite's namespace
// caches, PostgreSQL's buffers), then again from clients goroutines,
// timed.
func search(b *testing.B, db DB, qs []benchQuery, clients int) searchRun {
	ctx := context.Background()
	one := func(q benchQuery) []Scored {
		st, _ := db.Namespace(q.ns)
		hits, err := st.Retrieve(ctx, q.q, 10, nil)
		if err != nil {
			b.Fatal(err)
		}
		return hits
	}
	for _, q := range qs {
		one(q)
	}
	run := searchRun{lat: make([]time.Duration, len(qs)), hits: make([][]Scored, len(qs))}
	var next sync.Mutex
	i := 0
	start := time.Now()
	var wg sync.WaitGroup
	for range clients {
		wg.Go(func() {
			for {
				next.Lock()
				k := i
				i++
				next.Unlock()
				if k >= len(qs) {
					return
				}
				t := time.Now()
				run.hits[k] = one(qs[k])
				run.lat[k] = time.Since(t)
			}
		})
	}
	wg.Wait()
	run.wall = time.Since(start)
	return run
}

// writeRun is writers goroutines each adding writes new memories to a
// namespace of its own.
func writeRun(b *testing.B, db DB, l *latent, s benchSizes, tag string) searchRun {
	ctx := context.Background()
	run := searchRun{lat: make([]time.Duration, s.writers*s.writes)}
	start := time.Now()
	var wg sync.WaitGroup
	for w := range s.writers {
		wg.Go(func() {
			st, _ := db.Namespace(fmt.Sprintf("writer-%s-%d", tag, w))
			r := rand.New(rand.NewPCG(uint64(w), 11))
			for i := range s.writes {
				e := Entry{Content: fmt.Sprintf("%s writer %d memory %d", tag, w, i), Embedding: l.vec(r, r.IntN(s.topics))}
				t := time.Now()
				if _, err := st.Add(ctx, e); err != nil {
					b.Error(err)
					return
				}
				run.lat[w*s.writes+i] = time.Since(t)
			}
		})
	}
	wg.Wait()
	run.wall = time.Since(start)
	return run
}

func BenchmarkStoresAtScale(b *testing.B) {
	s := benchSizes{
		rows: envInt("AGEMEM_BENCH_ROWS", 20000), namespaces: envInt("AGEMEM_BENCH_NAMESPACES", 200),
		big: envInt("AGEMEM_BENCH_BIG", 20000), dim: envInt("AGEMEM_BENCH_DIM", 384),
		queries: envInt("AGEMEM_BENCH_QUERIES", 200), clients: envInt("AGEMEM_BENCH_CLIENTS", 4),
		writers: envInt("AGEMEM_BENCH_WRITERS", 32), writes: envInt("AGEMEM_BENCH_WRITES", 50), topics: 500,
	}
	ctx := context.Background()
	base := pgtest.DSN(b)
	l := newLatent(s.dim, s.topics)
	tag := fmt.Sprintf("%d_%d_%d_%d", s.rows, s.namespaces, s.big, s.dim)

	dir := os.Getenv("AGEMEM_BENCH_DIR")
	if dir == "" {
		dir = b.TempDir()
	}
	sq, err := OpenSQLite(filepath.Join(dir, "bench-"+tag+".db"), SQLiteOptions{})
	if err != nil {
		b.Fatal(err)
	}
	defer sq.Close()

	schema := "agemem_bench_" + tag
	admin, err := pgx.Connect(ctx, base)
	if err != nil {
		b.Fatal(err)
	}
	defer admin.Close(ctx)
	if _, err := admin.Exec(ctx, "CREATE EXTENSION IF NOT EXISTS vector SCHEMA public; CREATE SCHEMA IF NOT EXISTS "+schema); err != nil {
		b.Fatal(err)
	}
	if os.Getenv("AGEMEM_BENCH_KEEP") != "1" {
		defer admin.Exec(context.WithoutCancel(ctx), "DROP SCHEMA "+schema+" CASCADE")
	}
	dsn := pgtest.WithParam(base, "search_path", schema+",public")
	hnsw := DefaultConfig().HNSW
	hnsw.BuildMemory = os.Getenv("AGEMEM_BENCH_BUILD_MEMORY")
	pgExact, err := OpenPostgres(ctx, PostgresOptions{DSN: dsn, MaxConns: 2 * s.clients, HNSW: HNSW{M: hnsw.M, EfConstruction: hnsw.EfConstruction, EfSearch: hnsw.EfSearch}})
	if err != nil {
		b.Fatal(err)
	}
	defer pgExact.Close()
	// The default config: HNSW from min_rows on, so for the large
	// namespace only.
	hnsw.MinRows = min(hnsw.MinRows, s.big)
	pgHNSW, err := OpenPostgres(ctx, PostgresOptions{DSN: dsn, MaxConns: 2 * s.clients, HNSW: hnsw})
	if err != nil {
		b.Fatal(err)
	}
	defer pgHNSW.Close()

	var wg sync.WaitGroup
	if !s.holds(sq) {
		wg.Go(func() { s.load(b, sq, l, "sqlite") })
	}
	if !s.holds(pgExact) {
		wg.Go(func() { s.load(b, pgExact, l, "postgres") })
	}
	wg.Wait()
	var build time.Duration
	if ok, _ := pgHNSW.indexValid(ctx, "big", s.dim); !ok {
		if _, err := pgHNSW.pool.Exec(ctx, "VACUUM ANALYZE agemem_memories"); err != nil {
			b.Fatal(err)
		}
		start := time.Now()
		if err := pgHNSW.BuildIndex(ctx, "big", s.dim); err != nil {
			b.Fatal(err)
		}
		build = time.Since(start)
	}

	r := rand.New(rand.NewPCG(5, 5))
	layouts := []struct {
		name string
		qs   []benchQuery
	}{
		{fmt.Sprintf("%d memories over %d namespaces", s.rows, s.namespaces), nil},
		{fmt.Sprintf("one namespace of %d", s.big), nil},
	}
	for i := range s.queries {
		layouts[0].qs = append(layouts[0].qs, benchQuery{s.nsName(r.IntN(s.namespaces)), l.vec(r, r.IntN(s.topics))})
		layouts[1].qs = append(layouts[1].qs, benchQuery{"big", l.vec(r, i%s.topics)})
	}
	var out strings.Builder
	fmt.Fprintf(&out, "\nsearch: top-10, dimension %d, %d queries from %d clients after a warm-up pass (GOMAXPROCS %d; load average %s)\n",
		s.dim, s.queries, s.clients, runtime.GOMAXPROCS(0), loadavg())
	if build > 0 {
		fmt.Fprintf(&out, "HNSW build (m %d, ef_construction %d) of the namespace of %d in a table of %d: %.0f s\n", hnsw.M, hnsw.EfConstruction, s.big, s.rows+s.big, build.Seconds())
	}
	fmt.Fprintf(&out, "%-40s %-32s %10s %10s %9s %9s %10s\n", "layout", "store", "p50", "p99", "q/s", "vs SQLite", "recall@10")
	for li, lay := range layouts {
		anchor := search(b, sq, lay.qs, s.clients)
		for si, st := range []struct {
			name string
			db   DB
		}{{"SQLite exact", sq}, {"PostgreSQL exact", pgExact}, {fmt.Sprintf("PostgreSQL, HNSW from %d", hnsw.MinRows), pgHNSW}} {
			run := anchor
			if st.db != DB(sq) {
				run = search(b, st.db, lay.qs, s.clients)
			}
			var rec float64
			for k := range lay.qs {
				rec += recall(run.hits[k], anchor.hits[k])
			}
			fmt.Fprintf(&out, "%-40s %-32s %10s %10s %9.1f %8.2fx %10.3f\n", lay.name, st.name, ms(run.pct(0.5)), ms(run.pct(0.99)),
				run.qps(), run.qps()/anchor.qps(), rec/float64(len(lay.qs)))
			b.ReportMetric(run.qps(), []string{"sqlite", "pg_exact", "pg_hnsw"}[si]+[]string{"_spread", "_one"}[li]+"_q/s")
		}
	}
	fmt.Fprintf(&out, "\nwrites: %d writers x %d adds, each writer its own namespace\n", s.writers, s.writes)
	fmt.Fprintf(&out, "%-44s %10s %10s %9s %9s\n", "store", "p50", "p99", "adds/s", "vs SQLite")
	runTag := fmt.Sprint(time.Now().UnixNano())
	wAnchor := writeRun(b, sq, l, s, "sqlite"+runTag)
	full, err := OpenSQLite(filepath.Join(dir, "bench-"+tag+".db"), SQLiteOptions{SyncFull: true})
	if err != nil {
		b.Fatal(err)
	}
	defer full.Close()
	for _, st := range []struct {
		name string
		run  searchRun
	}{
		{"SQLite (sync normal: survives kill -9)", wAnchor},
		{"SQLite (sync full: survives power loss)", writeRun(b, full, l, s, "full"+runTag)},
		{"PostgreSQL (synchronous_commit on)", writeRun(b, pgExact, l, s, "pg"+runTag)},
	} {
		fmt.Fprintf(&out, "%-44s %10s %10s %9.0f %8.2fx\n", st.name, ms(st.run.pct(0.5)), ms(st.run.pct(0.99)), st.run.qps(), st.run.qps()/wAnchor.qps())
	}
	fmt.Fprintf(&out, "load average at the end: %s\n", loadavg())
	b.Log(out.String())
	fmt.Print(out.String())
}

// loadavg is the machine's 1-minute load average: on a shared machine,
// the context the latencies were measured in.
func loadavg() string {
	raw, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "unknown"
	}
	return strings.Fields(string(raw))[0]
}

func ms(d time.Duration) string { return fmt.Sprintf("%.2f ms", float64(d.Microseconds())/1000) }
