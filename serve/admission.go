package serve

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/agemem/agemem/internal/gate"
)

// admission decides which chat requests run: each key may run
// max_concurrent_per_key agent loops and queue max_queue_per_key more, so
// that one tenant cannot take every slot; past its own gate a request
// waits for one of the server's max_concurrent slots (max_queue may wait).
// A request beyond a queue is refused at once with 429, not piled up.
// Every API request of a key also draws from its token bucket
// (rate_limit per second, rate_burst deep) when rate_limit is set.
type admission struct {
	global       *gate.Gate
	perKey       int
	perKeyQueue  int
	rate         float64
	burst        float64
	now          func() time.Time
	mu           sync.Mutex
	keys         map[string]*gate.Gate
	buckets      map[string]*bucket
	refusedLimit func(limit string)
}

type bucket struct {
	tokens float64
	at     time.Time
}

func newAdmission(sv Config, refused func(string)) *admission {
	return &admission{global: gate.New(sv.MaxConcurrent, sv.MaxQueue), perKey: sv.MaxConcurrentPerKey, perKeyQueue: sv.MaxQueuePerKey,
		rate: sv.RateLimit, burst: float64(sv.RateBurst), now: time.Now, keys: map[string]*gate.Gate{}, buckets: map[string]*bucket{},
		refusedLimit: refused}
}

func tooMany(code, msg string, retry time.Duration) *apiError {
	return &apiError{Status: http.StatusTooManyRequests, Type: "rate_limit_error", Code: code, Message: msg,
		retryAfter: max(1, int(math.Ceil(retry.Seconds())))}
}

// allow takes one token from key's bucket, or says how long until one.
func (a *admission) allow(key string) *apiError {
	if a.rate <= 0 {
		return nil
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	now := a.now()
	b, ok := a.buckets[key]
	if !ok {
		b = &bucket{tokens: a.burst, at: now}
		a.buckets[key] = b
	}
	b.tokens = min(a.burst, b.tokens+now.Sub(b.at).Seconds()*a.rate)
	b.at = now
	if b.tokens < 1 {
		a.refusedLimit("rate_limit")
		wait := time.Duration((1 - b.tokens) / a.rate * float64(time.Second))
		return tooMany("rate_limited", fmt.Sprintf("this key is limited to %g requests a second (serve.rate_limit, burst %d); retry in %s",
			a.rate, int(a.burst), wait.Round(time.Millisecond)), wait)
	}
	b.tokens--
	return nil
}

// keyGate is key's own gate. Keys come from the config, so the map is
// bounded by it.
func (a *admission) keyGate(key string) *gate.Gate {
	a.mu.Lock()
	defer a.mu.Unlock()
	g, ok := a.keys[key]
	if !ok {
		g = gate.New(a.perKey, a.perKeyQueue)
		a.keys[key] = g
	}
	return g
}

// acquire admits a chat request of key: its own gate, then the server's.
func (a *admission) acquire(ctx context.Context, key string) (func(), *apiError) {
	mine, err := a.keyGate(key).Enter(ctx)
	if errors.Is(err, gate.ErrFull) {
		a.refusedLimit("max_queue_per_key")
		return nil, tooMany("key_queue_full", fmt.Sprintf("this key already runs %d requests and queues %d (serve.max_concurrent_per_key, serve.max_queue_per_key); retry later",
			a.perKey, a.perKeyQueue), time.Second)
	}
	if err != nil {
		return nil, contextError(err)
	}
	all, err := a.global.Enter(ctx)
	if errors.Is(err, gate.ErrFull) {
		mine()
		a.refusedLimit("max_queue")
		return nil, tooMany("queue_full", "the server is at capacity and its queue is full; retry later", time.Second)
	}
	if err != nil {
		mine()
		return nil, contextError(err)
	}
	return func() { all(); mine() }, nil
}

func (a *admission) active() int { return a.global.Active() }
func (a *admission) queued() int { return a.global.Queued() }

// retryAfterHeader is the Retry-After value of a refusal.
func retryAfterHeader(e *apiError) string {
	if e.retryAfter > 0 {
		return strconv.Itoa(e.retryAfter)
	}
	return "1"
}
