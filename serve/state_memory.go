package serve

import (
	"context"
	"sync"
	"time"

	"github.com/agemem/agemem/memtools/stm"
)

// memState is the state of one process (serve.state memory): sessions and
// recorded answers in maps.
type memState struct {
	sess *sessions
	keys *keyStore
}

func newMemState(sv Config) *memState {
	return &memState{sess: newSessions(sv.SessionTTL, sv.MaxSessions, sv.MaxSessionsPerNamespace),
		keys: newKeyStore(sv.IdempotencyTTL, sv.IdempotencyKeys)}
}

func (m *memState) hold() hold                            { return &memHold{m: m} }
func (m *memState) sessions(context.Context) (int, error) { return m.sess.len(), nil }
func (m *memState) ping(context.Context) error            { return nil }
func (m *memState) close()                                {}

// lock is a mutex whose wait a context can end.
type lock chan struct{}

func newLock() lock { return make(lock, 1) }

func (l lock) take(ctx context.Context) error {
	select {
	case l <- struct{}{}:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (l lock) give() { <-l }

// memHold is a request's hold on a memState.
type memHold struct {
	m     *memState
	sk    sessionKey
	se    *session // taken
	kid   keyID
	entry *keyRecord // taken
}

// claim never reports an unfinished attempt: in one process a request
// that changed something records its answer (the store's write and the
// record cannot fail apart), unless the process dies, and the records die
// with it.
func (h *memHold) claim(ctx context.Context, ns, key, _ string) (*storedAnswer, bool, error) {
	id := keyID{ns, key}
	e, err := h.m.keys.take(ctx, id)
	if err != nil {
		return nil, false, err
	}
	h.kid, h.entry = id, e
	return h.m.keys.recorded(e), false, nil
}

func (h *memHold) forget(context.Context) {}

func (h *memHold) session(ctx context.Context, ns, id string, _ stm.Tokenizer) (sessionState, error) {
	se, why := h.m.sess.get(ns, id)
	if err := se.lock.take(ctx); err != nil {
		h.m.sess.done(ns, id, se)
		return sessionState{}, err
	}
	h.sk, h.se = sessionKey{ns, id}, se
	st := sessionState{turns: se.turns, reset: why}
	if se.ctx != nil {
		st.ctx = se.ctx.Clone()
	}
	return st, nil
}

func (h *memHold) dropSession(ctx context.Context, ns, id string) (bool, error) {
	return h.m.sess.drop(ctx, ns, id)
}

func (h *memHold) commit(_ context.Context, next *sessionState, ans *storedAnswer) error {
	if next != nil && h.se != nil {
		h.se.ctx, h.se.turns = next.ctx, next.turns
	}
	if ans != nil && h.entry != nil {
		h.m.keys.record(h.kid, h.entry, ans)
	}
	return nil
}

func (h *memHold) release() {
	if h.se != nil {
		h.se.lock.give()
		h.m.sess.done(h.sk.ns, h.sk.id, h.se)
		h.se = nil
	}
	if h.entry != nil {
		h.m.keys.give(h.kid, h.entry)
		h.entry = nil
	}
}

// sessions keeps the short-term context of each server-side session, keyed
// by namespace and session id, so a session id never reaches another
// user's context.
//
// Eviction is fair between tenants: a namespace at max_sessions_per_namespace
// evicts its own least recently used session, and a server at max_sessions
// evicts from the namespace holding the most. A session that no request
// completed is forgotten when its request ends, so failing requests cannot
// push out live sessions. A request naming a session that expired or was
// evicted is told so (session_reset in the response).
type sessions struct {
	mu    sync.Mutex
	m     map[sessionKey]*session
	perNS map[string]int
	gone  map[sessionKey]string // why a recent session is gone: expired, evicted
	ttl   time.Duration
	max   int
	maxNS int
	now   func() time.Time
}

type sessionKey struct{ ns, id string }

type session struct {
	// lock serialises the requests of one session: each sees the context
	// the previous one left.
	lock  lock
	ctx   *stm.Context // nil until the first request succeeds
	turns int
	last  time.Time
}

func newSessions(ttl time.Duration, max, maxNS int) *sessions {
	return &sessions{m: map[sessionKey]*session{}, perNS: map[string]int{}, gone: map[sessionKey]string{},
		ttl: ttl, max: max, maxNS: maxNS, now: time.Now}
}

// remove forgets k; why, if not empty, is remembered for a later request.
// The caller holds s.mu.
func (s *sessions) remove(k sessionKey, why string) {
	if _, ok := s.m[k]; !ok {
		return
	}
	delete(s.m, k)
	if s.perNS[k.ns]--; s.perNS[k.ns] <= 0 {
		delete(s.perNS, k.ns)
	}
	if why != "" {
		if len(s.gone) >= 2*s.max { // a bounded memory of what went
			clear(s.gone)
		}
		s.gone[k] = why
	}
}

// lru is ns's least recently used session (any namespace's if ns is "").
func (s *sessions) lru(ns string) (sessionKey, bool) {
	var oldest sessionKey
	found := false
	for k, se := range s.m {
		if (ns == "" || k.ns == ns) && (!found || se.last.Before(s.m[oldest].last)) {
			oldest, found = k, true
		}
	}
	return oldest, found
}

// get returns the session, creating it, and why an earlier session of that
// id is gone ("expired", "evicted"; "" if it is not).
func (s *sessions) get(ns, id string) (*session, string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.now()
	k := sessionKey{ns, id}
	if se, ok := s.m[k]; ok && now.Sub(se.last) <= s.ttl {
		se.last = now
		return se, ""
	}
	for key, se := range s.m {
		if now.Sub(se.last) > s.ttl {
			s.remove(key, "expired")
		}
	}
	if s.perNS[ns] >= s.maxNS {
		if k, ok := s.lru(ns); ok {
			s.remove(k, "evicted")
		}
	}
	if len(s.m) >= s.max {
		heaviest := ""
		for n, c := range s.perNS {
			if c > s.perNS[heaviest] || (c == s.perNS[heaviest] && n < heaviest) {
				heaviest = n
			}
		}
		if k, ok := s.lru(heaviest); ok {
			s.remove(k, "evicted")
		}
	}
	why := s.gone[k]
	delete(s.gone, k)
	se := &session{lock: newLock(), last: now}
	s.m[k] = se
	s.perNS[ns]++
	return se, why
}

// done ends a request on se: a session that no request has completed (its
// context still nil) is forgotten.
func (s *sessions) done(ns, id string, se *session) {
	s.mu.Lock()
	defer s.mu.Unlock()
	k := sessionKey{ns, id}
	if cur, ok := s.m[k]; ok && cur == se && se.ctx == nil {
		s.remove(k, "")
	}
}

// drop forgets a session once the request running on it, if any, ends
// (DELETE /v1/sessions/{id}).
func (s *sessions) drop(ctx context.Context, ns, id string) (bool, error) {
	k := sessionKey{ns, id}
	s.mu.Lock()
	se, ok := s.m[k]
	s.mu.Unlock()
	if !ok {
		return false, nil
	}
	if err := se.lock.take(ctx); err != nil {
		return false, err
	}
	defer se.lock.give()
	s.mu.Lock()
	defer s.mu.Unlock()
	if cur, ok := s.m[k]; !ok || cur != se || se.ctx == nil {
		return false, nil
	}
	s.remove(k, "")
	return true, nil
}

func (s *sessions) len() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.m)
}

