package ltm

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"os"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/agemem/agemem/embed"
	"github.com/agemem/agemem/internal/gate"
	"github.com/agemem/agemem/kernels"
	_ "modernc.org/sqlite" // pure-Go SQLite driver: no cgo
)

// migrations[i] takes the schema from version i to i+1. Versions are kept in
// PRAGMA user_version; append, never edit.
var migrations = []string{
	`CREATE TABLE memories (
		namespace   TEXT    NOT NULL,
		id          TEXT    NOT NULL,
		content     TEXT    NOT NULL,
		embedding   BLOB    NOT NULL, -- little-endian float32, L2-normalised
		metadata    TEXT    NOT NULL DEFAULT '{}',
		memory_type TEXT    NOT NULL DEFAULT '',
		created     INTEGER NOT NULL, -- Unix nanoseconds, UTC
		updated     INTEGER NOT NULL,
		seq         INTEGER NOT NULL, -- insertion order within the file
		PRIMARY KEY (namespace, id)
	) WITHOUT ROWID;
	CREATE INDEX memories_ns_seq ON memories(namespace, seq);
	-- version counts the writes to a namespace, so a process can tell that
	-- its cached copy of the namespace is stale (another process wrote).
	CREATE TABLE namespaces (
		namespace TEXT    PRIMARY KEY,
		version   INTEGER NOT NULL
	) WITHOUT ROWID;`,
}

// SchemaVersion is the store schema this build writes.
var SchemaVersion = len(migrations)

// SQLiteOptions configure OpenSQLite.
type SQLiteOptions struct {
	// SyncFull sets synchronous=FULL: an acknowledged write then survives
	// power loss, not only a killed process, at one fsync per write.
	SyncFull bool
	// Device, if set, is asked for a device when a namespace's index holds
	// at least embed.DeviceMinFloats, and the index's top-k then runs there
	// (nil answer: the CPU scans).
	Device func() kernels.TopKer
	// MaxWriteQueue writers of this process may wait for the one SQLite
	// lets write at a time; one more gets ErrBusy at once (0: 1024).
	// Writers queue here, in order, instead of spinning in SQLite's busy
	// handler, where under hundreds of them some would time out.
	MaxWriteQueue int
}

// ErrBusy is a write refused because MaxWriteQueue writers already wait.
var ErrBusy = errors.New("the memory store's write queue is full")

// SQLite is a durable file of namespaces. WAL mode: a write that returned
// success is in the log before the call returns, so it survives kill -9.
type SQLite struct {
	db     *sql.DB
	path   string
	opt    SQLiteOptions
	writes *gate.Gate

	mu    sync.Mutex
	cache map[string]*nsCache
}

// nsCache is a namespace's entries and their index as of version: Retrieve
// scans it in memory instead of decoding every row on every call.
type nsCache struct {
	version int64
	entries []Entry
	idx     *embed.Index
}

// OpenSQLite opens (creating if needed) the store at path and migrates its
// schema to SchemaVersion.
func OpenSQLite(path string, opt SQLiteOptions) (*SQLite, error) {
	sync := "NORMAL"
	if opt.SyncFull {
		sync = "FULL"
	}
	// Write transactions start IMMEDIATE: a deferred one that reads first
	// and then writes fails at once with SQLITE_BUSY_SNAPSHOT when another
	// writer committed in between (WAL), which busy_timeout cannot wait out.
	dsn := fmt.Sprintf("file:%s?_txlock=immediate&_pragma=journal_mode(WAL)&_pragma=synchronous(%s)&_pragma=busy_timeout(10000)&_pragma=foreign_keys(1)&_pragma=cache_size(-65536)&_pragma=mmap_size(1073741824)", path, sync)
	// A damaged file or log is refused before SQLite touches it: its own
	// recovery would drop a log's frames after a bad one without a word,
	// and writing into a damaged file spreads the damage.
	if _, err := os.Stat(path); err == nil {
		rep, err := Check(path)
		if err != nil {
			return nil, fmt.Errorf("open memory store %s: %w", path, err)
		}
		if !rep.OK() {
			return nil, fmt.Errorf("open memory store %s: %w: %s; `serve memory check` reports it, `serve memory repair` keeps the damaged files aside and rebuilds the store from what is readable",
				path, ErrDamaged, rep)
		}
	}
	db, err := sql.Open("sqlite", dsn)
	if err != nil {
		return nil, fmt.Errorf("open memory store %s: %w", path, err)
	}
	queue := opt.MaxWriteQueue
	if queue == 0 {
		queue = 1024
	}
	s := &SQLite{db: db, path: path, opt: opt, writes: gate.New(1, queue), cache: map[string]*nsCache{}}
	if err := s.migrate(); err != nil {
		db.Close()
		return nil, fmt.Errorf("open memory store %s: %w", path, err)
	}
	return s, nil
}

