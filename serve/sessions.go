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
type sessions struct {
	mu  sync.Mutex
	m   map[sessionKey]*session
	ttl time.Duration
	max int
	now func() time.Time
}

type sessionKey struct{ ns, id string }

type session struct {
	// mu serialises the requests of one session: each sees the context the
	// previous one left.
	mu   sync.Mutex
	ctx  *stm.Context // nil until the first request succeeds
	last time.Time
}

func newSessions(ttl time.Duration, max int) *sessions {
	return &sessions{m: map[sessionKey]*session{}, ttl: ttl, max: max, now: time.Now}
}

// get returns the session, creating it; expired sessions are dropped, and
// at capacity the least recently used one goes.
func (s *sessions) get(ns, id string) *session {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.now()
	k := sessionKey{ns, id}
	if se, ok := s.m[k]; ok && now.Sub(se.last) <= s.ttl {
		se.last = now
		return se
	}
	for key, se := range s.m {
		if now.Sub(se.last) > s.ttl {
			delete(s.m, key)
		}
	}
	if len(s.m) >= s.max {
		var oldest sessionKey
		first := true
		for key, se := range s.m {
			if first || se.last.Before(s.m[oldest].last) {
				oldest, first = key, false
			}
		}
		delete(s.m, oldest)
	}
	se := &session{last: now}
	s.m[k] = se
	return se
}

// drop forgets a session (DELETE /v1/sessions/{id}).
func (s *sessions) drop(ns, id string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	k := sessionKey{ns, id}
	_, ok := s.m[k]
	delete(s.m, k)
	return ok
}

func (s *sessions) len() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.m)
}
