package cuda

import (
	"fmt"
	"runtime"
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
	maxCachedBytes = 4 << 30   // beyond this, freed blocks go back to the driver
	gcEvery        = 512 << 20 // bytes allocated between forced collections
)

// sizeClass rounds a request up to a power of two (at least 512 bytes), so
// blocks are reusable across nearby sizes.
func sizeClass(n uint64) uint64 {
	c := uint64(512)
	for c < n {
		c <<= 1
	}
	return c
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
	if collect {
		// Let Go find the tensors nobody holds, then take their blocks.
		runtime.GC()
		b.bind()
	}
	b.mu.Lock()
	var p uint64
	if list := b.cache[size]; len(list) > 0 {
		p = list[len(list)-1]
		b.cache[size] = list[:len(list)-1]
		b.cachedBytes -= size
	}
	b.liveBytes += size
	b.mu.Unlock()
	if p == 0 {
		r := libs.cu.MemAlloc(&p, size)
		if r != 0 {
			// Out of memory: return every cached block and try once more.
			b.releaseCache()
			r = libs.cu.MemAlloc(&p, size)
		}
		must(r.err(fmt.Sprintf("cuMemAlloc %d bytes", size)))
	}
	a := &alloc{p, size}
	runtime.SetFinalizer(a, func(a *alloc) {
		b.freeMu.Lock()
		b.free = append(b.free, *a)
		b.freeMu.Unlock()
	})
	return &Tensor{ptr: p, Dims: shape, base: a}
}

// releaseCache gives every cached block back to the driver.
func (b *Backend) releaseCache() {
	b.mu.Lock()
	defer b.mu.Unlock()
	for size, list := range b.cache {
		for _, p := range list {
			libs.cu.MemFree(p)
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
