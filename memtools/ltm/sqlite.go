package ltm

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"sync"

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
	// Add looks a content up before storing it (a namespace holds a content
	// once).
	`CREATE INDEX memories_ns_content ON memories(namespace, content);`,
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
	if err := checkNamespace(ns); err != nil {
		return nil, err
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
