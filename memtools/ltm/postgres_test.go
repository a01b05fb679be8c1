package ltm

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/agemem/agemem/internal/pgtest"
)

// proxy stands between the store and the real server, so a test can cut
// the network (every connection, and new ones refused) and bring it back.
type proxy struct {
	path   string // the unix socket it listens on
	target [2]string
	mu     sync.Mutex
	ln     net.Listener
	conns  []net.Conn
}

func startProxy(t *testing.T, dsn string) (*proxy, string) {
	cfg, err := pgconn.ParseConfig(dsn)
	if err != nil {
		t.Fatal(err)
	}
	p := &proxy{target: [2]string{"tcp", net.JoinHostPort(cfg.Host, fmt.Sprint(cfg.Port))}}
	if strings.HasPrefix(cfg.Host, "/") {
		p.target = [2]string{"unix", fmt.Sprintf("%s/.s.PGSQL.%d", cfg.Host, cfg.Port)}
	}
	dir, err := os.MkdirTemp("", "pgproxy")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.cut(); os.RemoveAll(dir) })
	p.path = filepath.Join(dir, fmt.Sprintf(".s.PGSQL.%d", cfg.Port))
	p.restore(t)
	// The store's DSN: the test's, through the proxy's socket.
	return p, pgtest.WithParam(pgtest.WithParam(dsn, "host", dir), "port", fmt.Sprint(cfg.Port))
}

func (p *proxy) restore(t *testing.T) {
	ln, err := net.Listen("unix", p.path)
	if err != nil {
		t.Fatal(err)
	}
	p.mu.Lock()
	p.ln = ln
	p.mu.Unlock()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			s, err := net.Dial(p.target[0], p.target[1])
			if err != nil {
				c.Close()
				continue
			}
			p.mu.Lock()
			p.conns = append(p.conns, c, s)
			p.mu.Unlock()
			go func() { io.Copy(s, c); s.Close() }()
			go func() { io.Copy(c, s); c.Close() }()
		}
	}()
}

// cut closes the listener (its socket file goes too: connecting fails)
// and every connection through it.
func (p *proxy) cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.ln != nil {
		p.ln.Close()
		p.ln = nil
	}
	for _, c := range p.conns {
		c.Close()
	}
	p.conns = nil
}

// TestPostgresOutage: while the database cannot be reached every call
// fails at once with ErrUnavailable, and when it comes back the same store
// works again, every acknowledged write in place (mem0 #3332).
func TestPostgresOutage(t *testing.T) {
	ctx := context.Background()
	dsn, _ := pgtest.Schema(t)
	px, through := startProxy(t, dsn)
	p := openPG(t, PostgresOptions{DSN: pgtest.WithParam(through, "connect_timeout", "5")})
	ns, _ := p.Namespace("alice")
	var acked []string
	for i := range 20 {
		e, err := ns.Add(ctx, entry(fmt.Sprintf("fact %d before the outage", i), nil))
		if err != nil {
			t.Fatal(err)
		}
		acked = append(acked, e.ID)
	}
	px.cut()
	calls := map[string]func() error{
		"add":      func() error { _, err := ns.Add(ctx, entry("during the outage", nil)); return err },
		"get":      func() error { _, err := ns.Get(ctx, acked[0]); return err },
		"update":   func() error { _, err := ns.Update(ctx, acked[1], "x", enc.One("x"), nil); return err },
		"delete":   func() error { return ns.Delete(ctx, acked[2]) },
		"retrieve": func() error { _, err := ns.Retrieve(ctx, enc.One("fact"), 3, nil); return err },
		"list":     func() error { _, err := ns.List(ctx); return err },
		"count":    func() error { _, err := ns.Count(ctx); return err },
		"import": func() error {
			_, _, err := p.Import(ctx, "alice", []Entry{{Content: "y", Embedding: enc.One("y")}})
			return err
		},
		"namespaces": func() error { _, err := p.Namespaces(ctx); return err },
		"ping":       p.Ping,
	}
	for name, call := range calls {
		start := time.Now()
		err := call()
		if !errors.Is(err, ErrUnavailable) {
			t.Fatalf("%s during the outage: %v, want ErrUnavailable", name, err)
		}
		if d := time.Since(start); d > 5*time.Second {
			t.Fatalf("%s took %v to fail", name, d)
		}
		if strings.Contains(err.Error(), "password") {
			t.Fatalf("%s: the error names a password: %v", name, err)
		}
	}
	px.restore(t)
	for name, call := range calls {
		if name == "delete" || name == "update" {
			continue
		}
		if err := call(); err != nil {
			t.Fatalf("%s after the outage: %v", name, err)
		}
	}
	for _, id := range acked {
		if _, err := ns.Get(ctx, id); err != nil {
			t.Fatalf("acknowledged %s after the outage: %v", id, err)
		}
	}
	if n, _ := ns.Count(ctx); n != 22 { // 20, one add after the outage, one import
		t.Fatalf("Count = %d after the outage, want 22", n)
	}
}

