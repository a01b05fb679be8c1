package par

import (
	"sync/atomic"
	"testing"
)

// TestForCoversEachIndexOnce: every index of [0, n) is handed to exactly
// one call, in pieces of the given length, for n below, at and above a
// piece and not a multiple of it; n 0 calls nothing.
func TestForCoversEachIndexOnce(t *testing.T) {
	for _, c := range []struct{ n, piece int }{{0, 4}, {3, 4}, {4, 4}, {10, 4}, {1000, 7}} {
		seen := make([]atomic.Int32, c.n)
		var calls atomic.Int32
		For(c.n, c.piece, func(lo, hi int) {
			calls.Add(1)
			if hi-lo > c.piece || lo%c.piece != 0 {
				t.Errorf("n %d: piece [%d, %d) of a %d split", c.n, lo, hi, c.piece)
			}
			for i := lo; i < hi; i++ {
				seen[i].Add(1)
			}
		})
		for i := range seen {
			if seen[i].Load() != 1 {
				t.Fatalf("n %d piece %d: index %d handed %d times", c.n, c.piece, i, seen[i].Load())
			}
		}
		if want := (c.n + c.piece - 1) / c.piece; int(calls.Load()) != want {
			t.Fatalf("n %d piece %d: %d calls, want %d", c.n, c.piece, calls.Load(), want)
		}
	}
}
