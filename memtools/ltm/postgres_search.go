package ltm

// Retrieval: exact top-k within a namespace (a B-tree finds its rows,
// every one is scored: the pgvector README's advice for a selective
// filter), or, from HNSW.MinRows rows on, through an HNSW index with an
// iterative scan. Either way the candidates are scored again here exactly
// as the SQLite and in-memory stores score them (embed.Index), so the three
// return the same entries, scores and tie order.

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/pgvector/pgvector-go"

	"github.com/agemem/agemem/embed"
	"github.com/agemem/agemem/kernels/vec"
)

// rerankMargin is how many candidates past top_k the database returns:
// its float arithmetic may order two nearly equal scores differently from
// ours, and the relaxed iterative scan returns rows nearly in order.
const rerankMargin = 16

// sizeTTL is how long a namespace's size class (small, large) is trusted.
const sizeTTL = time.Minute

func (n *pgNS) Retrieve(ctx context.Context, query []float32, topK int, filter map[string]any) ([]Scored, error) {
	f, err := normalizeMetadata(filter)
	if err != nil {
		return nil, n.p.wrap("retrieve", n.ns, fmt.Errorf("filter: %w", err))
	}
	if topK <= 0 {
		return nil, nil
	}
	var out []Scored
	err = n.p.retry(ctx, true, func() error {
		var err error
		out, err = n.retrieve(ctx, query, topK, f)
		return err
	})
	return out, n.p.wrap("retrieve", n.ns, err)
}

func (n *pgNS) retrieve(ctx context.Context, query []float32, topK int, f map[string]any) ([]Scored, error) {
	sql, args, hnsw, err := n.retrieveSQL(ctx, query, topK, f)
	if err != nil {
		return nil, err
	}
	d := len(query)
	type cand struct {
		e     Entry
		seq   int64
		score float32
	}
	q := append([]float32(nil), query...)
	embed.Normalize(q)
	var cands []cand
	err = n.p.search(ctx, hnsw, sql, args, func(rows pgx.Rows) error {
		cands = cands[:0]
		for rows.Next() {
			e, seq, err := scanPG(rows)
			if err != nil {
				return err
			}
			// Scored as embed.Index scores a row: both sides normalised,
			// one float32 dot product.
			v := append([]float32(nil), e.Embedding...)
			embed.Normalize(v)
			cands = append(cands, cand{e, seq, vec.Dot(q, v)})
		}
		return rows.Err()
	})
	if err != nil {
		return nil, err
	}
	if len(cands) == 0 {
		// No row of this dimension: an empty namespace, or another one.
		have, err := n.dim(ctx)
		if err != nil {
			return nil, err
		}
		if have != 0 && have != d {
			return nil, fmt.Errorf("index: query has dimension %d, index has %d", d, have)
		}
		return nil, nil
	}
	slices.SortFunc(cands, func(a, b cand) int {
		if a.score != b.score {
			return cmp.Compare(b.score, a.score)
		}
		return cmp.Compare(a.seq, b.seq)
	})
	out := make([]Scored, 0, min(topK, len(cands)))
	for _, c := range cands[:min(topK, len(cands))] {
		out = append(out, Scored{Entry: c.e, Score: float64(c.score)})
	}
	return out, nil
}

// search runs a retrieval query and hands its rows to read. The values
// are bound before planning (QueryExecModeExec), so the plan is made for
// this namespace, not a generic one for an average namespace. An HNSW
// query runs with sorting disabled: the planner's estimate of a namespace
// (from statistics that may be old, or an average over namespaces) must
// not turn it back into a scan and sort of the whole namespace, which the
// store already chose against from the namespace's real size.
func (p *Postgres) search(ctx context.Context, hnsw bool, sql string, args []any, read func(pgx.Rows) error) error {
	args = append([]any{pgx.QueryExecModeExec}, args...)
	if !hnsw {
		rows, err := p.pool.Query(ctx, sql, args...)
		if err != nil {
			return err
		}
		defer rows.Close()
		return read(rows)
	}
	return pgx.BeginFunc(ctx, p.pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, "SET LOCAL enable_sort = off"); err != nil {
			return err
		}
		rows, err := tx.Query(ctx, sql, args...)
		if err != nil {
			return err
		}
		defer rows.Close()
		return read(rows)
	})
}

