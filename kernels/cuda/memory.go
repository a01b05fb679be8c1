package cuda

import (
	"fmt"
	"runtime"
	"time"
	"unsafe"

	"github.com/agemem/agemem/kernels"
)

// Device memory: tensors, the caching allocator and transfers through
// pinned staging memory.

// Tensor is device memory with a shape; a Rows view shares its parent's
// allocation.
type Tensor struct {
	ptr uint64
	kernels.Dims
	base *alloc
	bf16 bool // a weight held as bfloat16 (BF16 mode)
	// q8 holds a weight's Q8_0 block scales (BF16 mode); ptr then holds
	// its int8 values, widened to bf16 for each GEMM (asBF16).
	q8 *Tensor
}

type alloc struct {
	ptr  uint64
	size uint64 // the size class it was allocated with
}

// The pinned staging buffer: its first half is the ring of pending
// uploads, its second half receives downloads. Transfers larger than a
// half go straight from or to pageable memory (weights, whole tensors).
const (
	pinBytes = 16 << 20
	pinHalf  = pinBytes / 2
)

// Allocator limits.
const (
	maxCachedBytes = 4 << 30   // without a memory limit, freed blocks beyond this go back to the driver
	gcEvery        = 512 << 20 // bytes allocated between forced collections
	reclaimEvery   = 128 << 20 // at least this many bytes allocated between reclaims at the memory limit
)

// sizeClass rounds a request up. Small ones (up to 1 MiB) go to a power of
// two (at least 512 bytes), so blocks are reusable across nearby sizes;
// larger ones to a multiple of 2 MiB, as PyTorch's caching allocator
// rounds them: a power of two would hold a 7B model's 136 MiB MLP matrix
// in 256 MiB, nearly doubling the weights on the device.
func sizeClass(n uint64) uint64 {
	if n > largeAlloc {
		return (n + largeRound - 1) &^ (largeRound - 1)
	}
	c := uint64(512)
	for c < n {
		c <<= 1
	}
	return c
}

const (
	largeAlloc = 1 << 20
	largeRound = 2 << 20
)

// takeCached removes and returns a cached block for a request of class
// size: one of that class, else (for large requests) the smallest cached
// block at most an eighth larger, so activations of varying lengths reuse
// each other's blocks. It returns the block's own size. b.mu is held.
func (b *Backend) takeCached(size uint64) (ptr, got uint64) {
	got = size
	if len(b.cache[size]) == 0 {
		if size <= largeAlloc {
			return 0, 0
		}
		got = 0
		for s, list := range b.cache {
			if len(list) > 0 && s > size && s <= size+size/8 && (got == 0 || s < got) {
				got = s
			}
		}
		if got == 0 {
			return 0, 0
		}
	}
	list := b.cache[got]
	ptr = list[len(list)-1]
	b.cache[got] = list[:len(list)-1]
	b.cachedBytes -= got
	return ptr, got
}

func (b *Backend) alloc(n int, shape []int) *Tensor {
	defer b.enter()()
	size := sizeClass(uint64(max(n, 1) * 4))
	b.mu.Lock()
	b.sinceGC += size
	collect := b.sinceGC > gcEvery
	if collect {
		b.sinceGC = 0
	}
	b.mu.Unlock()
	if collect && b.collecting.CompareAndSwap(false, true) {
		// Let Go find the tensors nobody holds; their finalizers queue
		// the blocks, which the next bind() takes into the cache.
		b.mu.Lock()
		b.stats.Collections++
		b.mu.Unlock()
		go func() {
			runtime.GC()
			b.collecting.Store(false)
		}()
	}
	b.mu.Lock()
	p, got := b.takeCached(size)
	b.sinceReclaim += size
	// Past the limit, reclaim; but when live tensors alone stay over it,
	// not at every allocation: once per reclaimEvery bytes allocated.
	over := p == 0 && b.limit > 0 && b.liveBytes+b.cachedBytes+size > b.limit && b.sinceReclaim >= reclaimEvery
	if over {
		b.sinceReclaim = 0
	}
	b.mu.Unlock()
	if over {
		b.reclaim(size)
	}
	b.mu.Lock()
	if over {
		p, got = b.takeCached(size)
	}
	if p != 0 {
		size = got
	}
	b.liveBytes += size
	b.peakBytes = max(b.peakBytes, b.liveBytes+b.cachedBytes)
	b.peakLive = max(b.peakLive, b.liveBytes)
	b.mu.Unlock()
	if p == 0 {
		t0 := time.Now()
		r := libs.cu.MemAlloc(&p, size)
		if r != 0 {
			// Out of memory: collect the tensors nobody holds (up to
			// gcEvery of them wait for the collector), return every
			// cached block and try once more.
			b.collect(func() bool { return false })
			b.releaseCache()
			r = libs.cu.MemAlloc(&p, size)
		}
		must(r.err(fmt.Sprintf("cuMemAlloc %d bytes", size)))
		b.mu.Lock()
		b.stats.DriverAllocs++
		b.stats.DriverTime += time.Since(t0)
		b.mu.Unlock()
	}
	a := &alloc{p, size}
	runtime.SetFinalizer(a, func(a *alloc) {
		b.freeMu.Lock()
		b.free = append(b.free, *a)
		b.freeMu.Unlock()
	})
	return &Tensor{ptr: p, Dims: shape, base: a}
}

