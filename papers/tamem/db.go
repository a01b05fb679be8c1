// Package tamem is TA-Mem (../shared/papers/ta-mem.txt): an extraction
// agent turns each conversation session into notes (topic-coherent spans
// with a summary, keywords, people, per-person facts, dated events and a
// semantic tag), the notes become pages (the raw dialogue span, the note,
// the session's time) in a database indexed by person, tag, keyword and
// the embeddings of events and facts, and a retrieval agent answers each
// question by calling the database's ten query tools for at most seven
// turns, a per-question cache keeping pages it has seen out of later
// results.
package tamem

import (
	"context"
	"database/sql"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"math"
	"sort"
	"strings"
	"sync"

	_ "modernc.org/sqlite" // pure-Go SQLite driver: no cgo

	"github.com/agemem/agemem/embed"
)

// Line is one message of a page's dialogue.
type Line struct {
	DiaID   string `json:"dia_id"`
	Speaker string `json:"speaker"`
	Text    string `json:"text"`
}

// Fact is a fact about a person.
type Fact struct {
	Person string `json:"person"`
	Fact   string `json:"fact"`
}

// Event is something that happened, with its time resolved against the
// session's date ("last Saturday" said on 8 May 2023 is 2023-05-06).
type Event struct {
	Person string `json:"person"`
	Event  string `json:"event"`
	Time   string `json:"time"`
}

// Note is N_i (Eq. 2): the span [Start, End] of the session's messages it
// covers, with what was extracted from it.
type Note struct {
	Start    int      `json:"start"`
	End      int      `json:"end"`
	Summary  string   `json:"summary"`
	Keywords []string `json:"keywords"`
	Persons  []string `json:"persons"`
	Facts    []Fact   `json:"facts"`
	Events   []Event  `json:"events"`
	Tag      string   `json:"tag"`
}

// Page is M_i (Eq. 3): the raw dialogue of a note's span, the note and the
// session's time.
type Page struct {
	ID       int    `json:"page_id"`
	Session  int    `json:"session"`
	Time     string `json:"time"`
	Dialogue []Line `json:"dialogue"`
	Note     Note   `json:"note"`
}

// DB is the multi-index memory database: pages and their index keys and
// records in SQLite, a namespace per conversation.
type DB struct {
	db  *sql.DB
	emb embed.Embedder
	mu  sync.Mutex
	vec map[string][]record // namespace -> records with vectors, loaded once
}

type record struct {
	kind, person, time, text string
	page                     int
	v                        []float32
}

const schema = `
CREATE TABLE IF NOT EXISTS pages (ns TEXT, id INTEGER, session INTEGER, time TEXT, body TEXT, PRIMARY KEY (ns, id));
CREATE TABLE IF NOT EXISTS page_keys (ns TEXT, kind TEXT, key TEXT, norm TEXT, page INTEGER);
CREATE INDEX IF NOT EXISTS page_keys_by_key ON page_keys (ns, kind, norm);
CREATE TABLE IF NOT EXISTS records (ns TEXT, kind TEXT, page INTEGER, person TEXT, norm_person TEXT, time TEXT, text TEXT, vec BLOB);
CREATE INDEX IF NOT EXISTS records_by_person ON records (ns, kind, norm_person);`

// Open opens (creating) the database at path (":memory:" for none on
// disk); emb embeds events and facts and the queries against them.
func Open(path string, emb embed.Embedder) (*DB, error) {
	db, err := sql.Open("sqlite", path)
	if err != nil {
		return nil, err
	}
	db.SetMaxOpenConns(1)
	if _, err := db.Exec(schema); err != nil {
		db.Close()
		return nil, fmt.Errorf("tamem: %s: %w", path, err)
	}
	return &DB{db: db, emb: emb, vec: map[string][]record{}}, nil
}

// Close closes the database.
func (d *DB) Close() error { return d.db.Close() }

