package ltm

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// latent makes vectors as embeddings of texts on a few topics lie: near
// a 16-dimensional subspace (random vectors of the full dimension, which
// no embedder makes, are the case no approximate index does well on),
// around topic centres. Seeded: the same arguments, the same vectors.
type latent struct {
	dim     int
	w       []float32 // [dim][16]
	centres [][16]float64
}

func newLatent(dim, topics int) *latent {
	r := rand.New(rand.NewPCG(99, uint64(dim)))
	l := &latent{dim: dim, w: make([]float32, dim*16), centres: make([][16]float64, topics)}
	for i := range l.w {
		l.w[i] = float32(r.NormFloat64())
	}
	for i := range l.centres {
		for j := range 16 {
			l.centres[i][j] = r.NormFloat64()
		}
	}
	return l
}

// vec draws one vector of topic t.
func (l *latent) vec(r *rand.Rand, t int) []float32 {
	var z [16]float64
	for j := range z {
		z[j] = l.centres[t][j] + 0.5*r.NormFloat64()
	}
	v := make([]float32, l.dim)
	for d := range v {
		var s float64
		for j := range z {
			s += float64(l.w[d*16+j]) * z[j]
		}
		v[d] = float32(s + 0.2*r.NormFloat64())
	}
	return v
}

// clustered is n vectors on 20 topics.
func clustered(seed uint64, n, dim int) [][]float32 {
	l := newLatent(dim, 20)
	r := rand.New(rand.NewPCG(seed, 1))
	out := make([][]float32, n)
	for i := range out {
		out[i] = l.vec(r, r.IntN(20))
	}
	return out
}

func fillNS(t *testing.T, db DB, ns string, vs [][]float32) {
	t.Helper()
	es := make([]Entry, len(vs))
	for i, v := range vs {
		es[i] = Entry{Content: fmt.Sprintf("%s memory %d", ns, i), Embedding: v, Metadata: map[string]any{"g": i % 4}}
	}
	if _, _, err := db.Import(context.Background(), ns, es); err != nil {
		t.Fatal(err)
	}
}

