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
