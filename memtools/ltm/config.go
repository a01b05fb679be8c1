package ltm

import (
	"errors"
	"net/url"
	"regexp"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/agemem/agemem/internal/valid"
)

// Config selects the long-term store M (config section "memory").
type Config struct {
	// Store is "sqlite" (durable, one machine, one namespace per user),
	// "postgres" (durable, any number of server replicas) or "memory".
	Store string `yaml:"store"`
	// Path is the SQLite file.
	Path string `yaml:"path"`
	// Namespace is the namespace commands use when none is given.
	Namespace string `yaml:"namespace"`
	// Sync is SQLite's synchronous mode: "normal" survives a killed process,
	// "full" also survives power loss at the cost of one fsync per write.
	Sync string `yaml:"sync"`
	// MaxMetadataBytes and MaxMetadataDepth bound a memory's metadata (its
	// JSON encoding; objects and arrays nested): every write beyond them
	// is refused, so no client stores what other clients cannot parse.
	MaxMetadataBytes int `yaml:"max_metadata_bytes"`
	MaxMetadataDepth int `yaml:"max_metadata_depth"`
	// DSN is the PostgreSQL database (store postgres), as a URL
	// (postgres://agemem@db:5432/agemem?sslmode=verify-full) or key=value
	// pairs. The password comes from PGPASSWORD or ~/.pgpass, never from
	// here: a config file is copied and logged, the environment is not.
	DSN string `yaml:"dsn"`
	// MaxConns is each process's PostgreSQL connection pool. Replicas ×
	// max_conns must stay below the server's max_connections.
	MaxConns int `yaml:"max_conns"`
	// HNSW is the approximate index large namespaces are searched with.
	HNSW HNSW `yaml:"hnsw"`
}

// HNSW configures PostgreSQL's HNSW indexes (pgvector): a namespace smaller
// than MinRows is searched exactly (a B-tree finds its rows, every one is
// scored), a larger one through an index of its own (a partial index on
// its rows), with pgvector 0.8's iterative scan so that a metadata filter
// cannot leave it short of top_k.
type HNSW struct {
	// MinRows is the namespace size from which its index is used; 0 never
	// uses (nor builds) one. A namespace's index is built in the
	// background, without blocking writes, the first time a search finds it
	// this large; each build reads the whole table once.
	MinRows int `yaml:"min_rows"`
	// M is the graph's links per node (pgvector's m).
	M int `yaml:"m"`
	// EfConstruction is the candidate list while building (pgvector's
	// ef_construction): higher is better recall and a slower build.
	EfConstruction int `yaml:"ef_construction"`
	// EfSearch is the candidate list while searching (hnsw.ef_search):
	// higher is better recall and slower queries.
	EfSearch int `yaml:"ef_search"`
	// BuildMemory is maintenance_work_mem for the build, e.g. 2GB: a graph
	// that does not fit builds several times slower. Empty: the server's.
	BuildMemory string `yaml:"build_memory"`
}

// Limits are the metadata limits of the config.
func (c Config) Limits() MetadataLimits {
	return MetadataLimits{MaxBytes: c.MaxMetadataBytes, MaxDepth: c.MaxMetadataDepth}
}

// DefaultConfig is a SQLite file under data/.
func DefaultConfig() Config {
	return Config{Store: "sqlite", Path: "data/memory.db", Namespace: "default", Sync: "normal", MaxMetadataBytes: 16 << 10, MaxMetadataDepth: 16,
		MaxConns: 10, HNSW: HNSW{MinRows: 10000, M: 16, EfConstruction: 64, EfSearch: 100}}
}

var memSize = regexp.MustCompile(`^[1-9][0-9]*(kB|MB|GB|TB)$`)

// Validate checks every key.
func (c Config) Validate() error {
	var e valid.Errors
	e.OneOf("store", c.Store, "sqlite", "postgres", "memory")
	if c.Store == "sqlite" && c.Path == "" {
		e.Add("path", "must name a file when memory.store is sqlite")
	}
	if c.Store == "postgres" {
		if err := CheckDSN(c.DSN); err != nil {
			e.Add("dsn", "%v", err)
		}
	}
	if c.Namespace == "" {
		e.Add("namespace", "must not be empty")
	}
	e.OneOf("sync", c.Sync, "normal", "full")
	e.AtLeast("max_metadata_bytes", c.MaxMetadataBytes, 2)
	e.AtLeast("max_metadata_depth", c.MaxMetadataDepth, 1)
	e.AtLeast("max_conns", c.MaxConns, 1)
	h := c.HNSW
	e.AtLeast("hnsw.min_rows", h.MinRows, 0)
	if h.M < 2 || h.M > 100 {
		e.Add("hnsw.m", "%d is outside pgvector's [2, 100]", h.M)
	}
	if h.EfConstruction < 2*h.M || h.EfConstruction > 1000 {
		e.Add("hnsw.ef_construction", "%d is outside pgvector's [2 × m, 1000]", h.EfConstruction)
	}
	if h.EfSearch < 1 || h.EfSearch > 1000 {
		e.Add("hnsw.ef_search", "%d is outside pgvector's [1, 1000]", h.EfSearch)
	}
	if h.BuildMemory != "" && !memSize.MatchString(h.BuildMemory) {
		e.Add("hnsw.build_memory", "%q is not a size such as 512MB or 2GB", h.BuildMemory)
	}
	return e.Err()
}

// CheckDSN checks a PostgreSQL connection string: it parses, and it holds
// no password.
func CheckDSN(dsn string) error {
	if dsn == "" {
		return errors.New("is empty: name the PostgreSQL database, e.g. postgres://agemem@db:5432/agemem")
	}
	if dsnHasPassword(dsn) {
		return errors.New("holds a password: set PGPASSWORD (or a ~/.pgpass entry) instead, so that it is never written to a config file, a shell history or a log")
	}
	if _, err := pgconn.ParseConfig(dsn); err != nil {
		// pgconn's message may quote the string; it holds no password here.
		return err
	}
	return nil
}

func dsnHasPassword(dsn string) bool {
	if strings.HasPrefix(dsn, "postgres://") || strings.HasPrefix(dsn, "postgresql://") {
		u, err := url.Parse(dsn)
		if err != nil {
			return strings.Contains(dsn, "password")
		}
		_, set := u.User.Password()
		return set || u.Query().Has("password")
	}
	return regexp.MustCompile(`(^|\s)password\s*=`).MatchString(dsn)
}
