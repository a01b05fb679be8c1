// Package pgtest gives tests a PostgreSQL database with pgvector: the one
// AGEMEM_TEST_PG_DSN names (scripts/pg.sh start prints it, .ci/run sets
// it), in a schema of each test's own. Without it a test skips, unless
// AGEMEM_REQUIRE_PG=1 (CI), where it fails.
package pgtest

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
)

// DSN is the test database.
func DSN(t testing.TB) string {
	t.Helper()
	dsn := os.Getenv("AGEMEM_TEST_PG_DSN")
	if dsn == "" {
		if os.Getenv("AGEMEM_REQUIRE_PG") == "1" {
			t.Fatal("AGEMEM_REQUIRE_PG=1 but AGEMEM_TEST_PG_DSN is not set: start PostgreSQL with pgvector (scripts/pg.sh start DIR)")
		}
		t.Skip("no PostgreSQL: set AGEMEM_TEST_PG_DSN (scripts/pg.sh install && scripts/pg.sh start DIR prints it)")
	}
	return dsn
}

// WithParam adds a run-time parameter to a DSN of either form (URL or
// key=value pairs).
func WithParam(dsn, key, value string) string {
	if strings.HasPrefix(dsn, "postgres://") || strings.HasPrefix(dsn, "postgresql://") {
		sep := "?"
		if strings.Contains(dsn, "?") {
			sep = "&"
		}
		return dsn + sep + key + "=" + value
	}
	return dsn + " " + key + "=" + value
}

// Schema creates an empty schema for the test, dropped at its end, and
// returns a DSN whose tables land there (pgvector's types stay in public)
// and the schema's name.
func Schema(t testing.TB) (dsn, schema string) {
	t.Helper()
	base := DSN(t)
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, base)
	if err != nil {
		if os.Getenv("AGEMEM_REQUIRE_PG") == "1" {
			t.Fatalf("connect to AGEMEM_TEST_PG_DSN: %v", err)
		}
		t.Skipf("PostgreSQL at AGEMEM_TEST_PG_DSN does not answer: %v", err)
	}
	defer conn.Close(ctx)
	// pgvector goes to public, once, before any test's schema exists: an
	// extension made inside a test's schema would go when it is dropped.
	// The lock keeps test packages running at once from racing to make it.
	if _, err := conn.Exec(ctx, `SELECT pg_advisory_lock(7370); CREATE EXTENSION IF NOT EXISTS vector SCHEMA public; SELECT pg_advisory_unlock(7370)`); err != nil {
		t.Fatalf("create the vector extension: %v", err)
	}
	schema = fmt.Sprintf("t_%08x", rand.Uint32())
	if _, err := conn.Exec(ctx, "CREATE SCHEMA "+schema); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		c, err := pgx.Connect(context.Background(), base)
		if err != nil {
			return
		}
		defer c.Close(context.Background())
		c.Exec(context.Background(), "DROP SCHEMA "+schema+" CASCADE")
	})
	return WithParam(base, "search_path", schema+",public"), schema
}

// Conn is a connection to dsn, closed at the test's end.
func Conn(t testing.TB, dsn string) *pgx.Conn {
	t.Helper()
	c, err := pgx.Connect(context.Background(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close(context.Background()) })
	return c
}

// Cluster is a PostgreSQL server of the test's own (scripts/pg.sh start),
// for tests that stop and restart the database under a running program.
// It listens on a unix socket in Dir only.
type Cluster struct {
	Dir, DSN string
	script   string
}

// NewCluster starts a new cluster, stopped and removed at the test's end.
// Without PostgreSQL 15 and pgvector installed (scripts/pg.sh install) it
// skips, unless AGEMEM_REQUIRE_PG=1, where it fails.
func NewCluster(t testing.TB) *Cluster {
	t.Helper()
	root, err := repoRoot()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat("/usr/share/postgresql/15/extension/vector.control"); err != nil {
		if os.Getenv("AGEMEM_REQUIRE_PG") == "1" {
			t.Fatal("AGEMEM_REQUIRE_PG=1 but PostgreSQL 15 with pgvector is not installed (scripts/pg.sh install)")
		}
		t.Skip("PostgreSQL 15 with pgvector is not installed (scripts/pg.sh install, as root)")
	}
	// Not t.TempDir: its parent is private to this user, and as root the
	// server runs as postgres, which must reach the directory.
	dir, err := os.MkdirTemp("", "agemem-pg-")
	if err != nil {
		t.Fatal(err)
	}
	os.Chmod(dir, 0o755)
	c := &Cluster{Dir: dir, script: filepath.Join(root, "scripts", "pg.sh")}
	t.Cleanup(func() {
		exec.Command("bash", c.script, "stop", dir).Run()
		os.RemoveAll(dir)
	})
	c.Start(t)
	c.DSN = fmt.Sprintf("host=%s user=agemem dbname=postgres", dir)
	return c
}

// Start starts the server (again).
func (c *Cluster) Start(t testing.TB) {
	t.Helper()
	if out, err := exec.Command("bash", c.script, "start", c.Dir).CombinedOutput(); err != nil {
		t.Fatalf("scripts/pg.sh start %s: %v\n%s", c.Dir, err, out)
	}
}

// Stop stops the server (a fast shutdown: connections are cut).
func (c *Cluster) Stop(t testing.TB) {
	t.Helper()
	if out, err := exec.Command("bash", c.script, "stop", c.Dir).CombinedOutput(); err != nil {
		t.Fatalf("scripts/pg.sh stop %s: %v\n%s", c.Dir, err, out)
	}
}

// repoRoot is the directory of go.mod, above the test's.
func repoRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", fmt.Errorf("no go.mod above the test's directory")
		}
		dir = parent
	}
}