// retrieveSQL is the query of the top topK+rerankMargin candidates: exact,
// or through the HNSW index (hnsw) when the namespace is large and the
// index is ready.
func (n *pgNS) retrieveSQL(ctx context.Context, query []float32, topK int, f map[string]any) (sql string, args []any, hnsw bool, err error) {
	d := len(query)
	args = []any{n.ns, d, pgvector.NewVector(query), topK + rerankMargin}
	where := "namespace = $1 AND dim = $2"
	keys := make([]string, 0, len(f))
	for k := range f {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		raw, _ := json.Marshal(f[k])
		args = append(args, k, string(raw))
		kp, vp := len(args)-1, len(args)
		// jsonb equality is Matches' exact equality of JSON values; a
		// memory_type key falls back to the column.
		got := fmt.Sprintf("metadata -> $%d::text", kp)
		if k == "memory_type" {
			got = fmt.Sprintf("COALESCE(metadata -> $%d::text, CASE WHEN memory_type <> '' THEN to_jsonb(memory_type) END)", kp)
		}
		where += fmt.Sprintf(" AND %s = $%d::jsonb", got, vp)
	}
	if typ, ok := hnswType(d); ok && n.p.opt.HNSW.MinRows > 0 {
		large, err := n.p.large(ctx, n.ns)
		if err != nil {
			return "", nil, false, err
		}
		if large && n.p.indexReady(ctx, d) {
			// The dimension is a literal, as in the partial index's
			// predicate and expression, so the planner can match them.
			where = strings.Replace(where, "dim = $2", fmt.Sprintf("dim = %d AND $2::integer = %d", d, d), 1)
			return fmt.Sprintf("SELECT %s FROM agemem_memories WHERE %s ORDER BY embedding::%s(%d) <=> $3::vector::%s(%d) LIMIT $4",
				pgCols, where, typ, d, typ, d), args, true, nil
		}
	}
	// Exact: the second sort key keeps the planner off any HNSW index (an
	// index scan orders by one distance only).
	return "SELECT " + pgCols + " FROM agemem_memories WHERE " + where + " ORDER BY embedding <=> $3::vector, seq LIMIT $4", args, false, nil
}

// hnswType is the type a dimension is indexed as: pgvector's HNSW takes
// vector up to 2,000 dimensions and halfvec up to 4,000.
func hnswType(d int) (string, bool) {
	switch {
	case d <= 2000:
		return "vector", true
	case d <= 4000:
		return "halfvec", true
	}
	return "", false
}

func hnswName(d int) string { return fmt.Sprintf("agemem_memories_hnsw_%d", d) }

// large reports whether namespace ns holds at least HNSW.MinRows entries,
// counting at most that many, at most once a sizeTTL.
func (p *Postgres) large(ctx context.Context, ns string) (bool, error) {
	p.mu.Lock()
	s, ok := p.sizes[ns]
	p.mu.Unlock()
	if ok && time.Since(s.at) < sizeTTL {
		return s.large, nil
	}
	var c int
	if err := p.pool.QueryRow(ctx, "SELECT count(*) FROM (SELECT 1 FROM agemem_memories WHERE namespace = $1 LIMIT $2) t",
		ns, p.opt.HNSW.MinRows).Scan(&c); err != nil {
		return false, err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.sizes) > 100000 { // forget them all rather than grow without bound
		clear(p.sizes)
	}
	p.sizes[ns] = nsSize{large: c >= p.opt.HNSW.MinRows, at: time.Now()}
	return c >= p.opt.HNSW.MinRows, nil
}

// hnswState is what this process knows of one dimension's index.
type hnswState struct {
	valid    bool
	building bool
	next     time.Time // look again (and maybe build) from then on
}

