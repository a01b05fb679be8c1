package cpu

import (
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// Every index is visited exactly once whoever runs it: callers racing for
// the pool, a parallelFor nested in another's chunk, and workers woken
// from parking after an idle spell.
func TestParallelForVisitsEachIndexOnce(t *testing.T) {
	check := func(t *testing.T, n int) {
		seen := make([]atomic.Int32, n)
		parallelFor(n, 1<<15, func(lo, hi int) {
			for i := lo; i < hi; i++ {
				seen[i].Add(1)
			}
		})
		for i := range seen {
			if c := seen[i].Load(); c != 1 {
				t.Fatalf("n=%d: index %d visited %d times", n, i, c)
			}
		}
	}
	t.Run("sizes", func(t *testing.T) {
		for _, n := range []int{2, 3, 7, 64, 1001} {
			check(t, n)
		}
	})
	t.Run("after parking", func(t *testing.T) {
		check(t, 100)
		time.Sleep(3 * spinFor)
		check(t, 100)
	})
	t.Run("concurrent callers", func(t *testing.T) {
		var wg sync.WaitGroup
		for range 8 {
			wg.Go(func() {
				for range 200 {
					check(t, 37)
				}
			})
		}
		wg.Wait()
	})
	t.Run("nested", func(t *testing.T) {
		const outer, inner = 5, 40
		var total atomic.Int64
		parallelFor(outer, 1<<15, func(lo, hi int) {
			for range hi - lo {
				parallelFor(inner, 1<<15, func(lo, hi int) { total.Add(int64(hi - lo)) })
			}
		})
		if total.Load() != outer*inner {
			t.Fatalf("nested: %d indices, want %d", total.Load(), outer*inner)
		}
	})
}
