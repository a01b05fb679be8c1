package ltm

// Reads: each namespace keeps its entries and vector index in memory,
// reloaded when the namespace version stored beside them moves.

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/agemem/agemem/embed"
)

// cached returns the namespace's entries and index, reloading them when the
// stored version moved. The caller holds n.s.mu.
func (n *sqliteNS) cached(ctx context.Context) (*nsCache, error) {
	var v int64
	err := n.s.db.QueryRowContext(ctx, "SELECT version FROM namespaces WHERE namespace = ?", n.ns).Scan(&v)
	if err != nil && !errors.Is(err, sql.ErrNoRows) {
		return nil, err
	}
	if c := n.s.cache[n.ns]; c != nil && c.version == v {
		return c, nil
	}
	// Read the version again inside the same snapshot as the rows, so the
	// cache is labelled with the version its rows belong to.
	tx, err := n.s.db.BeginTx(ctx, &sql.TxOptions{ReadOnly: true})
	if err != nil {
		return nil, err
	}
	defer tx.Rollback()
	v = 0
	if err := tx.QueryRowContext(ctx, "SELECT version FROM namespaces WHERE namespace = ?", n.ns).Scan(&v); err != nil && !errors.Is(err, sql.ErrNoRows) {
		return nil, err
	}
	entries, err := n.list(ctx, tx)
	if err != nil {
		return nil, err
	}
	c := &nsCache{version: v, entries: entries}
	for _, e := range entries {
		if c.idx == nil {
			c.idx = embed.NewIndex(len(e.Embedding))
		}
		if _, err := c.idx.Add(e.Embedding); err != nil {
			return nil, fmt.Errorf("memory %s: %w", e.ID, err)
		}
	}
	if c.idx != nil && n.s.opt.Device != nil && c.idx.Len()*c.idx.Dim() >= embed.DeviceMinFloats {
		if be := n.s.opt.Device(); be != nil {
			c.idx.OnDevice(be)
		}
	}
	n.s.cache[n.ns] = c
	return c, nil
}

func (n *sqliteNS) Get(ctx context.Context, id string) (Entry, error) {
	e, err := n.get(ctx, n.s.db, id)
	if errors.Is(err, ErrNotFound) {
		return Entry{}, fmt.Errorf("get %s: %w", id, ErrNotFound)
	}
	if err != nil {
		return Entry{}, n.wrap("get "+id, err)
	}
	return e, nil
}

type queryer interface {
	QueryRowContext(context.Context, string, ...any) *sql.Row
	QueryContext(context.Context, string, ...any) (*sql.Rows, error)
}

func (n *sqliteNS) get(ctx context.Context, q queryer, id string) (Entry, error) {
	row := q.QueryRowContext(ctx, "SELECT "+entryCols+" FROM memories WHERE namespace = ? AND id = ?", n.ns, id)
	e, err := scanEntry(row.Scan)
	if errors.Is(err, sql.ErrNoRows) {
		return Entry{}, ErrNotFound
	}
	return e, err
}

func (n *sqliteNS) Retrieve(ctx context.Context, query []float32, topK int, filter map[string]any) ([]Scored, error) {
	f, err := n.s.opt.Metadata.normalize(filter)
	if err != nil {
		return nil, n.wrap("retrieve", fmt.Errorf("filter: %w", err))
	}
	if topK <= 0 {
		return nil, nil
	}
	n.s.mu.Lock()
	defer n.s.mu.Unlock()
	c, err := n.cached(ctx)
	if err != nil {
		return nil, n.wrap("retrieve", err)
	}
	if c.idx == nil {
		return nil, nil
	}
	var keep func(int) bool
	if len(f) > 0 {
		keep = func(r int) bool { return matchesNormalized(c.entries[r], f) }
	}
	hits, err := c.idx.Search(query, topK, keep)
	if err != nil {
		return nil, n.wrap("retrieve", err)
	}
	out := make([]Scored, len(hits))
	for i, h := range hits {
		out[i] = Scored{Entry: cloneEntry(c.entries[h.Row]), Score: float64(h.Score)}
	}
	return out, nil
}

func (n *sqliteNS) List(ctx context.Context) ([]Entry, error) {
	return n.list(ctx, n.s.db)
}

func (n *sqliteNS) list(ctx context.Context, q queryer) ([]Entry, error) {
	rows, err := q.QueryContext(ctx, "SELECT "+entryCols+" FROM memories WHERE namespace = ? ORDER BY rowid", n.ns)
	if err != nil {
		return nil, n.wrap("list", err)
	}
	defer rows.Close()
	var out []Entry
	for rows.Next() {
		e, err := scanEntry(rows.Scan)
		if err != nil {
			return nil, n.wrap("list", err)
		}
		out = append(out, e)
	}
	if err := rows.Err(); err != nil {
		return nil, n.wrap("list", err)
	}
	return out, nil
}

func (n *sqliteNS) Count(ctx context.Context) (int, error) {
	var c int
	if err := n.s.db.QueryRowContext(ctx, "SELECT COUNT(*) FROM memories WHERE namespace = ?", n.ns).Scan(&c); err != nil {
		return 0, n.wrap("count", err)
	}
	return c, nil
}

func scanEntry(scan func(...any) error) (Entry, error) {
	var e Entry
	var emb []byte
	var md string
	var created, updated int64
	if err := scan(&e.ID, &e.Content, &emb, &md, &e.MemoryType, &created, &updated); err != nil {
		return Entry{}, err
	}
	if len(emb)%4 != 0 {
		return Entry{}, fmt.Errorf("memory %s: embedding blob of %d bytes is not float32", e.ID, len(emb))
	}
	e.Embedding = decodeVec(emb)
	if md != "" && md != "{}" {
		if err := json.Unmarshal([]byte(md), &e.Metadata); err != nil {
			return Entry{}, fmt.Errorf("memory %s: metadata: %w", e.ID, err)
		}
	}
	e.Created = time.Unix(0, created).UTC()
	e.Updated = time.Unix(0, updated).UTC()
	return e, nil
}

func orEmpty(m map[string]any) map[string]any {
	if m == nil {
		return map[string]any{}
	}
	return m
}

// encodeVec stores v normalised, so Retrieve needs one dot product per row.
// A vector of unit length already is stored as it is: scaling it by a
// factor a rounding away from 1 would change its bits on every rewrite (a
// repair writes back what it read).
func encodeVec(v []float32) []byte {
	v = unit(v)
	b := make([]byte, 4*len(v))
	for i, x := range v {
		binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(x))
	}
	return b
}

func decodeVec(b []byte) []float32 {
	v := make([]float32, len(b)/4)
	for i := range v {
		v[i] = math.Float32frombits(binary.LittleEndian.Uint32(b[4*i:]))
	}
	return v
}

func randomID() string {
	var b [4]byte
	rand.Read(b[:])
	return formatID(binary.BigEndian.Uint32(b[:]))
}
