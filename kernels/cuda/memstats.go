// The caching allocator's figures: what live tensors and the cache hold,
// the peaks, and the driver calls behind them.

package cuda

import (
	"fmt"
	"math"
	"strconv"
	"time"
)

// MemStats reports the bytes held by live tensors and by the cache.
func (b *Backend) MemStats() (live, cached uint64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.liveBytes, b.cachedBytes
}

// PeakBytes is the most device memory the allocator has held (live tensors
// and cache) since the backend started or ResetPeak: what PyTorch reports as
// torch.cuda.max_memory_reserved.
func (b *Backend) PeakBytes() uint64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.peakBytes
}

// PeakLiveBytes is the most device memory tensors have held since the
// backend started or ResetPeak, the cache left out: nearer PyTorch's
// torch.cuda.max_memory_allocated, though it also counts tensors Go has
// not yet collected (at most gcEvery of them), and what --dry-run
// predicts.
func (b *Backend) PeakLiveBytes() uint64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.peakLive
}

// memoryLimit parses $AGEMEM_CUDA_MEMORY_GIB: "" is no limit, else a
// positive number of GiB (fractions allowed).
func memoryLimit(v string) (uint64, error) {
	if v == "" {
		return 0, nil
	}
	g, err := strconv.ParseFloat(v, 64)
	if err != nil || !(g > 0) || math.IsInf(g, 0) {
		return 0, fmt.Errorf("AGEMEM_CUDA_MEMORY_GIB=%q: want a positive number of GiB, e.g. 24", v)
	}
	return uint64(g * (1 << 30)), nil
}

// AllocStats counts what the caching allocator asked of the driver and the
// collector since the backend started: collections started in the
// background, reclaims at the memory limit (each a collection waited for),
// cuMemAlloc and cuMemFree calls (each can make the host wait for the GPU)
// and the host time spent in them.
type AllocStats struct {
	Collections, Reclaims, DriverAllocs, DriverFrees int
	DriverTime                                       time.Duration
}

// AllocStats returns the allocator's counts so far.
func (b *Backend) AllocStats() AllocStats {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.stats
}

// ResetPeak starts PeakBytes and PeakLiveBytes again from what is held now.
func (b *Backend) ResetPeak() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.peakBytes = b.liveBytes + b.cachedBytes
	b.peakLive = b.liveBytes
}
