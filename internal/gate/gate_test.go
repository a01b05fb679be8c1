package gate

import (
	"context"
	"errors"
	"testing"
	"time"
)

func TestGateAdmitsQueuesAndRefuses(t *testing.T) {
	g := New(2, 1)
	ctx := context.Background()
	r1, err1 := g.Enter(ctx)
	r2, err2 := g.Enter(ctx)
	if err1 != nil || err2 != nil || g.Active() != 2 {
		t.Fatalf("two slots: %v %v active %d", err1, err2, g.Active())
	}
	got := make(chan error, 1)
	go func() {
		r, err := g.Enter(ctx)
		if err == nil {
			r()
		}
		got <- err
	}()
	for g.Queued() != 1 {
		time.Sleep(time.Millisecond)
	}
	if _, err := g.Enter(ctx); !errors.Is(err, ErrFull) {
		t.Fatalf("a fourth caller with the queue full: %v, want ErrFull", err)
	}
	r1()
	if err := <-got; err != nil {
		t.Fatalf("the queued caller: %v", err)
	}
	cctx, cancel := context.WithTimeout(ctx, 10*time.Millisecond)
	defer cancel()
	r3, _ := g.Enter(ctx)
	if _, err := g.Enter(cctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("a waiter whose context ends: %v", err)
	}
	r2()
	r3()
	if g.Active() != 0 || g.Queued() != 0 {
		t.Fatalf("after release: active %d queued %d", g.Active(), g.Queued())
	}
}
