package serve

// Writes a retry cannot repeat. Every write of the memory API, chat and
// session deletion runs through write: it holds the request's state (the
// session it continues, the key it carries) and commits what the request
// changed before the client sees the answer, so an answer is only ever
// one that was saved.
//
// A request with an Idempotency-Key header (IETF draft
// httpapi-idempotency-key-header; Stripe's semantics) runs once per key
// and namespace: while it runs, a request with the same key waits for it
// (on any replica); once it has succeeded (2xx), the same key returns its
// answer, byte for byte, marked Idempotent-Replayed: true, for
// serve.idempotency_ttl. A key sent with another request (method, path,
// session or body) is refused (422 idempotency_key_reused). An answer that
// is not a success is not recorded: the retry runs the request again.

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strconv"
	"sync"
)

const idempotencyHeader = "Idempotency-Key"

// recordedHeaders are the headers an answer is replayed with.
var recordedHeaders = []string{"Content-Type", "X-Session-ID"}

// writeState is what write gives the handler it runs: its hold, and the
// answer it is recording.
type writeState struct {
	hold hold
	rec  *answerRecorder
	// key and fp, if the request carries a key: the key, claimed or to
	// claim (lateClaim), and the request's fingerprint.
	ns, key, fp string
	claimed     bool
	// unfinished: an earlier attempt under the key may have had its
	// effect without recording its answer (hold.claim).
	unfinished bool
	kept       *sessionState // the session's next state, saved at commit
	committed  bool
}

type writeKey struct{}

// writeOf is the writeState of a request write runs.
func writeOf(ctx context.Context) *writeState {
	ws, _ := ctx.Value(writeKey{}).(*writeState)
	return ws
}

// write wraps a handler that changes state. lateClaim leaves the claim of
// the key to the handler (claim): chat takes its place in the admission
// queue first, so waiting requests hold no database connection.
func (s *Server) write(h func(http.ResponseWriter, *http.Request) *apiError, lateClaim bool) func(http.ResponseWriter, *http.Request) *apiError {
	return func(w http.ResponseWriter, r *http.Request) *apiError {
		ws := &writeState{hold: s.state.hold(), rec: &answerRecorder{w: w, header: http.Header{}}}
		defer ws.hold.release()
		if key := r.Header.Get(idempotencyHeader); key != "" {
			if !validKey(key) {
				return errInvalid(idempotencyHeader, "invalid_idempotency_key", "an Idempotency-Key is 1-255 visible ASCII characters")
			}
			ns, aerr := requestNamespace(r)
			if aerr != nil {
				return aerr
			}
			body, aerr := readBody(r)
			if aerr != nil {
				return aerr
			}
			r.Body = io.NopCloser(bytes.NewReader(body))
			ws.ns, ws.key, ws.fp = ns, key, fingerprint(r, body)
		}
		r = r.WithContext(context.WithValue(r.Context(), writeKey{}, ws))
		if !lateClaim {
			if done, aerr := ws.claim(w, r, s); done {
				return aerr
			}
		}
		aerr := h(ws.rec, r)
		if ws.rec.streaming || ws.committed {
			return aerr // a stream commits before its last event
		}
		if aerr != nil {
			if ws.claimed && aerr.Status < 500 {
				ws.hold.forget(r.Context())
			}
			ws.rec.keepHeaders()
			return aerr
		}
		if err := ws.commit(r.Context(), nil); err != nil {
			return s.stateError(err)
		}
		ws.rec.send()
		return nil
	}
}

// claim takes the request's key, if it has one. done means the request is
// answered: with the answer recorded under the key, or with aerr.
func (ws *writeState) claim(w http.ResponseWriter, r *http.Request, s *Server) (done bool, aerr *apiError) {
	if ws.key == "" || ws.claimed {
		return false, nil
	}
	ans, unfinished, err := ws.hold.claim(r.Context(), ws.ns, ws.key, ws.fp)
	if err != nil {
		return true, s.stateError(err)
	}
	ws.claimed, ws.unfinished = true, unfinished
	if ans == nil {
		return false, nil
	}
	if ans.fingerprint != ws.fp {
		return true, &apiError{Status: http.StatusUnprocessableEntity, Type: "invalid_request_error", Param: idempotencyHeader, Code: "idempotency_key_reused",
			Message: fmt.Sprintf("Idempotency-Key %q was used with another request (method, path, session or body); use a new key for a new request", ws.key)}
	}
	for k, v := range ans.header {
		w.Header().Set(k, v)
	}
	w.Header().Set("Idempotent-Replayed", "true")
	w.WriteHeader(ans.status)
	w.Write(ans.body)
	return true, nil
}