// norm is how keys match: case and surrounding space ignored, inner space
// collapsed (the paper says "key matching"; a model rarely reproduces a
// key's exact case, and the key listings are there for the rest).
func norm(s string) string { return strings.Join(strings.Fields(strings.ToLower(s)), " ") }

// Count is how many pages ns holds.
func (d *DB) Count(ctx context.Context, ns string) (int, error) {
	var n int
	err := d.db.QueryRowContext(ctx, "SELECT COUNT(*) FROM pages WHERE ns = ?", ns).Scan(&n)
	return n, err
}

// Add stores pages under ns: each indexed by its people, tag and keywords,
// its events and facts embedded (and listed in its people's profiles).
func (d *DB) Add(ctx context.Context, ns string, pages []Page) error {
	var texts []string
	for _, p := range pages {
		for _, e := range p.Note.Events {
			texts = append(texts, e.Event)
		}
		for _, f := range p.Note.Facts {
			texts = append(texts, f.Fact)
		}
	}
	var vs [][]float32
	if len(texts) > 0 {
		var err error
		if vs, err = d.emb.Embed(ctx, texts); err != nil {
			return fmt.Errorf("tamem: embedding events and facts: %w", err)
		}
	}
	tx, err := d.db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback()
	var base int
	if err := tx.QueryRowContext(ctx, "SELECT COALESCE(MAX(id) + 1, 0) FROM pages WHERE ns = ?", ns).Scan(&base); err != nil {
		return err
	}
	vi := 0
	for i, p := range pages {
		p.ID = base + i
		body, _ := json.Marshal(p)
		if _, err := tx.ExecContext(ctx, "INSERT INTO pages VALUES (?, ?, ?, ?, ?)", ns, p.ID, p.Session, p.Time, string(body)); err != nil {
			return err
		}
		keys := map[string][]string{"person": p.Note.Persons, "keyword": p.Note.Keywords, "tag": {p.Note.Tag}}
		for kind, ks := range keys {
			seen := map[string]bool{}
			for _, k := range ks {
				if n := norm(k); n != "" && !seen[n] {
					seen[n] = true
					if _, err := tx.ExecContext(ctx, "INSERT INTO page_keys VALUES (?, ?, ?, ?, ?)", ns, kind, strings.TrimSpace(k), n, p.ID); err != nil {
						return err
					}
				}
			}
		}
		add := func(kind, person, time, text string) error {
			_, err := tx.ExecContext(ctx, "INSERT INTO records VALUES (?, ?, ?, ?, ?, ?, ?, ?)", ns, kind, p.ID, person, norm(person), time, text, vecBytes(vs[vi]))
			vi++
			return err
		}
		for _, e := range p.Note.Events {
			if err := add("event", e.Person, e.Time, e.Event); err != nil {
				return err
			}
		}
		for _, f := range p.Note.Facts {
			if err := add("fact", f.Person, "", f.Fact); err != nil {
				return err
			}
		}
	}
	if err := tx.Commit(); err != nil {
		return err
	}
	d.mu.Lock()
	delete(d.vec, ns)
	d.mu.Unlock()
	return nil
}

func vecBytes(v []float32) []byte {
	b := make([]byte, 4*len(v))
	for i, x := range v {
		binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(x))
	}
	return b
}

func bytesVec(b []byte) []float32 {
	v := make([]float32, len(b)/4)
	for i := range v {
		v[i] = math.Float32frombits(binary.LittleEndian.Uint32(b[4*i:]))
	}
	return v
}

// Page returns page id of ns.
func (d *DB) Page(ctx context.Context, ns string, id int) (Page, error) {
	var body string
	if err := d.db.QueryRowContext(ctx, "SELECT body FROM pages WHERE ns = ? AND id = ?", ns, id).Scan(&body); err != nil {
		return Page{}, fmt.Errorf("tamem: page %d of %s: %w", id, ns, err)
	}
	var p Page
	err := json.Unmarshal([]byte(body), &p)
	return p, err
}

