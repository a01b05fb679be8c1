// Package gate bounds how many callers run at once and how many wait: the
// admission of a server's requests, one tenant's share of them, a store's
// writers. A caller beyond the waiting room is refused at once (ErrFull)
// instead of piling up, so an overload turns into fast, retryable refusals.
package gate

import (
	"context"
	"errors"
	"sync/atomic"
)

// ErrFull is returned when every slot is taken and the queue is full.
var ErrFull = errors.New("all slots are taken and the queue is full")

// Gate admits up to a fixed number of callers at once; up to a fixed number
// more wait.
type Gate struct {
	slots    chan struct{}
	waiting  atomic.Int64
	maxQueue int64
}

// New admits slots callers at once and queues up to queue more.
func New(slots, queue int) *Gate {
	return &Gate{slots: make(chan struct{}, max(slots, 1)), maxQueue: int64(queue)}
}

// Enter waits for a slot (or ctx) and returns the function that frees it.
func (g *Gate) Enter(ctx context.Context) (release func(), err error) {
	release = func() { <-g.slots }
	select {
	case g.slots <- struct{}{}:
		return release, nil
	default:
	}
	if g.waiting.Add(1) > g.maxQueue {
		g.waiting.Add(-1)
		return nil, ErrFull
	}
	defer g.waiting.Add(-1)
	select {
	case g.slots <- struct{}{}:
		return release, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// Active is how many callers hold a slot.
func (g *Gate) Active() int { return len(g.slots) }

// Queued is how many callers wait.
func (g *Gate) Queued() int { return int(g.waiting.Load()) }