// TestPostgresConnectionsKilled: the server ends every connection of the
// store (pg_terminate_backend, as a failover or an idle timeout does); the
// next calls succeed on new connections, without reopening the store.
func TestPostgresConnectionsKilled(t *testing.T) {
	ctx := context.Background()
	dsn, _ := pgtest.Schema(t)
	app := fmt.Sprintf("agemem_kill_%08x", rand.Uint32())
	p := openPG(t, PostgresOptions{DSN: pgtest.WithParam(dsn, "application_name", app), MaxConns: 4})
	ns, _ := p.Namespace("alice")
	var ids []string
	for i := range 8 {
		e, err := ns.Add(ctx, entry(fmt.Sprintf("fact %d", i), nil))
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, e.ID)
	}
	admin := pgtest.Conn(t, pgtest.DSN(t))
	for round := range 3 {
		var killed int
		if err := admin.QueryRow(ctx, "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE application_name = $1", app).Scan(&killed); err != nil {
			t.Fatal(err)
		}
		if killed == 0 {
			t.Fatal("no connection of the store to kill")
		}
		// At once: the pool still holds the dead connections.
		if _, err := ns.Add(ctx, entry(fmt.Sprintf("fact after kill %d", round), nil)); err != nil {
			t.Fatalf("round %d: add after %d connections were killed: %v", round, killed, err)
		}
		if _, err := ns.Retrieve(ctx, enc.One("fact"), 3, nil); err != nil {
			t.Fatalf("round %d: retrieve: %v", round, err)
		}
		if err := ns.Delete(ctx, ids[round]); err != nil {
			t.Fatalf("round %d: delete: %v", round, err)
		}
	}
	if n, _ := ns.Count(ctx); n != 8 {
		t.Fatalf("Count = %d, want 8", n)
	}
}

// TestPostgresDSNPasswordIsRefused: a password belongs in PGPASSWORD.
func TestPostgresDSNPasswordIsRefused(t *testing.T) {
	for _, dsn := range []string{"postgres://u:hunter2@db/x", "postgresql://u@db/x?password=hunter2", "host=db password=hunter2 user=u"} {
		_, err := OpenPostgres(context.Background(), PostgresOptions{DSN: dsn})
		if err == nil || !strings.Contains(err.Error(), "PGPASSWORD") || strings.Contains(err.Error(), "hunter2") {
			t.Errorf("%s: %v", dsn, err)
		}
	}
}

// TestPostgresWithoutPgvectorSaysWhatToInstall: the package of the
// server's own major version.
func TestPostgresWithoutPgvectorSaysWhatToInstall(t *testing.T) {
	msg := noVector(150018).Error()
	for _, want := range []string{"PostgreSQL 15", "postgresql-15-pgvector", "pgvector_15", "0.8.0"} {
		if !strings.Contains(msg, want) {
			t.Errorf("%q lacks %q", msg, want)
		}
	}
	if !versionLess("0.7.4", "0.8.0") || versionLess("0.8.0", "0.8.0") || !versionLess("0.8.0", "0.10.0") {
		t.Error("versionLess")
	}
}

// TestPostgresCreatesTheExtension: in a new database the first open
// creates the vector extension; a role that may not create it is told
// who can.
func TestPostgresCreatesTheExtension(t *testing.T) {
	ctx := context.Background()
	base := pgtest.DSN(t)
	admin := pgtest.Conn(t, base)
	var super bool
	if err := admin.QueryRow(ctx, "SELECT rolsuper FROM pg_roles WHERE rolname = current_user").Scan(&super); err != nil || !super {
		t.Skip("AGEMEM_TEST_PG_DSN's role is not a superuser: it cannot make the databases and role this test needs")
	}
	name := fmt.Sprintf("agemem_t_%08x", rand.Uint32())
	for _, sql := range []string{"CREATE ROLE " + name + " LOGIN", "CREATE DATABASE " + name + "_a", "CREATE DATABASE " + name + "_b OWNER " + name} {
		if _, err := admin.Exec(ctx, sql); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() {
		for _, sql := range []string{"DROP DATABASE " + name + "_a WITH (FORCE)", "DROP DATABASE " + name + "_b WITH (FORCE)", "DROP ROLE " + name} {
			admin.Exec(context.Background(), sql)
		}
	})
	p := openPG(t, PostgresOptions{DSN: pgtest.WithParam(base, "dbname", name+"_a")})
	ns, _ := p.Namespace("alice")
	if _, err := ns.Add(ctx, entry("in a database that had no vector extension", nil)); err != nil {
		t.Fatal(err)
	}
	var where string
	if err := p.pool.QueryRow(ctx, "SELECT current_database() || ' ' || extversion FROM pg_extension WHERE extname = 'vector'").Scan(&where); err != nil || !strings.HasPrefix(where, name+"_a ") {
		t.Fatalf("the extension: %q, %v", where, err)
	}
	dsn := pgtest.WithParam(pgtest.WithParam(base, "dbname", name+"_b"), "user", name)
	_, err := OpenPostgres(ctx, PostgresOptions{DSN: dsn, HNSW: DefaultConfig().HNSW})
	if err == nil || !strings.Contains(err.Error(), "a superuser must run CREATE EXTENSION vector") {
		t.Fatalf("a role that may not create the extension: %v", err)
	}
}