// ByKey is Q_s (Eq. 4): the pages whose kind (person, tag, keyword) key
// matches v, in page order.
func (d *DB) ByKey(ctx context.Context, ns, kind, v string) ([]int, error) {
	rows, err := d.db.QueryContext(ctx, "SELECT DISTINCT page FROM page_keys WHERE ns = ? AND kind = ? AND norm = ? ORDER BY page", ns, kind, norm(v))
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []int
	for rows.Next() {
		var p int
		if err := rows.Scan(&p); err != nil {
			return nil, err
		}
		out = append(out, p)
	}
	return out, rows.Err()
}

// Keys is V_kind: every key of that kind ns holds, sorted.
func (d *DB) Keys(ctx context.Context, ns, kind string) ([]string, error) {
	rows, err := d.db.QueryContext(ctx, "SELECT key FROM page_keys WHERE ns = ? AND kind = ? GROUP BY norm ORDER BY norm", ns, kind)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := []string{}
	for rows.Next() {
		var k string
		if err := rows.Scan(&k); err != nil {
			return nil, err
		}
		out = append(out, k)
	}
	return out, rows.Err()
}

// Similar is Q_k (Eq. 5): the pages holding the k records of kind (event,
// fact) most similar to v, best first, each page once.
func (d *DB) Similar(ctx context.Context, ns, kind, v string, k int) ([]int, error) {
	return d.SimilarOf(ctx, ns, kind, "", v, k)
}

// SimilarOf is Similar over one person's records (person "" = everyone's):
// the person index and the embedding index together.
func (d *DB) SimilarOf(ctx context.Context, ns, kind, person, v string, k int) ([]int, error) {
	if k < 1 {
		return nil, fmt.Errorf("tamem: k %d: ask for at least one page", k)
	}
	recs, err := d.records(ctx, ns)
	if err != nil {
		return nil, err
	}
	q, err := d.emb.Embed(ctx, []string{v})
	if err != nil {
		return nil, err
	}
	type hit struct {
		page int
		s    float64
	}
	var hits []hit
	for _, r := range recs {
		if r.kind == kind && (person == "" || norm(r.person) == norm(person)) {
			hits = append(hits, hit{r.page, embed.Cosine(q[0], r.v)})
		}
	}
	sort.SliceStable(hits, func(i, j int) bool { return hits[i].s > hits[j].s })
	var out []int
	seen := map[int]bool{}
	for _, h := range hits[:min(k, len(hits))] {
		if !seen[h.page] {
			seen[h.page] = true
			out = append(out, h.page)
		}
	}
	return out, nil
}

func (d *DB) records(ctx context.Context, ns string) ([]record, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if r, ok := d.vec[ns]; ok {
		return r, nil
	}
	rows, err := d.db.QueryContext(ctx, "SELECT kind, page, person, time, text, vec FROM records WHERE ns = ? ORDER BY rowid", ns)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []record
	for rows.Next() {
		var r record
		var b []byte
		if err := rows.Scan(&r.kind, &r.page, &r.person, &r.time, &r.text, &b); err != nil {
			return nil, err
		}
		r.v = bytesVec(b)
		out = append(out, r)
	}
	if err := rows.Err(); err != nil {
		return nil, err
	}
	d.vec[ns] = out
	return out, nil
}

// Profile is Q_p (Eq. 6): a person's events (with their times, in time
// order) or facts, as stored.
func (d *DB) Profile(ctx context.Context, ns, kind, person string) ([]Event, error) {
	order := "rowid"
	if kind == "event" {
		order = "time, rowid"
	}
	rows, err := d.db.QueryContext(ctx, "SELECT person, time, text FROM records WHERE ns = ? AND kind = ? AND norm_person = ? ORDER BY "+order, ns, kind, norm(person))
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []Event
	for rows.Next() {
		var e Event
		if err := rows.Scan(&e.Person, &e.Time, &e.Event); err != nil {
			return nil, err
		}
		out = append(out, e)
	}
	return out, rows.Err()
}
