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
	// Schema 2: memories in a rowid table. A WITHOUT ROWID table is an
	// index b-tree, whose cells hold at most about a quarter of a page
	// (1,002 bytes of a 4 KiB page) before the rest spills to an overflow
	// page of its own, and a memory's embedding alone is 1,536 bytes at
	// dimension 384: every row took a leaf share and a whole overflow page,
	// 4.7 KB for 1.6 KB of data. A rowid table's cell holds up to the page
	// less 35 bytes, so rows pack whole into leaves ("WITHOUT ROWID tables
	// work best when individual rows are not too large",
	// https://sqlite.org/withoutrowid.html). The rowid is the insertion
	// order List returns (an update keeps it), so seq goes; the columns
	// are ordered small first, so what a long content pushes to overflow
	// is its tail and the embedding, not the id and timestamps.
	`CREATE TABLE memories_v2 (
		namespace   TEXT    NOT NULL,
		id          TEXT    NOT NULL,
		memory_type TEXT    NOT NULL DEFAULT '',
		created     INTEGER NOT NULL, -- Unix nanoseconds, UTC
		updated     INTEGER NOT NULL,
		metadata    TEXT    NOT NULL DEFAULT '{}',
		content     TEXT    NOT NULL,
		embedding   BLOB    NOT NULL  -- little-endian float32, L2-normalised
	);
	INSERT INTO memories_v2 (namespace, id, memory_type, created, updated, metadata, content, embedding)
		SELECT namespace, id, memory_type, created, updated, metadata, content, embedding
		FROM memories ORDER BY namespace, seq;
	DROP TABLE memories;
	ALTER TABLE memories_v2 RENAME TO memories;
	CREATE UNIQUE INDEX memories_ns_id ON memories(namespace, id);
	CREATE INDEX memories_ns ON memories(namespace);`,
	// Schema 3: Add looks a content up before storing it (a namespace
	// holds a content once).
	`CREATE INDEX memories_ns_content ON memories(namespace, content);`,
}

// pageSize is a new store's page size: 16 KiB pages hold about ten
// memories of dimension 384 whole, where 4 KiB pages, SQLite's default,
// hold two and leave a quarter of each page empty
// (BenchmarkStorePerMemory measures both).
const pageSize = 16384

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
	// Metadata bounds a memory's metadata (zero fields: the defaults).
	Metadata MetadataLimits
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
	// page_size only acts on a new file, and only before the switch to
	// WAL, which the driver's _journal_mode key makes after every _pragma.
	dsn := fmt.Sprintf("file:%s?_txlock=immediate&_pragma=page_size(%d)&_journal_mode=WAL&_pragma=synchronous(%s)&_pragma=busy_timeout(10000)&_pragma=foreign_keys(1)&_pragma=cache_size(-65536)&_pragma=mmap_size(1073741824)", path, pageSize, sync)
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
	opt.Metadata = opt.Metadata.withDefaults()
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
	from, err := s.migrateSchema(ctx, conn)
	if err != nil {
		return err
	}
	if from >= 1 && from < 2 {
		return compact(ctx, conn)
	}
	return nil
}

// compact returns the pages the schema-1 layout's rows left free and
// moves the file to the page size new stores have. The page size can
// only change outside WAL mode, which needs the only connection to the
// file; with other processes attached the file keeps its page size and
// VACUUM (in WAL mode) still returns the free pages. A crash inside the
// rollback-journal VACUUM leaves a hot journal, which SQLite rolls back
// losslessly at the next open (see rollBackJournal).
func compact(ctx context.Context, conn *sql.Conn) error {
	var mode string
	if err := conn.QueryRowContext(ctx, "PRAGMA journal_mode=DELETE").Scan(&mode); err != nil || mode != "delete" {
		conn.ExecContext(ctx, "VACUUM") // best effort: the layout is migrated already
		return nil
	}
	conn.ExecContext(ctx, "PRAGMA synchronous=FULL") // NORMAL can corrupt a rollback journal's file on power loss
	conn.ExecContext(ctx, fmt.Sprintf("PRAGMA page_size=%d", pageSize))
	conn.ExecContext(ctx, "VACUUM")
	if err := conn.QueryRowContext(ctx, "PRAGMA journal_mode=WAL").Scan(&mode); err != nil || mode != "wal" {
		return fmt.Errorf("return to WAL mode after compacting (mode %q): %w", mode, err)
	}
	return nil
}

// migrateSchema runs the schema's migrations and returns the version the
// file had.
func (s *SQLite) migrateSchema(ctx context.Context, conn *sql.Conn) (int, error) {
	// BEGIN IMMEDIATE takes the write lock so two processes opening the same
	// new file do not both run a migration.
	if _, err := conn.ExecContext(ctx, "BEGIN IMMEDIATE"); err != nil {
		return 0, fmt.Errorf("not a usable SQLite file: %w", err)
	}
	committed := false
	defer func() {
		if !committed {
			conn.ExecContext(ctx, "ROLLBACK")
		}
	}()
	var from int
	if err := conn.QueryRowContext(ctx, "PRAGMA user_version").Scan(&from); err != nil {
		return 0, fmt.Errorf("read schema version: %w", err)
	}
	if from > SchemaVersion {
		return 0, fmt.Errorf("schema version %d is newer than this build supports (%d); upgrade agemem", from, SchemaVersion)
	}
	for v := from; v < SchemaVersion; v++ {
		if _, err := conn.ExecContext(ctx, migrations[v]); err != nil {
			return 0, fmt.Errorf("migrate schema %d -> %d: %w", v, v+1, err)
		}
		if _, err := conn.ExecContext(ctx, fmt.Sprintf("PRAGMA user_version = %d", v+1)); err != nil {
			return 0, err
		}
	}
	if _, err := conn.ExecContext(ctx, "COMMIT"); err != nil {
		return 0, err
	}
	committed = true
	return from, nil
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

// insertMemory adds a row: namespace and then entryCols.
const insertMemory = `INSERT INTO memories (namespace, ` + entryCols + `) VALUES (?, ?, ?, ?, ?, ?, ?, ?)`

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
