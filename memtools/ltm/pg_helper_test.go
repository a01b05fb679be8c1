package ltm

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
)

// pgDSN is the test database (AGEMEM_TEST_PG_DSN, which scripts/pg.sh
// start prints and .ci/run sets). Without it the test skips, unless
// AGEMEM_REQUIRE_PG=1 (CI), where it fails.
func pgDSN(t testing.TB) string {
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

// withParam adds a run-time parameter to a DSN of either form.
func withParam(dsn, key, value string) string {
	if strings.HasPrefix(dsn, "postgres://") || strings.HasPrefix(dsn, "postgresql://") {
		sep := "?"
		if strings.Contains(dsn, "?") {
			sep = "&"
		}
		return dsn + sep + key + "=" + value
	}
	return dsn + " " + key + "=" + value
}

// pgSchema creates an empty schema of its own for a test, dropped at the
// end, and returns a DSN whose tables land there (pgvector's types stay
// in public).
func pgSchema(t testing.TB) string {
	t.Helper()
	dsn := pgDSN(t)
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		if os.Getenv("AGEMEM_REQUIRE_PG") == "1" {
			t.Fatalf("connect to AGEMEM_TEST_PG_DSN: %v", err)
		}
		t.Skipf("PostgreSQL at AGEMEM_TEST_PG_DSN does not answer: %v", err)
	}
	defer conn.Close(ctx)
	schema := fmt.Sprintf("t_%08x", rand.Uint32())
	if _, err := conn.Exec(ctx, "CREATE SCHEMA "+schema); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		c, err := pgx.Connect(context.Background(), dsn)
		if err != nil {
			return
		}
		defer c.Close(context.Background())
		c.Exec(context.Background(), "DROP SCHEMA "+schema+" CASCADE")
	})
	return withParam(dsn, "search_path", schema+",public")
}

// openPG opens a store in a schema of the test's own.
func openPG(t testing.TB, opt PostgresOptions) *Postgres {
	t.Helper()
	if opt.DSN == "" {
		opt.DSN = pgSchema(t)
	}
	if opt.HNSW.M == 0 {
		opt.HNSW = DefaultConfig().HNSW
		opt.HNSW.MinRows = 0
	}
	p, err := OpenPostgres(context.Background(), opt)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	return p
}
