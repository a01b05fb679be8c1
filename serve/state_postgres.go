package serve

// The state in PostgreSQL (serve.state postgres), so that replicas are
// interchangeable: a session's context and turn count are a row, the
// answer recorded under an idempotency key another, and the requests of one
// session (or key) take turns through an advisory lock.
//
// Why an advisory lock held on a connection, not a row lock held by a
// transaction: a request holds its session for as long as the model takes
// (seconds, up to serve.request_timeout), and a transaction open that long
// holds back vacuum on every table and meets idle_in_transaction timeouts;
// a session-level advisory lock needs no transaction, and like a row lock it
// goes with the connection: a replica killed mid-request frees its sessions
// the moment its connections close (a machine that dies, after
// serve.state_keepalive's probes). A request's state is read and written on
// the connection that holds its locks, and its session's next state and its
// recorded answer are committed in one transaction before the answer is
// sent: an answer the client saw was saved, and one that was not saved is
// a 503 the client retries.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgconn/ctxwatch"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/agemem/agemem/internal/pgschema"
	"github.com/agemem/agemem/memtools/ltm"
	"github.com/agemem/agemem/memtools/stm"
	"github.com/agemem/agemem/model/chat"
)

// pgStateMigrations[i] takes the serve schema from version i to i+1
// (pgschema.Apply, component "serve"); append, never edit. Contexts and
// answers are bytea, not jsonb or text: a message may hold U+0000, which
// neither keeps.
var pgStateMigrations = []string{
	`CREATE TABLE agemem_sessions (
		namespace text        NOT NULL,
		id        text        NOT NULL,
		context   bytea       NOT NULL, -- JSON: the messages of the short-term context
		turns     integer     NOT NULL, -- requests that succeeded; the row's version
		last_used timestamptz NOT NULL,
		PRIMARY KEY (namespace, id)
	);
	CREATE INDEX agemem_sessions_ns_last ON agemem_sessions (namespace, last_used);
	CREATE INDEX agemem_sessions_last ON agemem_sessions (last_used);
	-- why a session that went is gone, for the next request naming it
	CREATE TABLE agemem_sessions_gone (
		namespace text        NOT NULL,
		id        text        NOT NULL,
		why       text        NOT NULL, -- expired | evicted
		at        timestamptz NOT NULL,
		PRIMARY KEY (namespace, id)
	);
	CREATE TABLE agemem_idempotency (
		namespace   text        NOT NULL,
		key         text        NOT NULL,
		fingerprint text        NOT NULL,
		status      integer     NOT NULL,
		header      bytea       NOT NULL, -- JSON object
		body        bytea       NOT NULL,
		expires     timestamptz NOT NULL,
		PRIMARY KEY (namespace, key)
	);
	CREATE INDEX agemem_idempotency_expires ON agemem_idempotency (expires);`,
	// An attempt under a key that has begun and not yet recorded its
	// answer (hold.claim): a row left by a replica that died.
	`CREATE TABLE agemem_idempotency_attempts (
		namespace   text        NOT NULL,
		key         text        NOT NULL,
		fingerprint text        NOT NULL,
		expires     timestamptz NOT NULL,
		PRIMARY KEY (namespace, key)
	);
	CREATE INDEX agemem_idempotency_attempts_expires ON agemem_idempotency_attempts (expires);`,
}

// accountingKey is the advisory lock under which a new session is counted
// against max_sessions and max_sessions_per_namespace, so that replicas
// creating sessions at once do not both take the last place.
var accountingKey = lockKey("session accounting", "", "")

// pgState is the state in one PostgreSQL database.
type pgState struct {
	pool *pgxpool.Pool
	sv   Config
	log  *slog.Logger

	mu       sync.Mutex
	migrated bool
	swept    atomic.Int64 // Unix nanoseconds of the last sweep of expired answers
}

