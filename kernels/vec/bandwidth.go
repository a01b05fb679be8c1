package vec

import (
	"runtime"
	"sync"
	"time"
)

// ReadBandwidth streams a buffer of size bytes with one reader per core and
// returns the best of five passes in GB/s. Benchmarks of scan-bound work
// (top-k, decoding) print their rate beside it as the anchor.
func ReadBandwidth(size int) float64 {
	buf := make([]float32, size/4)
	for i := range buf {
		buf[i] = 1
	}
	workers := runtime.GOMAXPROCS(0)
	chunk := len(buf) / workers
	best := 0.0
	for range 5 {
		start := time.Now()
		var wg sync.WaitGroup
		for w := range workers {
			wg.Go(func() { Sum(buf[w*chunk : (w+1)*chunk]) })
		}
		wg.Wait()
		best = max(best, float64(chunk*workers*4)/time.Since(start).Seconds()/1e9)
	}
	return best
}