func (s *SQLite) migrate() error {
	ctx := context.Background()
	conn, err := s.db.Conn(ctx)
	if err != nil {
		return err
	}
	defer conn.Close()
	// BEGIN IMMEDIATE takes the write lock so two processes opening the same
	// new file do not both run a migration.
	if _, err := conn.ExecContext(ctx, "BEGIN IMMEDIATE"); err != nil {
		return fmt.Errorf("not a usable SQLite file: %w", err)
	}
	committed := false
	defer func() {
		if !committed {
			conn.ExecContext(ctx, "ROLLBACK")
		}
	}()
	var v int
	if err := conn.QueryRowContext(ctx, "PRAGMA user_version").Scan(&v); err != nil {
		return fmt.Errorf("read schema version: %w", err)
	}
	if v > SchemaVersion {
		return fmt.Errorf("schema version %d is newer than this build supports (%d); upgrade agemem", v, SchemaVersion)
	}
	for ; v < SchemaVersion; v++ {
		if _, err := conn.ExecContext(ctx, migrations[v]); err != nil {
			return fmt.Errorf("migrate schema %d -> %d: %w", v, v+1, err)
		}
		if _, err := conn.ExecContext(ctx, fmt.Sprintf("PRAGMA user_version = %d", v+1)); err != nil {
			return err
		}
	}
	if _, err := conn.ExecContext(ctx, "COMMIT"); err != nil {
		return err
	}
	committed = true
	return nil
}

// Close closes the file.
func (s *SQLite) Close() error { return s.db.Close() }

// Ping checks that the database answers.
func (s *SQLite) Ping() error { return s.db.Ping() }

// Path is the file the store lives in.
func (s *SQLite) Path() string { return s.path }

// Namespace returns the Store of one user. Namespaces never see each other.
func (s *SQLite) Namespace(ns string) (Store, error) {
	if ns == "" || len(ns) > 256 || strings.ContainsAny(ns, "\x00") {
		return nil, fmt.Errorf("namespace %q: must be 1-256 bytes without NUL", ns)
	}
	return &sqliteNS{s: s, ns: ns}, nil
}

// Namespaces lists the namespaces that hold at least one entry.
func (s *SQLite) Namespaces(ctx context.Context) ([]string, error) {
	rows, err := s.db.QueryContext(ctx, "SELECT DISTINCT namespace FROM memories ORDER BY namespace")
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var n string
		if err := rows.Scan(&n); err != nil {
			return nil, err
		}
		out = append(out, n)
	}
	return out, rows.Err()
}

type sqliteNS struct {
	s  *SQLite
	ns string
}

const entryCols = "id, content, embedding, metadata, memory_type, created, updated"

func (n *sqliteNS) wrap(op string, err error) error {
	return fmt.Errorf("%s (store %s, namespace %q): %w", op, n.s.path, n.ns, err)
}

// dim returns the embedding dimension already stored in this namespace, or 0.
func (n *sqliteNS) dim(ctx context.Context, q interface {
	QueryRowContext(context.Context, string, ...any) *sql.Row
}) (int, error) {
	var l sql.NullInt64
	err := q.QueryRowContext(ctx, "SELECT length(embedding) FROM memories WHERE namespace = ? LIMIT 1", n.ns).Scan(&l)
	if errors.Is(err, sql.ErrNoRows) {
		return 0, nil
	}
	return int(l.Int64 / 4), err
}

