package ltm

// Retrieval: exact top-k within a namespace (a B-tree finds its rows,
// every one is scored: the pgvector README's advice for a selective
// filter), or, from HNSW.MinRows rows on, through the namespace's own HNSW
// index (postgres_hnsw.go), with an iterative scan for metadata filters.
// Either way the candidates are scored again here exactly as the SQLite
// and in-memory stores score them (embed.Index), so the three return the
// same entries, scores and tie order.

import (
	"cmp"
	"context"
	"encoding/json"
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
	if topK <= 0 || hasNUL(f) { // no memory holds a NUL (checkText)
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
		if large && n.p.indexReady(ctx, n.ns, d) {
			// The dimension is a literal, as in the partial index's
			// predicate and expression, so the planner can match them (the
			// namespace is one too once bound: search plans with the values).
			where = strings.Replace(where, "dim = $2", fmt.Sprintf("dim = %d AND $2::integer = %d", d, d), 1)
			return fmt.Sprintf("SELECT %s FROM agemem_memories WHERE %s ORDER BY embedding::%s(%d) <=> $3::vector::%s(%d) LIMIT $4",
				pgCols, where, typ, d, typ, d), args, true, nil
		}
	}
	// Exact: the second sort key keeps the planner off any HNSW index (an
	// index scan orders by one distance only).
	return "SELECT " + pgCols + " FROM agemem_memories WHERE " + where + " ORDER BY embedding <=> $3::vector, seq LIMIT $4", args, false, nil
}
