package ltm

import (
	"context"
	"testing"

	"github.com/agemem/agemem/internal/pgtest"
)

// openPG opens a store in a schema of the test's own (exact search only,
// unless opt says otherwise).
func openPG(t testing.TB, opt PostgresOptions) *Postgres {
	t.Helper()
	if opt.DSN == "" {
		opt.DSN, _ = pgtest.Schema(t)
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