// keyStore keeps the answers recorded under idempotency keys for ttl, at
// most max of them (the oldest go first), and serialises the requests of
// one key.
type keyStore struct {
	mu    sync.Mutex
	m     map[keyID]*keyRecord
	order []recordedAt // answers by when they were recorded, oldest first: one TTL, so also by expiry
	ttl   time.Duration
	max   int
	now   func() time.Time
}

type keyID struct{ ns, key string }

type keyRecord struct {
	lock    lock
	holders int           // requests holding or waiting for lock
	ans     *storedAnswer // nil until a request of the key is recorded
	expires time.Time
}

type recordedAt struct {
	id      keyID
	expires time.Time
}

func newKeyStore(ttl time.Duration, max int) *keyStore {
	return &keyStore{m: map[keyID]*keyRecord{}, ttl: ttl, max: max, now: time.Now}
}

// take waits for id's lock.
func (k *keyStore) take(ctx context.Context, id keyID) (*keyRecord, error) {
	k.mu.Lock()
	e := k.m[id]
	if e == nil {
		e = &keyRecord{lock: newLock()}
		k.m[id] = e
	}
	e.holders++
	k.mu.Unlock()
	if err := e.lock.take(ctx); err != nil {
		k.leave(id, e)
		return nil, err
	}
	return e, nil
}

// recorded is e's answer, if it has one within its TTL.
func (k *keyStore) recorded(e *keyRecord) *storedAnswer {
	k.mu.Lock()
	defer k.mu.Unlock()
	if e.ans == nil || !k.now().Before(e.expires) {
		return nil
	}
	return e.ans
}

func (k *keyStore) record(id keyID, e *keyRecord, ans *storedAnswer) {
	k.mu.Lock()
	defer k.mu.Unlock()
	now := k.now()
	e.ans, e.expires = ans, now.Add(k.ttl)
	k.order = append(k.order, recordedAt{id, e.expires})
	for len(k.order) > 0 && (len(k.order) > k.max || !now.Before(k.order[0].expires)) {
		old := k.order[0]
		k.order = k.order[1:]
		if x := k.m[old.id]; x != nil && x.expires.Equal(old.expires) {
			x.ans = nil
			if x.holders == 0 {
				delete(k.m, old.id)
			}
		}
	}
}

// give releases e's lock.
func (k *keyStore) give(id keyID, e *keyRecord) {
	e.lock.give()
	k.leave(id, e)
}

func (k *keyStore) leave(id keyID, e *keyRecord) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if e.holders--; e.holders == 0 && e.ans == nil && k.m[id] == e {
		delete(k.m, id)
	}
}