func (n *sqliteNS) Add(ctx context.Context, e Entry) (Entry, error) {
	md, err := normalizeMetadata(e.Metadata)
	if err != nil {
		return Entry{}, n.wrap("add memory", err)
	}
	tx, err := n.s.begin(ctx)
	if err != nil {
		return Entry{}, n.wrap("add memory", err)
	}
	defer tx.Rollback()
	d, err := n.dim(ctx, tx)
	if err != nil {
		return Entry{}, n.wrap("add memory", err)
	}
	if err := checkEmbedding(e.Embedding, d); err != nil {
		return Entry{}, n.wrap("add memory", err)
	}
	e.Metadata = md
	e.Embedding = slices.Clone(e.Embedding)
	e.Created = time.Now().UTC()
	e.Updated = e.Created
	mdJSON, _ := json.Marshal(orEmpty(md))
	for try := 0; ; try++ {
		e.ID = randomID()
		_, err = tx.ExecContext(ctx, `INSERT INTO memories (namespace, `+entryCols+`, seq)
			VALUES (?, ?, ?, ?, ?, ?, ?, ?, (SELECT COALESCE(MAX(seq), 0) + 1 FROM memories WHERE namespace = ?))`,
			n.ns, e.ID, e.Content, encodeVec(e.Embedding), string(mdJSON), e.MemoryType, e.Created.UnixNano(), e.Updated.UnixNano(), n.ns)
		if err == nil {
			break
		}
		if try > 8 || !strings.Contains(err.Error(), "UNIQUE") {
			return Entry{}, n.wrap("add memory", err)
		}
	}
	if err := n.bump(ctx, tx.Tx); err != nil {
		return Entry{}, n.wrap("add memory", err)
	}
	if err := tx.Commit(); err != nil {
		return Entry{}, n.wrap("add memory", err)
	}
	return e, nil
}

func (n *sqliteNS) Update(ctx context.Context, id, content string, embedding []float32, metadata map[string]any) (Entry, error) {
	tx, err := n.s.begin(ctx)
	if err != nil {
		return Entry{}, n.wrap("update "+id, err)
	}
	defer tx.Rollback()
	e, err := n.get(ctx, tx, id)
	if err != nil {
		return Entry{}, n.wrap("update "+id, err)
	}
	if err := checkEmbedding(embedding, len(e.Embedding)); err != nil {
		return Entry{}, n.wrap("update "+id, err)
	}
	if metadata != nil {
		md, err := normalizeMetadata(metadata)
		if err != nil {
			return Entry{}, n.wrap("update "+id, err)
		}
		e.Metadata = md
	}
	e.Content = content
	e.Embedding = slices.Clone(embedding)
	e.Updated = time.Now().UTC()
	mdJSON, _ := json.Marshal(orEmpty(e.Metadata))
	if _, err := tx.ExecContext(ctx, `UPDATE memories SET content = ?, embedding = ?, metadata = ?, updated = ?
		WHERE namespace = ? AND id = ?`, e.Content, encodeVec(e.Embedding), string(mdJSON), e.Updated.UnixNano(), n.ns, id); err != nil {
		return Entry{}, n.wrap("update "+id, err)
	}
	if err := n.bump(ctx, tx.Tx); err != nil {
		return Entry{}, n.wrap("update "+id, err)
	}
	if err := tx.Commit(); err != nil {
		return Entry{}, n.wrap("update "+id, err)
	}
	return e, nil
}

func (n *sqliteNS) Delete(ctx context.Context, id string) error {
	tx, err := n.s.begin(ctx)
	if err != nil {
		return n.wrap("delete "+id, err)
	}
	defer tx.Rollback()
	res, err := tx.ExecContext(ctx, "DELETE FROM memories WHERE namespace = ? AND id = ?", n.ns, id)
	if err != nil {
		return n.wrap("delete "+id, err)
	}
	if k, _ := res.RowsAffected(); k == 0 {
		return fmt.Errorf("delete %s: %w", id, ErrNotFound)
	}
	if err := n.bump(ctx, tx.Tx); err != nil {
		return n.wrap("delete "+id, err)
	}
	if err := tx.Commit(); err != nil {
		return n.wrap("delete "+id, err)
	}
	return nil
}

// writeTx is a write transaction that holds the process's write slot
// until it commits or rolls back.
type writeTx struct {
	*sql.Tx
	release func()
}

func (t *writeTx) Commit() error {
	defer t.release()
	return t.Tx.Commit()
}

// Rollback after Commit is a no-op, as for sql.Tx.
func (t *writeTx) Rollback() error {
	err := t.Tx.Rollback()
	if !errors.Is(err, sql.ErrTxDone) {
		t.release()
	}
	return err
}

