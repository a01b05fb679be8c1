package ltm

// Schema upgrades: a populated store of every earlier schema version opens
// in this build with every row intact (letta #2117), and a newer one is
// refused without being touched.

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/pgvector/pgvector-go"

	"github.com/agemem/agemem/internal/pgschema"
	"github.com/agemem/agemem/internal/pgtest"
)

// fixtureEntries are the rows each old-version fixture writes, in two
// namespaces, with metadata, types and timestamps to the nanosecond.
func fixtureEntries() map[string][]Entry {
	out := map[string][]Entry{}
	at := time.Date(2025, 1, 2, 3, 4, 5, 678901234, time.UTC)
	for i := range 30 {
		ns := []string{"alice", "bob"}[i%2]
		c := fmt.Sprintf("%s's memory number %d", ns, i)
		out[ns] = append(out[ns], Entry{ID: formatID(uint32(0xa000 + i)), Content: c, Embedding: unit(enc.One(c)),
			Metadata: map[string]any{"i": float64(i), "tags": []any{"x", "y"}}, MemoryType: "fact",
			Created: at.Add(time.Duration(i) * time.Second), Updated: at.Add(time.Duration(i)*time.Second + 7)})
	}
	return out
}

// pgFixtures[v] writes fixtureEntries into a database at memory schema
// version v, with that version's SQL. A new migration adds the fixture of
// the version it leaves behind.
var pgFixtures = map[int]func(ctx context.Context, conn *pgx.Conn, es map[string][]Entry) error{
	1: func(ctx context.Context, conn *pgx.Conn, es map[string][]Entry) error {
		for ns, list := range es {
			for _, e := range list {
				md := fmt.Sprintf(`{"i": %v, "tags": ["x", "y"]}`, e.Metadata["i"])
				if _, err := conn.Exec(ctx, `INSERT INTO agemem_memories (namespace, id, content, embedding, dim, metadata, memory_type, created, updated)
					VALUES ($1, $2, $3, $4::real[]::vector, $5, $6, $7, $8, $9)`, ns, e.ID, e.Content, e.Embedding, len(e.Embedding), md,
					e.MemoryType, e.Created.UnixNano(), e.Updated.UnixNano()); err != nil {
					return err
				}
			}
		}
		return nil
	},
}