// openPGState prepares the pool and migrates the serve schema (once,
// however many replicas start together); a replica starts while the
// database is down, and migrates when it returns.
func openPGState(dsn string, sv Config, log *slog.Logger) (*pgState, error) {
	if err := ltm.CheckDSN(dsn); err != nil {
		return nil, fmt.Errorf("memory.dsn %w", err)
	}
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		return nil, fmt.Errorf("memory.dsn: %w", err)
	}
	cfg.MaxConns = int32(sv.StateConns)
	cc := cfg.ConnConfig
	if _, ok := cc.RuntimeParams["application_name"]; !ok {
		cc.RuntimeParams["application_name"] = "agemem serve"
	}
	// The server probes a silent connection after state_keepalive, 3
	// times at that interval: a dead replica's locks go within about 4×.
	ka := strconv.Itoa(max(1, int(sv.StateKeepalive.Seconds())))
	cc.RuntimeParams["tcp_keepalives_idle"] = ka
	cc.RuntimeParams["tcp_keepalives_interval"] = ka
	cc.RuntimeParams["tcp_keepalives_count"] = "3"
	// A request that gives up waiting for a session's lock cancels the
	// wait on the server (the default closes the connection, and the
	// server would take the lock for a client no longer there).
	cc.BuildContextWatcherHandler = func(c *pgconn.PgConn) ctxwatch.Handler {
		return &pgconn.CancelRequestContextWatcherHandler{Conn: c, DeadlineDelay: 2 * time.Second}
	}
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		return nil, err
	}
	p := &pgState{pool: pool, sv: sv, log: log}
	// Migrate now if the database answers (replicas starting together
	// migrate once: pgschema's lock); a database that is down is migrated
	// when it returns, and a schema this build cannot use stops the start.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := p.ready(ctx); err != nil {
		if !ltm.Unavailable(err) {
			pool.Close()
			return nil, err
		}
		log.Warn("the state's database cannot be reached: the server starts not ready and migrates when it answers", "err", err)
	}
	return p, nil
}

// ready migrates the serve schema the first time the database answers.
func (p *pgState) ready(ctx context.Context) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.migrated {
		return nil
	}
	from, err := pgschema.Apply(ctx, p.pool, "serve", pgStateMigrations)
	if err != nil {
		return fmt.Errorf("migrate the serve schema: %w", err)
	}
	if from < len(pgStateMigrations) {
		p.log.Info("migrated the serve schema", "from", from, "to", len(pgStateMigrations))
	}
	p.migrated = true
	return nil
}

func (p *pgState) hold() hold { return &pgHold{p: p} }

func (p *pgState) sessions(ctx context.Context) (int, error) {
	if err := p.ready(ctx); err != nil {
		return 0, err
	}
	var n int
	err := p.pool.QueryRow(ctx, "SELECT count(*) FROM agemem_sessions").Scan(&n)
	return n, err
}

func (p *pgState) ping(ctx context.Context) error {
	if err := p.ready(ctx); err != nil {
		return err
	}
	return p.pool.Ping(ctx)
}

func (p *pgState) close() { p.pool.Close() }

// pgHold is a request's hold: one connection, taken when the request
// first needs it, holding the advisory locks of its key and session.
type pgHold struct {
	p    *pgState
	c    *pgxpool.Conn
	sess *heldSession
	key  *keyID
}

type heldSession struct {
	ns, id string
	turns  int
	stored bool // a row existed when the request took the session
}

func (h *pgHold) conn(ctx context.Context) (*pgxpool.Conn, error) {
	if h.c != nil {
		return h.c, nil
	}
	if err := h.p.ready(ctx); err != nil {
		return nil, err
	}
	c, err := h.p.pool.Acquire(ctx)
	if err != nil {
		return nil, err
	}
	h.c = c
	return c, nil
}

// lock takes an advisory lock on the hold's connection, waiting for it.
func (h *pgHold) lock(ctx context.Context, key int64) (*pgxpool.Conn, error) {
	c, err := h.conn(ctx)
	if err != nil {
		return nil, err
	}
	if _, err := c.Exec(ctx, "SELECT pg_advisory_lock($1)", key); err != nil {
		return nil, err
	}
	return c, nil
}

func (h *pgHold) claim(ctx context.Context, ns, key, fp string) (*storedAnswer, bool, error) {
	c, err := h.lock(ctx, lockKey("idempotency", ns, key))
	if err != nil {
		return nil, false, err
	}
	h.key = &keyID{ns, key}
	var a storedAnswer
	var header []byte
	err = c.QueryRow(ctx, `SELECT fingerprint, status, header, body FROM agemem_idempotency
		WHERE namespace = $1 AND key = $2 AND expires > now()`, ns, key).Scan(&a.fingerprint, &a.status, &header, &a.body)
	if errors.Is(err, pgx.ErrNoRows) {
		// The attempt is noted, committed, before the request runs; the
		// statement's snapshot still shows an earlier attempt's row.
		var earlier *string
		err = c.QueryRow(ctx, `WITH earlier AS (SELECT fingerprint FROM agemem_idempotency_attempts
				WHERE namespace = $1 AND key = $2 AND expires > now())
			INSERT INTO agemem_idempotency_attempts (namespace, key, fingerprint, expires)
			VALUES ($1, $2, $3, now() + make_interval(secs => $4))
			ON CONFLICT (namespace, key) DO UPDATE SET fingerprint = EXCLUDED.fingerprint, expires = EXCLUDED.expires
			RETURNING (SELECT fingerprint FROM earlier)`, ns, key, fp, h.p.sv.IdempotencyTTL.Seconds()).Scan(&earlier)
		return nil, err == nil && earlier != nil && *earlier == fp, err
	}
	if err != nil {
		return nil, false, err
	}
	if err := json.Unmarshal(header, &a.header); err != nil {
		return nil, false, fmt.Errorf("the answer recorded under key %q of namespace %q: header: %w", key, ns, err)
	}
	return &a, false, nil
}

