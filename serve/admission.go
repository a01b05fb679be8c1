package serve

import (
	"context"
	"net/http"
	"sync/atomic"
)

// admission bounds the agent loops running at once; up to maxQueue more
// requests wait for a slot, and a request beyond that is refused with 429
// at once rather than piling up.
type admission struct {
	slots    chan struct{}
	waiting  atomic.Int64
	maxQueue int64
}

func newAdmission(concurrent, queue int) *admission {
	return &admission{slots: make(chan struct{}, concurrent), maxQueue: int64(queue)}
}

var errQueueFull = &apiError{Status: http.StatusTooManyRequests, Type: "rate_limit_error", Code: "queue_full",
	Message: "the server is at capacity and its queue is full; retry later"}

func (a *admission) acquire(ctx context.Context) (func(), error) {
	release := func() { <-a.slots }
	select {
	case a.slots <- struct{}{}:
		return release, nil
	default:
	}
	if a.waiting.Add(1) > a.maxQueue {
		a.waiting.Add(-1)
		return nil, errQueueFull
	}
	defer a.waiting.Add(-1)
	select {
	case a.slots <- struct{}{}:
		return release, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

func (a *admission) active() int { return len(a.slots) }
func (a *admission) queued() int { return int(a.waiting.Load()) }
