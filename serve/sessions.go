package serve

import (
	"sync"
	"time"

	"github.com/agemem/agemem/memtools/stm"
)

// sessions keeps the short-term context of each server-side session, keyed
// by namespace and session id, so a session id never reaches another
// user's context. Contexts live in memory: they are short-term by
// definition; long-term memory is in the store.
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
	// mu serialises the requests of one session: each sees the context the
	// previous one left.
	mu   sync.Mutex
	ctx  *stm.Context // nil until the first request succeeds
	last time.Time
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
	se := &session{last: now}
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

// drop forgets a session (DELETE /v1/sessions/{id}).
func (s *sessions) drop(ns, id string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	k := sessionKey{ns, id}
	_, ok := s.m[k]
	s.remove(k, "")
	return ok
}

func (s *sessions) len() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.m)
}