func (h *pgHold) forget(ctx context.Context) {
	if h.key == nil || h.c == nil {
		return
	}
	if _, err := h.c.Exec(ctx, "DELETE FROM agemem_idempotency_attempts WHERE namespace = $1 AND key = $2", h.key.ns, h.key.key); err != nil {
		h.p.log.Warn("forget an idempotency attempt", "err", err) // it expires with serve.idempotency_ttl
	}
}

func (h *pgHold) session(ctx context.Context, ns, id string, tok stm.Tokenizer) (sessionState, error) {
	c, err := h.lock(ctx, lockKey("session", ns, id))
	if err != nil {
		return sessionState{}, err
	}
	h.sess = &heldSession{ns: ns, id: id}
	var st sessionState
	var raw []byte
	var expired bool
	err = c.QueryRow(ctx, `SELECT context, turns, last_used < now() - make_interval(secs => $3)
		FROM agemem_sessions WHERE namespace = $1 AND id = $2`, ns, id, h.p.sv.SessionTTL.Seconds()).Scan(&raw, &st.turns, &expired)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		err = c.QueryRow(ctx, "DELETE FROM agemem_sessions_gone WHERE namespace = $1 AND id = $2 RETURNING why", ns, id).Scan(&st.reset)
		if errors.Is(err, pgx.ErrNoRows) {
			err = nil
		}
		return st, err
	case err != nil:
		return st, err
	case expired:
		if _, err := c.Exec(ctx, "DELETE FROM agemem_sessions WHERE namespace = $1 AND id = $2", ns, id); err != nil {
			return st, err
		}
		return sessionState{reset: "expired"}, nil
	}
	var msgs []chat.Message
	if err := json.Unmarshal(raw, &msgs); err != nil {
		return st, fmt.Errorf("session %q of namespace %q: context: %w", id, ns, err)
	}
	st.ctx = stm.New(tok)
	st.ctx.Append(msgs...)
	h.sess.turns, h.sess.stored = st.turns, true
	return st, nil
}

func (h *pgHold) dropSession(ctx context.Context, ns, id string) (bool, error) {
	c, err := h.lock(ctx, lockKey("session", ns, id))
	if err != nil {
		return false, err
	}
	tag, err := c.Exec(ctx, "DELETE FROM agemem_sessions WHERE namespace = $1 AND id = $2", ns, id)
	return tag.RowsAffected() > 0, err
}