func checkFixture(t *testing.T, db DB, want map[string][]Entry) {
	t.Helper()
	ctx := context.Background()
	for ns, es := range want {
		st, _ := db.Namespace(ns)
		got, err := st.List(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if len(got) != len(es) {
			t.Fatalf("%s: %d memories after the upgrade, want %d", ns, len(got), len(es))
		}
		if Checksum(got) != Checksum(es) {
			t.Fatalf("%s: the memories changed in the upgrade:\n%+v\nwant\n%+v", ns, got[0], es[0])
		}
	}
}

// TestPostgresUpgradesEveryVersion, from every version to this build's
// (the last case opens a database already at it: its fixture is checked
// too).
func TestPostgresUpgradesEveryVersion(t *testing.T) {
	ctx := context.Background()
	for v := range len(pgMigrations) + 1 {
		t.Run(fmt.Sprintf("from version %d", v), func(t *testing.T) {
			dsn, _ := pgtest.Schema(t)
			conn := pgtest.Conn(t, dsn)
			if _, err := pgschema.Apply(ctx, conn, "memory", pgMigrations[:v]); err != nil {
				t.Fatal(err)
			}
			want := map[string][]Entry{}
			if v > 0 {
				fill, ok := pgFixtures[v]
				if !ok {
					t.Fatalf("no fixture writes a version %d database: add pgFixtures[%d]", v, v)
				}
				want = fixtureEntries()
				if err := fill(ctx, conn, want); err != nil {
					t.Fatal(err)
				}
			}
			p := openPG(t, PostgresOptions{DSN: dsn})
			checkFixture(t, p, want)
			if got, _ := pgschema.Version(ctx, conn, "memory"); got != PostgresSchemaVersion {
				t.Fatalf("schema version %d after opening, want %d", got, PostgresSchemaVersion)
			}
		})
	}
}

// TestPostgresRefusesNewerSchema: a database a newer build migrated is not
// opened, and not touched.
func TestPostgresRefusesNewerSchema(t *testing.T) {
	ctx := context.Background()
	dsn, _ := pgtest.Schema(t)
	p := openPG(t, PostgresOptions{DSN: dsn})
	ns, _ := p.Namespace("alice")
	ns.Add(ctx, entry("kept", nil))
	conn := pgtest.Conn(t, dsn)
	if _, err := conn.Exec(ctx, "UPDATE agemem_schema SET version = $1 WHERE component = 'memory'", PostgresSchemaVersion+1); err != nil {
		t.Fatal(err)
	}
	_, err := OpenPostgres(ctx, PostgresOptions{DSN: dsn, HNSW: HNSW{M: 16, EfConstruction: 64, EfSearch: 40}})
	if !errors.Is(err, pgschema.ErrNewer) {
		t.Fatalf("open a newer schema: %v", err)
	}
	var n int
	conn.QueryRow(ctx, "SELECT count(*) FROM agemem_memories").Scan(&n)
	if v, _ := pgschema.Version(ctx, conn, "memory"); n != 1 || v != PostgresSchemaVersion+1 {
		t.Fatalf("the refused database changed: %d rows, version %d", n, v)
	}
}

// TestPostgresReplicasMigrateOnce: eight processes opening one empty
// database together all succeed; the schema is made once.
func TestPostgresReplicasMigrateOnce(t *testing.T) {
	dsn, _ := pgtest.Schema(t)
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for range 8 {
		wg.Go(func() {
			p, err := OpenPostgres(context.Background(), PostgresOptions{DSN: dsn, HNSW: DefaultConfig().HNSW})
			if err != nil {
				errs <- err
				return
			}
			p.Close()
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
}

// TestSQLiteUpgradesEveryVersion: the SQLite file of every earlier schema
// version, populated, opens with every row intact.
func TestSQLiteUpgradesEveryVersion(t *testing.T) {
	for v := 1; v < SchemaVersion; v++ {
		t.Run(fmt.Sprintf("from version %d", v), func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "m.db")
			raw, err := sql.Open("sqlite", "file:"+path)
			if err != nil {
				t.Fatal(err)
			}
			for i := range v {
				if _, err := raw.Exec(migrations[i]); err != nil {
					t.Fatal(err)
				}
			}
			raw.Exec(fmt.Sprintf("PRAGMA user_version = %d", v))
			want := fixtureEntries()
			seq := 0
			for ns, es := range want {
				for _, e := range es {
					seq++
					args := []any{ns, e.ID, e.Content, encodeVec(e.Embedding),
						fmt.Sprintf(`{"i":%v,"tags":["x","y"]}`, e.Metadata["i"]), e.MemoryType, e.Created.UnixNano(), e.Updated.UnixNano()}
					// Version 1 orders rows by seq; version 2 on by rowid.
					insert := `INSERT INTO memories (namespace, id, content, embedding, metadata, memory_type, created, updated) VALUES (?, ?, ?, ?, ?, ?, ?, ?)`
					if v == 1 {
						insert = `INSERT INTO memories (namespace, id, content, embedding, metadata, memory_type, created, updated, seq) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)`
						args = append(args, seq)
					}
					if _, err := raw.Exec(insert, args...); err != nil {
						t.Fatal(err)
					}
				}
			}
			raw.Close()
			db, err := OpenSQLite(path, SQLiteOptions{})
			if err != nil {
				t.Fatal(err)
			}
			defer db.Close()
			checkFixture(t, db, want)
		})
	}
}

// TestPostgresVectorRoundTrip: what the store writes is what it reads,
// bit for bit (the checksums of a migration compare them).
func TestPostgresVectorRoundTrip(t *testing.T) {
	p := openPG(t, PostgresOptions{})
	var back pgvector.Vector
	v := unit([]float32{0.1, -3, 1e-30, 7})
	if err := p.pool.QueryRow(context.Background(), "SELECT $1::vector", pgvector.NewVector(v)).Scan(&back); err != nil {
		t.Fatal(err)
	}
	for i, x := range back.Slice() {
		if x != v[i] {
			t.Fatalf("component %d: %v came back as %v", i, v[i], x)
		}
	}
}
