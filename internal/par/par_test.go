package par

import (
	"sync"
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

// TestEachCallsEveryIndexOnce: every index once on any worker count (0
// meaning one), with after reporting a count that rises to n.
func TestEachCallsEveryIndexOnce(t *testing.T) {
	for _, workers := range []int{0, 1, 3, 50} {
		const n = 37
		var mu sync.Mutex
		seen := make([]int, n)
		var dones []int
		Each(n, workers, func(i int) {
			mu.Lock()
			seen[i]++
			mu.Unlock()
		}, func(done, i int) { dones = append(dones, done) })
		for i, k := range seen {
			if k != 1 {
				t.Fatalf("workers %d: index %d called %d times", workers, i, k)
			}
		}
		for i, d := range dones {
			if d != i+1 {
				t.Fatalf("workers %d: after's counts %v", workers, dones)
			}
		}
	}
	Each(0, 4, func(int) { t.Fatal("f called on an empty range") }, func(int, int) {})
}