// indexReady reports whether dimension d's HNSW index is built and valid;
// when it is not, it starts building it in the background (at most one
// build per dimension across every process sharing the database) and the
// caller searches exactly meanwhile. It asks the database at most every
// 30 s, and after a failed build (a role that may not create indexes, say)
// every 10 minutes.
func (p *Postgres) indexReady(ctx context.Context, d int) bool {
	p.mu.Lock()
	st := p.indexes[d]
	if st == nil {
		st = &hnswState{}
		p.indexes[d] = st
	}
	if st.valid || st.building || time.Now().Before(st.next) {
		defer p.mu.Unlock()
		return st.valid
	}
	st.next = time.Now().Add(30 * time.Second)
	p.mu.Unlock()
	valid, err := p.indexValid(ctx, d)
	p.mu.Lock()
	defer p.mu.Unlock()
	if err != nil || valid {
		st.valid = valid
		return valid
	}
	if !st.building {
		st.building = true
		p.builds.Add(1)
		go func() {
			defer p.builds.Done()
			err := p.BuildIndex(p.bg, d)
			valid := false
			if err == nil { // built, or another process is building it
				valid, err = p.indexValid(p.bg, d)
			}
			p.mu.Lock()
			defer p.mu.Unlock()
			st.building, st.valid = false, valid
			st.next = time.Now().Add(30 * time.Second)
			if err != nil && !errors.Is(err, context.Canceled) {
				p.log.Error("memory store: HNSW index build failed; large namespaces are searched exactly", "dim", d, "err", err)
				st.next = time.Now().Add(10 * time.Minute)
			}
		}()
	}
	return false
}

// indexValid reports whether dimension d's index exists and is usable (a
// build that was interrupted leaves an invalid one).
func (p *Postgres) indexValid(ctx context.Context, d int) (bool, error) {
	var valid *bool
	err := p.pool.QueryRow(ctx, "SELECT (SELECT indisvalid FROM pg_index WHERE indexrelid = to_regclass($1))", hnswName(d)).Scan(&valid)
	return valid != nil && *valid, err
}

// BuildIndex builds dimension d's HNSW index with CREATE INDEX CONCURRENTLY,
// which lets writes go on meanwhile; a process that finds another building
// it returns at once. An invalid index an interrupted build left is
// dropped first.
func (p *Postgres) BuildIndex(ctx context.Context, d int) error {
	typ, ok := hnswType(d)
	if !ok {
		return fmt.Errorf("dimension %d: pgvector indexes at most 4,000 dimensions (halfvec); namespaces of it are searched exactly", d)
	}
	conn, err := p.pool.Acquire(ctx)
	if err != nil {
		return p.wrap("build HNSW index", "", err)
	}
	defer conn.Release()
	// A session lock (a concurrent build cannot run in a transaction),
	// freed when the connection ends if this process dies.
	key := int64(0x616765_6d0000 + d)
	var got bool
	if err := conn.QueryRow(ctx, "SELECT pg_try_advisory_lock($1)", key).Scan(&got); err != nil {
		return p.wrap("build HNSW index", "", err)
	}
	if !got {
		return nil
	}
	defer conn.Exec(context.WithoutCancel(ctx), "SELECT pg_advisory_unlock($1)", key)
	var valid *bool
	if err := conn.QueryRow(ctx, "SELECT (SELECT indisvalid FROM pg_index WHERE indexrelid = to_regclass($1))", hnswName(d)).Scan(&valid); err != nil {
		return p.wrap("build HNSW index", "", err)
	}
	if valid != nil && *valid {
		return nil
	}
	if valid != nil {
		if _, err := conn.Exec(ctx, "DROP INDEX CONCURRENTLY IF EXISTS "+hnswName(d)); err != nil {
			return p.wrap("drop the invalid HNSW index", "", err)
		}
	}
	if m := p.opt.HNSW.BuildMemory; m != "" {
		if _, err := conn.Exec(ctx, "SET maintenance_work_mem = '"+m+"'"); err != nil { // validated: digits and a unit
			return p.wrap("build HNSW index", "", err)
		}
		defer conn.Exec(context.WithoutCancel(ctx), "RESET maintenance_work_mem")
	}
	start := time.Now()
	p.log.Info("memory store: building the HNSW index", "dim", d, "index", hnswName(d))
	_, err = conn.Exec(ctx, fmt.Sprintf(`CREATE INDEX CONCURRENTLY %s ON agemem_memories
		USING hnsw ((embedding::%s(%d)) %s_cosine_ops) WITH (m = %d, ef_construction = %d) WHERE dim = %d`,
		hnswName(d), typ, d, typ, p.opt.HNSW.M, p.opt.HNSW.EfConstruction, d))
	if err != nil {
		return p.wrap("build HNSW index", "", err)
	}
	p.log.Info("memory store: HNSW index built", "dim", d, "seconds", time.Since(start).Seconds())
	return nil
}
