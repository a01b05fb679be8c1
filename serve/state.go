package serve

// The state a request shares with the server's other requests, on this
// replica or on any other: the sessions' short-term contexts and the
// answers recorded under idempotency keys. serve.state picks where it
// lives: in this process (memStateStore) or in PostgreSQL (pgState), where
// any replica serves any request of any session.

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"log/slog"
	"net/http"

	"github.com/agemem/agemem/memtools/ltm"
	"github.com/agemem/agemem/memtools/stm"
)

// state is where sessions and recorded answers live.
type state interface {
	// hold starts one request's hold on the state; the request releases
	// it when it ends.
	hold() hold
	// sessions counts the sessions held (the agemem_sessions gauge).
	sessions(ctx context.Context) (int, error)
	// ping checks that the state can be reached (readiness).
	ping(ctx context.Context) error
	close()
}

// A hold is what one request holds: at most one idempotency key and one
// session, each exclusively, so that the requests of a key, and those of a
// session, run one after the other whichever replica serves them. What it
// changes becomes visible at commit, all of it or none.
type hold interface {
	// claim takes key of namespace ns for a request of fingerprint fp,
	// waiting while a request of that key runs, and returns the answer
	// recorded under it (nil: none, so the request runs). Without one it
	// notes the attempt before the request runs: unfinished says an
	// earlier attempt of the same request began and neither recorded an
	// answer nor was forgotten (its replica died, or saving its answer
	// failed), so it may have had its effect.
	claim(ctx context.Context, ns, key, fp string) (ans *storedAnswer, unfinished bool, err error)
	// forget drops the claimed key's attempt: the request ended with a
	// client error and changed nothing, so a retry is a new request.
	forget(ctx context.Context)
	// session takes session id of ns, waiting while a request of it runs,
	// and returns what the session holds, its context counted by tok.
	session(ctx context.Context, ns, id string, tok stm.Tokenizer) (sessionState, error)
	// dropSession forgets session id of ns once no request of it runs
	// (DELETE /v1/sessions/{id}); found says whether there was one.
	dropSession(ctx context.Context, ns, id string) (found bool, err error)
	// commit saves the taken session's next state (nil: unchanged) and the
	// answer to record under the claimed key (nil: none) together.
	commit(ctx context.Context, next *sessionState, ans *storedAnswer) error
	// release lets go of the key and the session.
	release()
}

// sessionState is what a session holds between requests.
type sessionState struct {
	ctx   *stm.Context // nil: the session is new
	turns int          // requests of the session that succeeded
	// reset says why an earlier session of this id is gone: "expired"
	// (serve.session_ttl) or "evicted" (max_sessions,
	// max_sessions_per_namespace).
	reset string
}

// storedAnswer is a response recorded under an idempotency key.
type storedAnswer struct {
	fingerprint string // of the request that earned it (fingerprint)
	status      int
	header      map[string]string
	body        []byte
}

// errSessionMoved is a session whose stored turns changed under a request
// that held it: its lock was lost with a connection to the database (a
// restart) and another request ran the session meanwhile.
var errSessionMoved = errors.New("the session changed while this request ran (the database restarted)")

// stateError maps a failure of the state to its response: an unreachable
// database is an outage (503, retry), never a 500.
func (s *Server) stateError(err error) *apiError {
	switch {
	case errors.Is(err, context.DeadlineExceeded), errors.Is(err, context.Canceled):
		return contextError(err)
	case ltm.Unavailable(err):
		return unavailable()
	case errors.Is(err, errSessionMoved):
		return &apiError{Status: http.StatusServiceUnavailable, Type: "server_error", Code: "session_conflict",
			Message: err.Error() + "; nothing of this request was kept: retry it", retryAfter: 1}
	}
	s.log.Error("session or idempotency state failed", "err", err)
	return &apiError{Status: http.StatusInternalServerError, Type: "server_error", Code: "state_error",
		Message: "the server's session state failed; the server's log has the details"}
}

// unavailable is the answer while the database cannot be reached.
func unavailable() *apiError {
	return &apiError{Status: http.StatusServiceUnavailable, Type: "server_error", Code: "store_unavailable",
		Message: "the memory database cannot be reached; nothing was done: retry after Retry-After", retryAfter: 1}
}

// newState is serve.state's store: PostgreSQL at dsn when dsn is set, else
// this process's memory.
func newState(sv Config, dsn string, log *slog.Logger) (state, error) {
	if dsn == "" {
		return newMemState(sv), nil
	}
	p, err := openPGState(dsn, sv, log)
	if err != nil {
		return nil, fmt.Errorf("serve.state postgres: %w", err)
	}
	return p, nil
}

// lockKey is the advisory-lock key of one key or session: a bigint, a
// key space of its own (the memory store locks with pairs of integers,
// so a session named like a memory's content never waits on it).
func lockKey(kind, ns, id string) int64 {
	h := fnv.New64a()
	for _, s := range []string{kind, ns, id} {
		h.Write([]byte(s))
		h.Write([]byte{0}) // no NUL in namespaces, ids or keys
	}
	return int64(h.Sum64())
}