// reclaim makes room under the memory limit for a request of size that
// the cache cannot serve: it collects, waits (a few milliseconds at most)
// for the finalizers to hand back the blocks of tensors nobody holds, then
// gives cached blocks back to the driver, largest first, until the live
// tensors, the cache and the request fit. The limit is soft: when the live
// tensors alone exceed it, the request is allocated anyway.
func (b *Backend) reclaim(size uint64) {
	b.mu.Lock()
	b.stats.Reclaims++
	b.mu.Unlock()
	fits := func() bool {
		b.mu.Lock()
		defer b.mu.Unlock()
		return b.liveBytes+b.cachedBytes+size <= b.limit
	}
	if b.collect(fits) {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	t0 := time.Now()
	for b.liveBytes+b.cachedBytes+size > b.limit && b.cachedBytes > 0 {
		var big uint64
		for s, list := range b.cache {
			if len(list) > 0 && s > big {
				big = s
			}
		}
		list := b.cache[big]
		libs.cu.MemFree(list[len(list)-1])
		b.cache[big] = list[:len(list)-1]
		b.cachedBytes -= big
		b.stats.DriverFrees++
	}
	b.stats.DriverTime += time.Since(t0)
}

// collect runs a collection and takes the blocks its tensors' finalizers
// hand back into the cache: they arrive after runtime.GC returns (the
// finalizer goroutine queues them), so it polls, for 5 ms at most, until
// done says so or a poll finds none. It reports done's last answer.
func (b *Backend) collect(done func() bool) bool {
	runtime.GC()
	for i := range 20 {
		b.freeMu.Lock()
		pending := len(b.free)
		b.freeMu.Unlock()
		b.bind()
		if done() {
			return true
		}
		if i > 0 && pending == 0 {
			return false
		}
		time.Sleep(250 * time.Microsecond)
	}
	return done()
}

// SetMemoryLimit bounds the device memory the backend holds, live tensors
// and cache together, at n bytes (0: no bound but the device's own), as a
// card of n bytes would: past it, an allocation first waits for the
// collector and returns cached blocks to the driver (reclaim). Under a
// limit the cache is not capped otherwise. $AGEMEM_CUDA_MEMORY_GIB sets
// it when the backend opens.
func (b *Backend) SetMemoryLimit(n uint64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.limit = n
}

// EmptyCache collects the tensors nobody holds and gives every cached
// block back to the driver, as torch.cuda.empty_cache: what another
// process, or a benchmark's next case, then finds free.
func (b *Backend) EmptyCache() {
	defer b.enter()()
	b.collect(func() bool { return false })
	b.releaseCache()
}

// releaseCache gives every cached block back to the driver.
func (b *Backend) releaseCache() {
	b.mu.Lock()
	defer b.mu.Unlock()
	t0 := time.Now()
	defer func() { b.stats.DriverTime += time.Since(t0) }()
	for size, list := range b.cache {
		for _, p := range list {
			libs.cu.MemFree(p)
			b.stats.DriverFrees++
		}
		delete(b.cache, size)
	}
	b.cachedBytes = 0
}

// Zeros implements kernels.Backend.
func (b *Backend) Zeros(shape ...int) kernels.Tensor {
	defer b.enter()()
	t := &Tensor{Dims: shape}
	n := t.Len()
	t = b.alloc(n, shape)
	b.zero(t.ptr, uint64(n*4))
	return t
}

// Empty implements kernels.Backend: the allocator's block as it is.
func (b *Backend) Empty(shape ...int) kernels.Tensor {
	defer b.enter()()
	t := &Tensor{Dims: shape}
	return b.alloc(t.Len(), shape)
}

func (b *Backend) zero(p, n uint64) {
	must(libs.cu.MemsetD8Async(p, 0, n, b.stream).err("cuMemsetD8Async"))
}

// upload copies n bytes from host memory at src to the device at dst, in
// stream order. Small copies are staged in the pinned ring and queued
// without waiting; when the ring wraps, the stream is synchronised first,
// so no queued copy still reads the bytes being overwritten.
func (b *Backend) upload(dst uint64, src unsafe.Pointer, n uint64) {
	if n == 0 {
		return
	}
	if n > pinHalf/4 {
		// Synchronous from pageable memory, on the legacy stream, which
		// the blocking stream is ordered with.
		must(libs.cu.MemcpyHtoD(dst, src, n).err("cuMemcpyHtoD"))
		return
	}
	b.pinMu.Lock()
	defer b.pinMu.Unlock()
	if b.pinOff+n > pinHalf {
		must(libs.cu.StreamSynchronize(b.stream).err("cuStreamSynchronize"))
		b.pinOff = 0
	}
	stage := unsafe.Add(b.pin, b.pinOff)
	copy(unsafe.Slice((*byte)(stage), n), unsafe.Slice((*byte)(src), n))
	must(libs.cu.MemcpyHtoDAsync(dst, stage, n, b.stream).err("cuMemcpyHtoDAsync"))
	b.pinOff = (b.pinOff + n + 255) &^ 255
}

// download copies n bytes from the device at src to host memory at dst
// once the work queued before it is done (through the pinned half when it
// fits).
func (b *Backend) download(dst unsafe.Pointer, src uint64, n uint64) {
	if n == 0 {
		return
	}
	if n > pinHalf {
		must(libs.cu.MemcpyDtoH(dst, src, n).err("cuMemcpyDtoH"))
		return
	}
	b.pinMu.Lock()
	defer b.pinMu.Unlock()
	stage := unsafe.Add(b.pin, pinHalf)
	must(libs.cu.MemcpyDtoHAsync(stage, src, n, b.stream).err("cuMemcpyDtoHAsync"))
	must(libs.cu.StreamSynchronize(b.stream).err("cuStreamSynchronize"))
	copy(unsafe.Slice((*byte)(dst), n), unsafe.Slice((*byte)(stage), n))
}

// FromHost implements kernels.Backend.
func (b *Backend) FromHost(d []float32, shape ...int) kernels.Tensor {
	defer b.enter()()
	t := b.alloc(len(d), shape)
	if len(d) > 0 {
		b.upload(t.ptr, unsafe.Pointer(&d[0]), uint64(4*len(d)))
	}
	return t
}

func (b *Backend) ints(v []int) *Tensor {
	defer b.enter()()
	x := make([]int32, len(v))
	for i, e := range v {
		x[i] = int32(e)
	}
	t := b.alloc(len(x), []int{len(x)})
	if len(x) > 0 {
		b.upload(t.ptr, unsafe.Pointer(&x[0]), uint64(4*len(x)))
	}
	return t
}

// u64s uploads v (device addresses for a kernel's table).
func (b *Backend) u64s(v []uint64) *Tensor {
	defer b.enter()()
	t := b.alloc(2*len(v), []int{2 * len(v)})
	if len(v) > 0 {
		b.upload(t.ptr, unsafe.Pointer(&v[0]), uint64(8*len(v)))
	}
	return t
}

// ToHost implements kernels.Backend.
func (b *Backend) ToHost(t kernels.Tensor) []float32 {
	defer b.enter()()
	ct := dev(t)
	out := make([]float32, ct.Len())
	if len(out) > 0 {
		b.download(unsafe.Pointer(&out[0]), ct.ptr, uint64(4*len(out)))
	}
	return out
}
