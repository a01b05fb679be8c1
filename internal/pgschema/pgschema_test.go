package pgschema

import (
	"context"
	"errors"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/agemem/agemem/internal/pgtest"
)

// steps reshape a populated table three times: a column renamed, one
// added with values computed from the rows, a type widened.
var steps = []string{
	`CREATE TABLE notes (id integer PRIMARY KEY, body text NOT NULL)`,
	`ALTER TABLE notes RENAME COLUMN body TO content`,
	`ALTER TABLE notes ADD COLUMN length integer; UPDATE notes SET length = length(content); ALTER TABLE notes ALTER COLUMN length SET NOT NULL`,
	`ALTER TABLE notes ALTER COLUMN id TYPE bigint`,
}

// rows writes 100 notes with the SQL of version v.
func rows(ctx context.Context, t *testing.T, c *pgx.Conn, v int) {
	col := map[int]string{1: "body", 2: "content", 3: "content", 4: "content"}[v]
	extra, val := "", ""
	if v >= 3 {
		extra, val = ", length", ", length($2)"
	}
	for i := range 100 {
		if _, err := c.Exec(ctx, "INSERT INTO notes (id, "+col+extra+") VALUES ($1, $2::text"+val+")", i, "note number "+string(rune('a'+i%26))); err != nil {
			t.Fatal(err)
		}
	}
}

// TestApplyKeepsEveryRowFromEveryVersion: a table populated at each
// version is brought to the last with every row and its derived column.
func TestApplyKeepsEveryRowFromEveryVersion(t *testing.T) {
	ctx := context.Background()
	for v := 1; v <= len(steps); v++ {
		dsn, _ := pgtest.Schema(t)
		c := pgtest.Conn(t, dsn)
		if _, err := Apply(ctx, c, "notes", steps[:v]); err != nil {
			t.Fatal(err)
		}
		rows(ctx, t, c, v)
		from, err := Apply(ctx, c, "notes", steps)
		if err != nil || from != v {
			t.Fatalf("from version %d: %v (found version %d)", v, err, from)
		}
		var n, bad int
		c.QueryRow(ctx, "SELECT count(*), count(*) FILTER (WHERE length <> length(content)) FROM notes").Scan(&n, &bad)
		if n != 100 || bad != 0 {
			t.Fatalf("from version %d: %d rows (want 100), %d with a wrong length", v, n, bad)
		}
		if got, _ := Version(ctx, c, "notes"); got != len(steps) {
			t.Fatalf("version %d, want %d", got, len(steps))
		}
	}
}

// TestApplyIsAllOrNothing: a step that fails leaves the database at the
// version it was, the steps before it in the same run undone.
func TestApplyIsAllOrNothing(t *testing.T) {
	ctx := context.Background()
	dsn, _ := pgtest.Schema(t)
	c := pgtest.Conn(t, dsn)
	if _, err := Apply(ctx, c, "notes", steps[:1]); err != nil {
		t.Fatal(err)
	}
	rows(ctx, t, c, 1)
	broken := append(steps[:2:2], `ALTER TABLE notes ADD COLUMN x integer NOT NULL`) // fails: rows have no x
	if _, err := Apply(ctx, c, "notes", broken); err == nil {
		t.Fatal("a failing step succeeded")
	}
	if v, _ := Version(ctx, c, "notes"); v != 1 {
		t.Fatalf("version %d after a failed migration, want 1", v)
	}
	var n int
	if err := c.QueryRow(ctx, "SELECT count(body) FROM notes").Scan(&n); err != nil || n != 100 {
		t.Fatalf("after a failed migration: %d rows, %v (the rename of step 2 must be undone)", n, err)
	}
	// A newer database is refused and left as it is.
	if _, err := Apply(ctx, c, "notes", nil); !errors.Is(err, ErrNewer) {
		t.Fatalf("an older build opening version 1: %v", err)
	}
}

// TestApplyOnceAcrossReplicas: eight replicas migrating one database at
// the same time run each step once (a step run twice fails: its table
// exists).
func TestApplyOnceAcrossReplicas(t *testing.T) {
	dsn, _ := pgtest.Schema(t)
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for range 8 {
		wg.Go(func() {
			c, err := pgx.Connect(context.Background(), dsn)
			if err != nil {
				errs <- err
				return
			}
			defer c.Close(context.Background())
			_, err = Apply(context.Background(), c, "notes", steps)
			errs <- err
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
}
