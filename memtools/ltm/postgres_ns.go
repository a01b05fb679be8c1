package ltm

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/pgvector/pgvector-go"
)

type pgNS struct {
	p  *Postgres
	ns string
}

const pgCols = "id, content, embedding, metadata, memory_type, created, updated, seq"

// scanPG reads one row of pgCols.
func scanPG(row pgx.Row) (Entry, int64, error) {
	var e Entry
	var v pgvector.Vector
	var md []byte
	var created, updated, seq int64
	if err := row.Scan(&e.ID, &e.Content, &v, &md, &e.MemoryType, &created, &updated, &seq); err != nil {
		return Entry{}, 0, err
	}
	e.Embedding = v.Slice()
	if len(md) > 0 && string(md) != "{}" {
		if err := json.Unmarshal(md, &e.Metadata); err != nil {
			return Entry{}, 0, fmt.Errorf("memory %s: metadata: %w", e.ID, err)
		}
	}
	e.Created = time.Unix(0, created).UTC()
	e.Updated = time.Unix(0, updated).UTC()
	return e, seq, nil
}

// addSQL inserts unless the namespace holds the content already or holds
// another dimension; it returns no row then (or when the id is taken).
const addSQL = `INSERT INTO agemem_memories (namespace, id, content, embedding, dim, metadata, memory_type, created, updated)
	SELECT $1::text, $2::text, $3::text, $4::vector, $5::integer, $6::jsonb, $7::text, $8::bigint, $8::bigint
	WHERE NOT EXISTS (SELECT 1 FROM agemem_memories WHERE namespace = $1 AND md5(content) = md5($3) AND content = $3)
	  AND COALESCE((SELECT dim FROM agemem_memories WHERE namespace = $1 LIMIT 1), $5) = $5
	ON CONFLICT (namespace, id) DO NOTHING
	RETURNING seq`

func (n *pgNS) Add(ctx context.Context, e Entry) (Entry, error) {
	if err := checkEmbedding(e.Embedding, 0); err != nil {
		return Entry{}, n.p.wrap("add memory", n.ns, err)
	}
	md, err := n.p.opt.Metadata.normalize(e.Metadata)
	if err == nil {
		err = checkText(e.Content, md)
	}
	if err != nil {
		return Entry{}, n.p.wrap("add memory", n.ns, err)
	}
	e.Metadata = md
	e.Embedding = unit(e.Embedding)
	e.Created = time.Now().UTC()
	e.Updated = e.Created
	mdJSON, _ := json.Marshal(orEmpty(md))
	var out Entry
	// Trying again is safe even when the first try committed and only its
	// answer was lost: the second finds the content and returns that entry.
	err = n.p.retry(ctx, true, func() error {
		var err error
		out, err = n.add(ctx, e, string(mdJSON))
		return err
	})
	return out, n.p.wrap("add memory", n.ns, err)
}

// add runs as one batch, one round trip and one implicit transaction: the
// advisory locks are held until it commits. The first lock makes the first
// adds into an empty namespace take turns, so they agree on its dimension;
// the second makes identical adds take turns, so the second finds the
// first's entry.
func (n *pgNS) add(ctx context.Context, e Entry, md string) (Entry, error) {
	for try := 0; try < 8; try++ {
		e.ID = randomID()
		b := &pgx.Batch{}
		b.Queue(`SELECT pg_advisory_xact_lock(hashtext($1::text), 0)
			WHERE NOT EXISTS (SELECT 1 FROM agemem_memories WHERE namespace = $1)`, n.ns)
		b.Queue(`SELECT pg_advisory_xact_lock(hashtext($1::text), hashtext($2::text))`, n.ns, e.Content)
		b.Queue(`SELECT `+pgCols+` FROM agemem_memories WHERE namespace = $1 AND md5(content) = md5($2) AND content = $2
			ORDER BY seq LIMIT 1`, n.ns, e.Content)
		b.Queue(addSQL, n.ns, e.ID, e.Content, pgvector.NewVector(e.Embedding), len(e.Embedding), md, e.MemoryType, e.Created.UnixNano())
		res := n.p.pool.SendBatch(ctx, b)
		held, inserted, err := func() (held *Entry, inserted bool, err error) {
			defer res.Close()
			for range 2 {
				if _, err := res.Exec(); err != nil {
					return nil, false, err
				}
			}
			h, _, err := scanPG(res.QueryRow())
			if err == nil {
				held = &h
			} else if !errors.Is(err, pgx.ErrNoRows) {
				return nil, false, err
			}
			var seq int64
			err = res.QueryRow().Scan(&seq)
			if errors.Is(err, pgx.ErrNoRows) {
				return held, false, nil
			}
			return held, err == nil, err
		}()
		switch {
		case err != nil:
			return Entry{}, err
		case held != nil:
			return *held, nil
		case inserted:
			return e, nil
		}
		// Nothing inserted: another dimension, or the id is taken.
		d, err := n.dim(ctx)
		if err != nil {
			return Entry{}, err
		}
		if err := checkEmbedding(e.Embedding, d); err != nil {
			return Entry{}, err
		}
	}
	return Entry{}, errors.New("no free id after 8 tries")
}

