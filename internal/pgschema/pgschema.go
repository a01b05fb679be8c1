// Package pgschema migrates the PostgreSQL schema of one component of
// agemem (the memory store, the server's sessions) with versioned,
// append-only steps: each component's version is a row of agemem_schema,
// and Apply runs the missing steps in one transaction under an advisory
// lock, so replicas that start together migrate once and a failed step
// leaves the database as it was.
package pgschema

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
)

// lockKey is the advisory lock every migration of every component takes
// (pg_advisory_xact_lock's bigint space: "agemem" in ASCII).
const lockKey = 0x616765_6d656d

// ErrNewer is a database whose schema a newer build wrote.
var ErrNewer = errors.New("the database schema is newer than this build")

// Conn is what Apply needs of a connection (a *pgx.Conn, a pool).
type Conn interface {
	Begin(ctx context.Context) (pgx.Tx, error)
}

// Apply brings component's schema to version len(steps): steps[i] takes it
// from version i to i+1 and is never edited once released (append a new
// step instead). It returns the version found. A database at a version
// above len(steps) is refused (ErrNewer) and left alone.
func Apply(ctx context.Context, c Conn, component string, steps []string) (from int, err error) {
	tx, err := c.Begin(ctx)
	if err != nil {
		return 0, err
	}
	defer tx.Rollback(ctx)
	if _, err := tx.Exec(ctx, "SELECT pg_advisory_xact_lock($1)", int64(lockKey)); err != nil {
		return 0, fmt.Errorf("take the migration lock: %w", err)
	}
	if _, err := tx.Exec(ctx, `CREATE TABLE IF NOT EXISTS agemem_schema (
		component text PRIMARY KEY,
		version   integer NOT NULL,
		migrated  timestamptz NOT NULL DEFAULT now()
	)`); err != nil {
		return 0, fmt.Errorf("create agemem_schema: %w", err)
	}
	err = tx.QueryRow(ctx, "SELECT version FROM agemem_schema WHERE component = $1", component).Scan(&from)
	if err != nil && !errors.Is(err, pgx.ErrNoRows) {
		return 0, fmt.Errorf("read the %s schema version: %w", component, err)
	}
	if from > len(steps) {
		return from, fmt.Errorf("%s schema version %d, this build knows %d: %w; upgrade agemem (a rollback to an older build needs a backup from before the upgrade)",
			component, from, len(steps), ErrNewer)
	}
	if from == len(steps) {
		return from, nil
	}
	for v := from; v < len(steps); v++ {
		if _, err := tx.Exec(ctx, steps[v]); err != nil {
			return from, fmt.Errorf("migrate the %s schema from version %d to %d: %w", component, v, v+1, err)
		}
	}
	if _, err := tx.Exec(ctx, `INSERT INTO agemem_schema (component, version) VALUES ($1, $2)
		ON CONFLICT (component) DO UPDATE SET version = EXCLUDED.version, migrated = now()`, component, len(steps)); err != nil {
		return from, err
	}
	return from, tx.Commit(ctx)
}

// Version is component's schema version (0: none).
func Version(ctx context.Context, c interface {
	QueryRow(context.Context, string, ...any) pgx.Row
}, component string) (int, error) {
	var v int
	err := c.QueryRow(ctx, "SELECT version FROM agemem_schema WHERE component = $1", component).Scan(&v)
	if errors.Is(err, pgx.ErrNoRows) {
		return 0, nil
	}
	var pgErr interface{ SQLState() string }
	if errors.As(err, &pgErr) && pgErr.SQLState() == "42P01" { // no agemem_schema yet
		return 0, nil
	}
	return v, err
}