// begin waits for the write slot (ErrBusy if the queue is full) and opens
// an IMMEDIATE transaction.
func (s *SQLite) begin(ctx context.Context) (*writeTx, error) {
	release, err := s.writes.Enter(ctx)
	if errors.Is(err, gate.ErrFull) {
		return nil, ErrBusy
	}
	if err != nil {
		return nil, err
	}
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		release()
		return nil, err
	}
	return &writeTx{Tx: tx, release: sync.OnceFunc(release)}, nil
}

// Import writes entries into namespace ns in one transaction: all of them
// or none. An entry whose ID is a valid id keeps it, replacing the entry
// of that id if the namespace holds one (so importing the same export
// twice leaves one copy); others get new ids. Embeddings must be set.
func (s *SQLite) Import(ctx context.Context, ns string, es []Entry) (added, replaced int, err error) {
	n := &sqliteNS{s: s, ns: ns}
	tx, err := s.begin(ctx)
	if err != nil {
		return 0, 0, n.wrap("import", err)
	}
	defer tx.Rollback()
	d, err := n.dim(ctx, tx)
	if err != nil {
		return 0, 0, n.wrap("import", err)
	}
	now := time.Now().UTC()
	for i, e := range es {
		if err := checkEmbedding(e.Embedding, d); err != nil {
			return 0, 0, n.wrap(fmt.Sprintf("import entry %d", i+1), err)
		}
		d = len(e.Embedding)
		md, err := normalizeMetadata(e.Metadata)
		if err != nil {
			return 0, 0, n.wrap(fmt.Sprintf("import entry %d", i+1), err)
		}
		mdJSON, _ := json.Marshal(orEmpty(md))
		created, updated := e.Created, e.Updated
		if created.IsZero() {
			created = now
		}
		if updated.IsZero() {
			updated = now
		}
		id := e.ID
		if ValidID(id) {
			var exists int
			if err := tx.QueryRowContext(ctx, "SELECT COUNT(*) FROM memories WHERE namespace = ? AND id = ?", ns, id).Scan(&exists); err != nil {
				return 0, 0, n.wrap("import", err)
			}
			if exists > 0 {
				if _, err := tx.ExecContext(ctx, `UPDATE memories SET content = ?, embedding = ?, metadata = ?, memory_type = ?, created = ?, updated = ?
					WHERE namespace = ? AND id = ?`, e.Content, encodeVec(e.Embedding), string(mdJSON), e.MemoryType, created.UnixNano(), updated.UnixNano(), ns, id); err != nil {
					return 0, 0, n.wrap("import", err)
				}
				replaced++
				continue
			}
		} else {
			id = ""
		}
		for try := 0; ; try++ {
			if id == "" || try > 0 {
				id = randomID()
			}
			_, err = tx.ExecContext(ctx, `INSERT INTO memories (namespace, `+entryCols+`, seq)
				VALUES (?, ?, ?, ?, ?, ?, ?, ?, (SELECT COALESCE(MAX(seq), 0) + 1 FROM memories WHERE namespace = ?))`,
				ns, id, e.Content, encodeVec(e.Embedding), string(mdJSON), e.MemoryType, created.UnixNano(), updated.UnixNano(), ns)
			if err == nil {
				break
			}
			if try > 8 || !strings.Contains(err.Error(), "UNIQUE") {
				return 0, 0, n.wrap("import", err)
			}
		}
		added++
	}
	if err := n.bump(ctx, tx.Tx); err != nil {
		return 0, 0, n.wrap("import", err)
	}
	if err := tx.Commit(); err != nil {
		return 0, 0, n.wrap("import", err)
	}
	return added, replaced, nil
}

func (n *sqliteNS) bump(ctx context.Context, tx *sql.Tx) error {
	_, err := tx.ExecContext(ctx, `INSERT INTO namespaces (namespace, version) VALUES (?, 1)
		ON CONFLICT(namespace) DO UPDATE SET version = version + 1`, n.ns)
	return err
}

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
	f, err := normalizeMetadata(filter)
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
	rows, err := q.QueryContext(ctx, "SELECT "+entryCols+" FROM memories WHERE namespace = ? ORDER BY seq", n.ns)
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
func encodeVec(v []float32) []byte {
	var s float64
	for _, x := range v {
		s += float64(x) * float64(x)
	}
	inv := float32(1)
	if s > 0 {
		inv = float32(1 / math.Sqrt(s))
	}
	b := make([]byte, 4*len(v))
	for i, x := range v {
		binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(x*inv))
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