// dim is the namespace's dimension (0: empty).
func (n *pgNS) dim(ctx context.Context) (int, error) {
	var d int
	err := n.p.pool.QueryRow(ctx, "SELECT dim FROM agemem_memories WHERE namespace = $1 LIMIT 1", n.ns).Scan(&d)
	if errors.Is(err, pgx.ErrNoRows) {
		return 0, nil
	}
	return d, err
}

func (n *pgNS) Update(ctx context.Context, id, content string, embedding []float32, metadata map[string]any) (Entry, error) {
	op := "update " + id
	if err := checkEmbedding(embedding, 0); err != nil {
		return Entry{}, n.p.wrap(op, n.ns, err)
	}
	var mdArg any // nil keeps the stored metadata
	var md map[string]any
	if metadata != nil {
		var err error
		if md, err = n.p.opt.Metadata.normalize(metadata); err != nil {
			return Entry{}, n.p.wrap(op, n.ns, err)
		}
		raw, _ := json.Marshal(orEmpty(md))
		mdArg = string(raw)
	}
	if err := checkText(content, md); err != nil {
		return Entry{}, n.p.wrap(op, n.ns, err)
	}
	v := unit(embedding)
	now := time.Now().UTC()
	var out Entry
	err := n.p.retry(ctx, true, func() error {
		var err error
		out, _, err = scanPG(n.p.pool.QueryRow(ctx, `UPDATE agemem_memories
			SET content = $3, embedding = $4, metadata = COALESCE($5::jsonb, metadata), updated = $6
			WHERE namespace = $1 AND id = $2 AND dim = $7 RETURNING `+pgCols,
			n.ns, id, content, pgvector.NewVector(v), mdArg, now.UnixNano(), len(v)))
		if !errors.Is(err, pgx.ErrNoRows) {
			return err
		}
		// Not updated: no such id, or another dimension.
		var d int
		err = n.p.pool.QueryRow(ctx, "SELECT dim FROM agemem_memories WHERE namespace = $1 AND id = $2", n.ns, id).Scan(&d)
		if errors.Is(err, pgx.ErrNoRows) {
			return ErrNotFound
		}
		if err != nil {
			return err
		}
		return checkEmbedding(v, d)
	})
	if errors.Is(err, ErrNotFound) {
		return Entry{}, fmt.Errorf("update %s: %w", id, ErrNotFound)
	}
	return out, n.p.wrap(op, n.ns, err)
}

func (n *pgNS) Delete(ctx context.Context, id string) error {
	del := func() (int64, error) {
		tag, err := n.p.pool.Exec(ctx, "DELETE FROM agemem_memories WHERE namespace = $1 AND id = $2", n.ns, id)
		return tag.RowsAffected(), err
	}
	deleted, err := del()
	if err != nil && unavailable(err) && ctx.Err() == nil {
		// A first try that sent its statement and lost the answer may have
		// deleted the entry: a second finding nothing then means it is
		// gone, as asked.
		sent := !pgconn.SafeToRetry(err)
		if deleted, err = del(); err == nil && deleted == 0 && sent {
			return nil
		}
	}
	if err != nil {
		return n.p.wrap("delete "+id, n.ns, err)
	}
	if deleted == 0 {
		return fmt.Errorf("delete %s: %w", id, ErrNotFound)
	}
	return nil
}

func (n *pgNS) Get(ctx context.Context, id string) (Entry, error) {
	var e Entry
	err := n.p.retry(ctx, true, func() error {
		var err error
		e, _, err = scanPG(n.p.pool.QueryRow(ctx, "SELECT "+pgCols+" FROM agemem_memories WHERE namespace = $1 AND id = $2", n.ns, id))
		return err
	})
	if errors.Is(err, pgx.ErrNoRows) {
		return Entry{}, fmt.Errorf("get %s: %w", id, ErrNotFound)
	}
	return e, n.p.wrap("get "+id, n.ns, err)
}

func (n *pgNS) List(ctx context.Context) ([]Entry, error) {
	var out []Entry
	err := n.p.retry(ctx, true, func() error {
		var err error
		out, err = n.query(ctx, "SELECT "+pgCols+" FROM agemem_memories WHERE namespace = $1 ORDER BY seq", n.ns)
		return err
	})
	return out, n.p.wrap("list", n.ns, err)
}