func (h *pgHold) commit(ctx context.Context, next *sessionState, ans *storedAnswer) error {
	if (next == nil || h.sess == nil) && (ans == nil || h.key == nil) {
		return nil
	}
	c, err := h.conn(ctx)
	if err != nil {
		return err
	}
	err = pgx.BeginFunc(ctx, c, func(tx pgx.Tx) error {
		if next != nil && h.sess != nil {
			if err := h.saveSession(ctx, tx, next); err != nil {
				return err
			}
		}
		if ans != nil && h.key != nil {
			header, _ := json.Marshal(ans.header)
			if _, err := tx.Exec(ctx, `INSERT INTO agemem_idempotency (namespace, key, fingerprint, status, header, body, expires)
				VALUES ($1, $2, $3, $4, $5, $6, now() + make_interval(secs => $7))
				ON CONFLICT (namespace, key) DO UPDATE SET fingerprint = EXCLUDED.fingerprint, status = EXCLUDED.status,
					header = EXCLUDED.header, body = EXCLUDED.body, expires = EXCLUDED.expires`,
				h.key.ns, h.key.key, ans.fingerprint, ans.status, header, ans.body, h.p.sv.IdempotencyTTL.Seconds()); err != nil {
				return err
			}
			if _, err := tx.Exec(ctx, "DELETE FROM agemem_idempotency_attempts WHERE namespace = $1 AND key = $2", h.key.ns, h.key.key); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return err
	}
	if next != nil && h.sess != nil {
		h.sess.turns, h.sess.stored = next.turns, true
	}
	h.sweep(ctx, c)
	return nil
}

// saveSession writes the session's next state: an update of the row the
// request read (refused if another request changed it meanwhile), else a
// new row, counted against the limits.
func (h *pgHold) saveSession(ctx context.Context, tx pgx.Tx, next *sessionState) error {
	s := h.sess
	raw, err := json.Marshal(next.ctx.Messages())
	if err != nil {
		return err
	}
	if s.stored {
		tag, err := tx.Exec(ctx, `UPDATE agemem_sessions SET context = $3, turns = $4, last_used = now()
			WHERE namespace = $1 AND id = $2 AND turns = $5`, s.ns, s.id, raw, next.turns, s.turns)
		if err != nil || tag.RowsAffected() == 1 {
			return err
		}
		var turns int
		err = tx.QueryRow(ctx, "SELECT turns FROM agemem_sessions WHERE namespace = $1 AND id = $2", s.ns, s.id).Scan(&turns)
		if err == nil {
			return errSessionMoved
		}
		if !errors.Is(err, pgx.ErrNoRows) {
			return err
		}
		// Evicted or deleted while the request ran: it starts afresh
		// with this request's context.
	}
	sv := h.p.sv
	ttl := sv.SessionTTL.Seconds()
	b := &pgx.Batch{}
	b.Queue("SELECT pg_advisory_xact_lock($1)", accountingKey)
	// Sessions past the TTL go, remembered as expired for a while.
	b.Queue(`WITH gone AS (DELETE FROM agemem_sessions WHERE last_used < now() - make_interval(secs => $1) RETURNING namespace, id)
		INSERT INTO agemem_sessions_gone (namespace, id, why, at) SELECT namespace, id, 'expired', now() FROM gone
		ON CONFLICT (namespace, id) DO UPDATE SET why = EXCLUDED.why, at = EXCLUDED.at`, ttl)
	b.Queue("DELETE FROM agemem_sessions_gone WHERE at < now() - make_interval(secs => $1)", ttl)
	// A tenant at its cap loses its own least recently used session; a
	// server at its cap, one of the tenant holding the most.
	b.Queue(`WITH victim AS (
			SELECT namespace, id FROM agemem_sessions WHERE namespace = $1
			AND (SELECT count(*) FROM agemem_sessions WHERE namespace = $1) >= $2
			ORDER BY last_used, id LIMIT 1),
		gone AS (DELETE FROM agemem_sessions s USING victim v WHERE s.namespace = v.namespace AND s.id = v.id RETURNING s.namespace, s.id)
		INSERT INTO agemem_sessions_gone (namespace, id, why, at) SELECT namespace, id, 'evicted', now() FROM gone
		ON CONFLICT (namespace, id) DO UPDATE SET why = EXCLUDED.why, at = EXCLUDED.at`, s.ns, sv.MaxSessionsPerNamespace)
	b.Queue(`WITH heaviest AS (
			SELECT namespace FROM agemem_sessions GROUP BY namespace
			HAVING (SELECT count(*) FROM agemem_sessions) >= $1
			ORDER BY count(*) DESC, namespace LIMIT 1),
		victim AS (
			SELECT s.namespace, s.id FROM agemem_sessions s JOIN heaviest h USING (namespace)
			ORDER BY s.last_used, s.id LIMIT 1),
		gone AS (DELETE FROM agemem_sessions s USING victim v WHERE s.namespace = v.namespace AND s.id = v.id RETURNING s.namespace, s.id)
		INSERT INTO agemem_sessions_gone (namespace, id, why, at) SELECT namespace, id, 'evicted', now() FROM gone
		ON CONFLICT (namespace, id) DO UPDATE SET why = EXCLUDED.why, at = EXCLUDED.at`, sv.MaxSessions)
	b.Queue(`INSERT INTO agemem_sessions (namespace, id, context, turns, last_used) VALUES ($1, $2, $3, $4, now())`, s.ns, s.id, raw, next.turns)
	b.Queue("DELETE FROM agemem_sessions_gone WHERE namespace = $1 AND id = $2", s.ns, s.id)
	err = tx.SendBatch(ctx, b).Close()
	var pe *pgconn.PgError
	if errors.As(err, &pe) && pe.Code == "23505" { // another request stored it meanwhile
		return errSessionMoved
	}
	return err
}

// sweep deletes expired answers, at most once a minute per replica.
func (h *pgHold) sweep(ctx context.Context, c *pgxpool.Conn) {
	now := time.Now().UnixNano()
	last := h.p.swept.Load()
	if now-last < int64(time.Minute) || !h.p.swept.CompareAndSwap(last, now) {
		return
	}
	for _, table := range []string{"agemem_idempotency", "agemem_idempotency_attempts"} {
		if _, err := c.Exec(ctx, "DELETE FROM "+table+" WHERE expires < now()"); err != nil {
			h.p.log.Warn("sweep expired idempotency answers", "table", table, "err", err)
		}
	}
}

// release unlocks what the request locked and returns the connection; one
// that cannot be unlocked is closed, which ends its locks with it.
func (h *pgHold) release() {
	if h.c == nil {
		return
	}
	c := h.c
	h.c = nil
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := c.Exec(ctx, "SELECT pg_advisory_unlock_all()"); err != nil {
		c.Conn().Close(ctx)
	}
	c.Release()
}
