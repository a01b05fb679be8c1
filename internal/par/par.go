// Package par runs loops in parallel: over an index range on every core,
// for the host-side conversions of model loading (bf16 to float32, float32
// to bf16 or Q8_0) that a 7B model makes 7.6 billion times, and over a
// benchmark's queries on a fixed number of workers.
package par

import (
	"runtime"
	"sync"
)

// For calls f on the consecutive pieces [lo, hi) of [0, n), piece long
// (the last one shorter), on up to GOMAXPROCS goroutines at once, and
// returns when all are done. The pieces do not depend on the number of
// cores, so an f that writes only its own piece gives the same result on
// any machine.
func For(n, piece int, f func(lo, hi int)) {
	if n <= piece {
		if n > 0 {
			f(0, n)
		}
		return
	}
	var wg sync.WaitGroup
	sem := make(chan struct{}, runtime.GOMAXPROCS(0))
	for lo := 0; lo < n; lo += piece {
		wg.Add(1)
		sem <- struct{}{}
		go func(lo, hi int) {
			defer func() {
				<-sem
				wg.Done()
			}()
			f(lo, hi)
		}(lo, min(lo+piece, n))
	}
	wg.Wait()
}

// Each calls f(i) for every i in [0, n) on up to workers goroutines (at
// least one), taking indices in order, and after(done, i) once f(i)
// returns, one call at a time (done counts the finished calls: progress
// lines), and returns when all are done.
func Each(n, workers int, f func(i int), after func(done, i int)) {
	var mu sync.Mutex
	done := 0
	var wg sync.WaitGroup
	next := make(chan int)
	for range min(max(workers, 1), max(n, 1)) {
		wg.Go(func() {
			for i := range next {
				f(i)
				mu.Lock()
				done++
				after(done, i)
				mu.Unlock()
			}
		})
	}
	for i := range n {
		next <- i
	}
	close(next)
	wg.Wait()
}