func (n *pgNS) query(ctx context.Context, sql string, args ...any) ([]Entry, error) {
	rows, err := n.p.pool.Query(ctx, sql, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []Entry
	for rows.Next() {
		e, _, err := scanPG(rows)
		if err != nil {
			return nil, err
		}
		out = append(out, e)
	}
	return out, rows.Err()
}

func (n *pgNS) Count(ctx context.Context) (int, error) {
	var c int
	err := n.p.retry(ctx, true, func() error {
		return n.p.pool.QueryRow(ctx, "SELECT count(*) FROM agemem_memories WHERE namespace = $1", n.ns).Scan(&c)
	})
	return c, n.p.wrap("count", n.ns, err)
}

// Import implements DB: one transaction; ids kept and replaced as SQLite's
// Import does.
func (p *Postgres) Import(ctx context.Context, ns string, es []Entry) (added, replaced int, err error) {
	if err := checkNamespace(ns); err != nil {
		return 0, 0, err
	}
	n := &pgNS{p: p, ns: ns}
	type row struct {
		id               string
		keep             bool // a valid id of the export: replace that entry
		content, md, typ string
		v                []float32
		created, updated int64
	}
	rows := make([]row, len(es))
	now := time.Now().UTC()
	for i, e := range es {
		if err := checkEmbedding(e.Embedding, len(es[0].Embedding)); err != nil {
			return 0, 0, p.wrap(fmt.Sprintf("import entry %d", i+1), ns, err)
		}
		md, err := p.opt.Metadata.normalize(e.Metadata)
		if me := (*MetadataError)(nil); errors.As(err, &me) {
			me.Entry = i + 1
		}
		if err == nil {
			err = checkText(e.Content, md)
		}
		if err != nil {
			return 0, 0, p.wrap(fmt.Sprintf("import entry %d", i+1), ns, err)
		}
		raw, _ := json.Marshal(orEmpty(md))
		created, updated := e.Created, e.Updated
		if created.IsZero() {
			created = now
		}
		if updated.IsZero() {
			updated = now
		}
		rows[i] = row{e.ID, ValidID(e.ID), e.Content, string(raw), e.MemoryType, unit(e.Embedding), created.UnixNano(), updated.UnixNano()}
	}
	if len(rows) == 0 {
		return 0, 0, nil
	}
	err = p.retry(ctx, false, func() error {
		added, replaced = 0, 0
		return pgx.BeginFunc(ctx, p.pool, func(tx pgx.Tx) error {
			// Imports and first adds into an empty namespace take turns.
			if _, err := tx.Exec(ctx, "SELECT pg_advisory_xact_lock(hashtext($1::text), 0)", ns); err != nil {
				return err
			}
			var d int
			err := tx.QueryRow(ctx, "SELECT dim FROM agemem_memories WHERE namespace = $1 LIMIT 1", ns).Scan(&d)
			if err != nil && !errors.Is(err, pgx.ErrNoRows) {
				return err
			}
			if err := checkEmbedding(rows[0].v, d); err != nil {
				return err
			}
			pending := slices.Clone(rows)
			for try := 0; len(pending) > 0; try++ {
				if try > 8 {
					return errors.New("no free id after 8 tries")
				}
				b := &pgx.Batch{}
				for i := range pending {
					r := &pending[i]
					args := []any{ns, r.id, r.content, pgvector.NewVector(r.v), len(r.v), r.md, r.typ, r.created, r.updated}
					if r.keep {
						// xmax is 0 in a row this statement inserted, the
						// inserting transaction's id in one it updated.
						b.Queue(`INSERT INTO agemem_memories (namespace, id, content, embedding, dim, metadata, memory_type, created, updated)
							VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)
							ON CONFLICT (namespace, id) DO UPDATE SET content = EXCLUDED.content, embedding = EXCLUDED.embedding,
								dim = EXCLUDED.dim, metadata = EXCLUDED.metadata, memory_type = EXCLUDED.memory_type,
								created = EXCLUDED.created, updated = EXCLUDED.updated
							RETURNING xmax = 0`, args...)
					} else {
						args[1] = randomID()
						b.Queue(`INSERT INTO agemem_memories (namespace, id, content, embedding, dim, metadata, memory_type, created, updated)
							VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)
							ON CONFLICT (namespace, id) DO NOTHING
							RETURNING true`, args...)
					}
				}
				res := tx.SendBatch(ctx, b)
				var again []row
				for _, r := range pending {
					var inserted bool
					err := res.QueryRow().Scan(&inserted)
					switch {
					case errors.Is(err, pgx.ErrNoRows): // a new id that was taken
						again = append(again, r)
					case err != nil:
						res.Close()
						return err
					case inserted:
						added++
					default:
						replaced++
					}
				}
				if err := res.Close(); err != nil {
					return err
				}
				pending = again
			}
			return nil
		})
	})
	if err != nil {
		return 0, 0, n.p.wrap("import", ns, err)
	}
	p.mu.Lock()
	delete(p.sizes, ns)
	p.mu.Unlock()
	return added, replaced, nil
}