// plan is EXPLAIN of the query Retrieve would run.
func plan(t *testing.T, p *Postgres, ns string, q []float32, filter map[string]any) (string, string) {
	t.Helper()
	ctx := context.Background()
	n := &pgNS{p: p, ns: ns}
	sql, args, hnsw, err := n.retrieveSQL(ctx, q, 10, filter)
	if err != nil {
		t.Fatal(err)
	}
	var lines []string
	err = p.search(ctx, hnsw, "EXPLAIN "+sql, args, func(rows pgx.Rows) error {
		lines, err = pgx.CollectRows(rows, pgx.RowTo[string])
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return sql, strings.Join(lines, "\n")
}

func recall(got, want []Scored) float64 {
	ids := map[string]bool{}
	for _, w := range want {
		ids[w.ID] = true
	}
	hit := 0
	for _, g := range got {
		if ids[g.ID] {
			hit++
		}
	}
	return float64(hit) / float64(len(want))
}

// TestPostgresHNSW: a namespace from min_rows on is searched through its
// own HNSW index (the plan says so) with high recall, its filter kept
// exactly; a smaller one beside it is still searched exactly, and a large
// one whose name needs quoting gets an index of its own.
func TestPostgresHNSW(t *testing.T) {
	ctx := context.Background()
	const dim = 64
	p := openPG(t, PostgresOptions{HNSW: HNSW{MinRows: 1000, M: 16, EfConstruction: 64, EfSearch: 100}})
	fillNS(t, p, "big", clustered(1, 3000, dim))
	fillNS(t, p, "small", clustered(2, 300, dim))
	odd := `o'brien $ns$ "x"`
	fillNS(t, p, odd, clustered(7, 1200, dim))
	if err := p.BuildIndex(ctx, "big", dim); err != nil {
		t.Fatal(err)
	}
	if err := p.BuildIndex(ctx, odd, dim); err != nil {
		t.Fatal(err)
	}
	if _, ex := plan(t, p, odd, clustered(8, 1, dim)[0], nil); !strings.Contains(ex, hnswName(odd, dim)) {
		t.Fatalf("the namespace %q does not use its index:\n%s", odd, ex)
	}
	big, _ := p.Namespace("big")
	small, _ := p.Namespace("small")
	bigAll, _ := big.List(ctx)
	smallAll, _ := small.List(ctx)
	queries := clustered(3, 40, dim)
	if _, ex := plan(t, p, "big", queries[0], nil); !strings.Contains(ex, hnswName("big", dim)) {
		t.Fatalf("the large namespace's query does not use the HNSW index:\n%s", ex)
	}
	if sql, ex := plan(t, p, "small", queries[0], nil); strings.Contains(ex, "hnsw") || strings.Contains(sql, "vector(64)") {
		t.Fatalf("the small namespace's query uses the HNSW index:\n%s", ex)
	}
	var sum, sumF float64
	for _, q := range queries {
		got, err := big.Retrieve(ctx, q, 10, nil)
		if err != nil {
			t.Fatal(err)
		}
		sum += recall(got, bruteForce(bigAll, q, 10, nil))
		f := map[string]any{"g": 2}
		got, err = big.Retrieve(ctx, q, 10, f)
		if err != nil {
			t.Fatal(err)
		}
		if len(got) != 10 {
			t.Fatalf("filtered HNSW search returned %d of 10 (the iterative scan stops short)", len(got))
		}
		for _, g := range got {
			if g.Metadata["g"] != 2.0 {
				t.Fatalf("filtered HNSW search returned %v", g.Metadata)
			}
		}
		sumF += recall(got, bruteForce(bigAll, q, 10, f))
		want := bruteForce(smallAll, q, 10, nil)
		got, _ = small.Retrieve(ctx, q, 10, nil)
		for i := range want {
			if got[i].ID != want[i].ID || got[i].Score != want[i].Score {
				t.Fatalf("the small namespace is not searched exactly: hit %d %s, want %s", i, got[i].ID, want[i].ID)
			}
		}
	}
	r, rf := sum/float64(len(queries)), sumF/float64(len(queries))
	t.Logf("HNSW recall@10: %.3f, filtered to a quarter: %.3f", r, rf)
	if r < 0.95 || rf < 0.95 {
		t.Fatalf("HNSW recall@10 %.3f, filtered %.3f: want at least 0.95", r, rf)
	}
	for name, want := range map[string]string{"hnsw.ef_search": "100", "hnsw.iterative_scan": "relaxed_order"} {
		var got string
		if err := p.pool.QueryRow(ctx, "SELECT current_setting($1)", name).Scan(&got); err != nil || got != want {
			t.Fatalf("%s = %q (%v), want %q", name, got, err, want)
		}
	}
}

// TestPostgresHNSWBuildsItself: the first search of a namespace past
// min_rows starts the index build in the background and is answered
// exactly meanwhile; once the index is valid, searches use it.
func TestPostgresHNSWBuildsItself(t *testing.T) {
	ctx := context.Background()
	const dim = 32
	p := openPG(t, PostgresOptions{HNSW: HNSW{MinRows: 500, M: 8, EfConstruction: 32, EfSearch: 64, BuildMemory: "64MB"}})
	fillNS(t, p, "big", clustered(4, 800, dim))
	ns, _ := p.Namespace("big")
	all, _ := ns.List(ctx)
	q := clustered(5, 1, dim)[0]
	got, err := ns.Retrieve(ctx, q, 5, nil)
	if err != nil {
		t.Fatal(err)
	}
	if want := bruteForce(all, q, 5, nil); recall(got, want) != 1 {
		t.Fatalf("the search while the index builds is not exact: %v, want %v", got, want)
	}
	deadline := time.Now().Add(60 * time.Second)
	for {
		if ok, _ := p.indexValid(ctx, "big", dim); ok {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the index was not built within 60 s")
		}
		time.Sleep(100 * time.Millisecond)
	}
	p.builds.Wait()
	if _, ex := plan(t, p, "big", q, nil); !strings.Contains(ex, hnswName("big", dim)) {
		t.Fatalf("after the build the search does not use the index:\n%s", ex)
	}
}

// TestPostgresHalfvecIndex: past 2,000 dimensions the index is halfvec's.
func TestPostgresHalfvecIndex(t *testing.T) {
	ctx := context.Background()
	const dim = 2100
	p := openPG(t, PostgresOptions{HNSW: HNSW{MinRows: 100, M: 8, EfConstruction: 32, EfSearch: 64}})
	vs := clustered(6, 300, dim)
	fillNS(t, p, "wide", vs)
	if err := p.BuildIndex(ctx, "wide", dim); err != nil {
		t.Fatal(err)
	}
	sql, ex := plan(t, p, "wide", vs[17], nil)
	if !strings.Contains(ex, hnswName("wide", dim)) || !strings.Contains(sql, "halfvec(2100)") {
		t.Fatalf("the 2,100-dimension query does not use a halfvec index:\n%s\n%s", sql, ex)
	}
	ns, _ := p.Namespace("wide")
	got, err := ns.Retrieve(ctx, vs[17], 1, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 1 || got[0].Content != "wide memory 17" {
		t.Fatalf("a stored vector's nearest: %+v", got)
	}
}