// keep sets the session's next state, saved when the answer is.
func (ws *writeState) keep(next *sessionState) { ws.kept = next }

// commit saves the kept session state and, for a request with a key that
// succeeded, its answer: the recorded bytes and tail, bytes not yet
// written.
func (ws *writeState) commit(ctx context.Context, tail []byte) error {
	var ans *storedAnswer
	if ws.claimed && ws.rec.status()/100 == 2 {
		ans = ws.rec.answer(ws.fp, tail)
	}
	if err := ws.hold.commit(ctx, ws.kept, ans); err != nil {
		return err
	}
	ws.committed = true
	return nil
}

// validKey: 1-255 visible ASCII characters.
func validKey(k string) bool {
	if len(k) > 255 {
		return false
	}
	for i := 0; i < len(k); i++ {
		if k[i] < 0x21 || k[i] > 0x7e {
			return false
		}
	}
	return true
}

// fingerprint identifies a request for its key: method, path and query,
// the session header and the body.
func fingerprint(r *http.Request, body []byte) string {
	h := sha256.New()
	for _, part := range []string{r.Method, r.URL.Path, r.URL.RawQuery, r.Header.Get("X-Session-ID")} {
		io.WriteString(h, strconv.Itoa(len(part))+":"+part)
	}
	h.Write(body)
	return hex.EncodeToString(h.Sum(nil))
}

// answerRecorder holds a write's answer until it is committed (send), or, once
// the handler flushes (a stream), passes it through as it is written and
// keeps a copy.
type answerRecorder struct {
	w      http.ResponseWriter
	header http.Header
	mu     sync.Mutex // a stream writes from its own goroutine
	code   int
	buf    bytes.Buffer
	// streaming: flushed; what is written goes to the client at once.
	streaming bool
}

func (rc *answerRecorder) Header() http.Header {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	if rc.streaming {
		return rc.w.Header()
	}
	return rc.header
}

func (rc *answerRecorder) WriteHeader(code int) {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	if rc.code == 0 {
		rc.code = code
	}
}

func (rc *answerRecorder) Write(p []byte) (int, error) {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	if rc.code == 0 {
		rc.code = http.StatusOK
	}
	rc.buf.Write(p)
	if rc.streaming {
		return rc.w.Write(p)
	}
	return len(p), nil
}

// Flush starts passing the answer through: what was held goes first.
func (rc *answerRecorder) Flush() {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	if !rc.streaming {
		rc.streaming = true
		rc.start()
		rc.w.Write(rc.buf.Bytes())
	}
	if f, ok := rc.w.(http.Flusher); ok {
		f.Flush()
	}
}

// start writes the held status and headers. Called with mu held.
func (rc *answerRecorder) start() {
	for k, v := range rc.header {
		rc.w.Header()[k] = v
	}
	if rc.code == 0 {
		rc.code = http.StatusOK
	}
	rc.w.WriteHeader(rc.code)
}

// keepHeaders passes the headers set so far on to an error answer.
func (rc *answerRecorder) keepHeaders() {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	for k, v := range rc.header {
		rc.w.Header()[k] = v
	}
}

// send writes what was held.
func (rc *answerRecorder) send() {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	if rc.streaming {
		return
	}
	rc.start()
	rc.w.Write(rc.buf.Bytes())
}

func (rc *answerRecorder) status() int {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	if rc.code == 0 {
		return http.StatusOK
	}
	return rc.code
}

// answer is what was written, and tail, as an answer to record.
func (rc *answerRecorder) answer(fp string, tail []byte) *storedAnswer {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	h := rc.header
	if rc.streaming {
		h = rc.w.Header()
	}
	a := &storedAnswer{fingerprint: fp, status: rc.code, header: map[string]string{}, body: slices.Concat(rc.buf.Bytes(), tail)}
	if a.status == 0 {
		a.status = http.StatusOK
	}
	for _, k := range recordedHeaders {
		if v := h.Get(k); v != "" {
			a.header[k] = v
		}
	}
	return a
}
