package cuda

import (
	_ "embed"
	"fmt"
	"os"
	"runtime"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/agemem/agemem/kernels"
)

// Backend runs the engine's ops on one GPU.
type Backend struct {
	// BF16 selects tensor-core GEMMs: weights uploaded afterwards stay
	// bfloat16 on the device (half the memory), each product rounds its
	// activations (and f32 weights: training's master copies, autocast
	// style) to bf16 and accumulates in f32; the backward GEMMs likewise.
	// Off, GEMMs are f32 and match the CPU backend to float32 rounding.
	BF16 bool

	dev     int32
	ordinal int32
	ctx     uintptr
	blas    uintptr
	fns     map[string]uintptr
	name    string
	arch    string
	sm      int // compute capability, major·10 + minor
	mu      sync.Mutex
	freeMu  sync.Mutex
	free    []alloc // allocations whose tensors were collected

	// The caching allocator: freed blocks wait in per-size-class lists for
	// reuse instead of going back to the driver (cuMemAlloc and cuMemFree
	// synchronise and cost tens of microseconds). Device memory is only
	// known to be free once Go collects the tensor that owned it, so after
	// gcEvery bytes of new allocations a collection is started, in the
	// background: a forced runtime.GC stopped the goroutine that queues
	// kernels for a millisecond and more, long enough for the GPU to run
	// dry.
	cache        map[uint64][]uint64
	cachedBytes  uint64
	sinceGC      uint64
	collecting   atomic.Bool
	limit        uint64 // SetMemoryLimit's bound on liveBytes+cachedBytes (0: none)
	sinceReclaim uint64 // bytes allocated since the last reclaim
	stats        AllocStats
	liveBytes    uint64
	peakBytes    uint64    // the most liveBytes+cachedBytes has been
	peakLive     uint64    // the most liveBytes has been
	prof         *profiler // nil unless StartProfile

	// Every kernel, GEMM, copy and memset of this backend is queued on
	// stream, in order, so the host only waits where it reads results.
	// Small uploads (token ids, positions, activations) go through pinned
	// staging memory as asynchronous copies: a copy from pageable memory
	// would make the host wait until the GPU has drained the stream.
	stream uintptr
	pinMu  sync.Mutex
	pin    unsafe.Pointer // pinBytes of page-locked host memory
	pinOff uint64         // the next free byte of the upload ring
}

// New opens GPU ordinal dev: loads the libraries, retains the primary
// context, compiles the kernels with NVRTC (cached on disk by source hash,
// architecture and NVRTC version) and creates a cuBLAS handle.
func New(dev int) (*Backend, error) {
	if err := loadLibs(); err != nil {
		return nil, err
	}
	cu := &libs.cu
	if err := cu.Init(0).err("cuInit"); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrNoDevice, err)
	}
	var n int32
	if err := cu.DeviceGetCount(&n).err("cuDeviceGetCount"); err != nil || int(n) <= dev {
		return nil, fmt.Errorf("%w: device %d of %d", ErrNoDevice, dev, n)
	}
	b := &Backend{fns: map[string]uintptr{}, cache: map[uint64][]uint64{}, ordinal: int32(dev)}
	limit, err := memoryLimit(os.Getenv("AGEMEM_CUDA_MEMORY_GIB"))
	if err != nil {
		return nil, err
	}
	b.limit = limit
	if err := cu.DeviceGet(&b.dev, int32(dev)).err("cuDeviceGet"); err != nil {
		return nil, err
	}
	var major, minor int32
	cu.DeviceGetAttribute(&major, 75, b.dev) // COMPUTE_CAPABILITY_MAJOR
	cu.DeviceGetAttribute(&minor, 76, b.dev)
	b.arch = fmt.Sprintf("%d%d", major, minor)
	b.sm = int(major*10 + minor)
	name := make([]byte, 256)
	cu.DeviceGetName(&name[0], 256, b.dev)
	b.name = goString(&name[0])
	if err := cu.DevicePrimaryCtxRetain(&b.ctx, b.dev).err("cuDevicePrimaryCtxRetain"); err != nil {
		return nil, err
	}
	defer b.enter()()
	ptx, err := b.compile()
	if err != nil {
		return nil, err
	}
	var mod uintptr
	if err := cu.ModuleLoadData(&mod, unsafe.Pointer(&ptx[0])).err("cuModuleLoadData"); err != nil {
		return nil, err
	}
	for _, k := range kernelNames(source) {
		var f uintptr
		if err := cu.ModuleGetFunction(&f, mod, cstr(k)).err("cuModuleGetFunction " + k); err != nil {
			return nil, err
		}
		b.fns[k] = f
	}
	// The tensor-core attention kernels stage two buffers of tiles: more
	// dynamic shared memory than the default 48 KiB, which sm_80 and later
	// grant a kernel that asks (up to the block's opt-in limit).
	if b.sm >= 80 {
		var optin int32
		cu.DeviceGetAttribute(&optin, 97, b.dev) // MAX_SHARED_MEMORY_PER_BLOCK_OPTIN
		for _, k := range mmaKernels() {
			// 8: CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
			if err := cu.FuncSetAttribute(b.fns[k], 8, optin).err("cuFuncSetAttribute " + k); err != nil {
				return nil, err
			}
		}
	}
	// A blocking stream (flags 0): ordered with anything on the legacy
	// default stream, where synchronous copies run.
	if err := cu.StreamCreate(&b.stream, 0).err("cuStreamCreate"); err != nil {
		return nil, err
	}
	if err := cu.MemAllocHost(&b.pin, pinBytes).err("cuMemAllocHost"); err != nil {
		return nil, err
	}
	if st := libs.blas.Create(&b.blas); st != 0 {
		return nil, fmt.Errorf("cublasCreate: status %d", st)
	}
	if st := libs.blas.SetStream(b.blas, b.stream); st != 0 {
		return nil, fmt.Errorf("cublasSetStream: status %d", st)
	}
	return b, nil
}

// Device describes the GPU.
func (b *Backend) Device() string { return fmt.Sprintf("%s (sm_%s)", b.name, b.arch) }

// Name implements kernels.Backend.
func (b *Backend) Name() string { return "cuda" }

// enter pins the goroutine to its OS thread and makes the context current
// there (a CUDA context is per thread, and goroutines move between threads),
// and frees allocations whose tensors were garbage-collected. Every entry
// point runs `defer b.enter()()`.
func (b *Backend) enter() func() {
	runtime.LockOSThread()
	b.bind()
	return runtime.UnlockOSThread
}

func (b *Backend) bind() {
	libs.cu.CtxSetCurrent(b.ctx)
	b.freeMu.Lock()
	free := b.free
	b.free = nil
	b.freeMu.Unlock()
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, a := range free {
		b.liveBytes -= a.size
		if b.limit == 0 && b.cachedBytes+a.size > maxCachedBytes {
			t0 := time.Now()
			libs.cu.MemFree(a.ptr)
			b.stats.DriverFrees++
			b.stats.DriverTime += time.Since(t0)
			continue
		}
		b.cache[a.size] = append(b.cache[a.size], a.ptr)
		b.cachedBytes += a.size
	}
}

func must(err error) {
	if err != nil {
		panic(err)
	}
}

func dev(t kernels.Tensor) *Tensor {
	ct, ok := t.(*Tensor)
	if !ok {
		panic(fmt.Sprintf("cuda backend: tensor of type %T belongs to another backend", t))
	}
	return ct
}

func ptr(t kernels.Tensor) uint64 {
	if t == nil {
		return 0
	}
	return dev(t).ptr
}

// launch runs kernel k with the given grid, block and dynamic shared memory.
func (b *Backend) launch(k string, grid, block, shared int, args ...any) {
	b.launch2(k, [2]int{grid, 1}, block, shared, args...)
}

// launch2 launches kernel k on a two-dimensional grid.
func (b *Backend) launch2(k string, grid [2]int, block, shared int, args ...any) {
	defer b.enter()()
	params := make([]unsafe.Pointer, len(args))
	keep := make([]any, len(args))
	for i, a := range args {
		switch v := a.(type) {
		case uint64:
			x := v
			keep[i], params[i] = &x, unsafe.Pointer(&x)
		case int32:
			x := v
			keep[i], params[i] = &x, unsafe.Pointer(&x)
		case int64:
			x := v
			keep[i], params[i] = &x, unsafe.Pointer(&x)
		case float32:
			x := v
			keep[i], params[i] = &x, unsafe.Pointer(&x)
		case float64:
			x := v
			keep[i], params[i] = &x, unsafe.Pointer(&x)
		default:
			panic(fmt.Sprintf("cuda: kernel argument of type %T", a))
		}
	}
	defer b.mark(k)()
	must(libs.cu.LaunchKernel(b.fns[k], uint32(max(grid[0], 1)), uint32(max(grid[1], 1)), 1, uint32(block), 1, 1, uint32(shared), b.stream, &params[0], nil).err("launch " + k))
	runtime.KeepAlive(keep)
}

func blocks(n, per int) int { return (n + per - 1) / per }

// blocks4: blocks of 256 threads for the kernels that take four elements a
// thread (elementwise.cu: add_scaled, dropout, narrow_bf16).
func blocks4(n int) int { return blocks((n+3)/4, 256) }

// Upload implements kernels.Backend. In BF16 mode weights stay (or become)
// bfloat16 on the device, and Q8_0 weights stay Q8_0 (8.5 bits a value,
// widened to bf16 for each GEMM); otherwise they are widened to float32.
func (b *Backend) Upload(w kernels.Weight) kernels.Tensor {
	defer b.enter()()
	n := w.Rows * w.Cols
	if w.Q8 != nil && b.BF16 {
		t := b.alloc((n+3)/4, []int{w.Rows, w.Cols})
		b.upload(t.ptr, unsafe.Pointer(&w.Q8[0]), uint64(n))
		t.q8 = b.FromHost(w.Q8Scale, len(w.Q8Scale)).(*Tensor)
		return t
	}
	w = w.Dequantize() // Q8_0 blocks have kernels only in BF16 mode
	if b.BF16 {
		t := b.alloc((n+1)/2, []int{w.Rows, w.Cols})
		t.bf16 = true
		if w.BF16 != nil {
			b.upload(t.ptr, unsafe.Pointer(&w.BF16[0]), uint64(2*n))
		} else {
			f := b.FromHost(w.F32, n)
			b.launch("narrow_bf16", blocks4(n), 256, 0, t.ptr, ptr(f), int64(n))
			runtime.KeepAlive(f)
		}
		return t
	}
	if w.BF16 == nil {
		return b.FromHost(w.F32, w.Rows, w.Cols)
	}
	raw := b.alloc((n+1)/2, []int{n})
	b.upload(raw.ptr, unsafe.Pointer(&w.BF16[0]), uint64(2*n))
	t := b.alloc(n, []int{w.Rows, w.Cols})
	b.launch("widen_bf16", blocks(n, 256), 256, 0, t.ptr, raw.ptr, int64(n))
	runtime.KeepAlive(raw)
	return t
}

// Rows implements kernels.Backend.
func (b *Backend) Rows(t kernels.Tensor, lo, hi int) kernels.Tensor {
	ct := dev(t)
	width := ct.Len() / ct.Dims[0]
	return &Tensor{ptr: ct.ptr + uint64(4*lo*width), Dims: append([]int{hi - lo}, ct.Dims[1:]...), base: ct.base}
}

// CopyRows implements kernels.Backend.
func (b *Backend) CopyRows(dst kernels.Tensor, dstRow int, src kernels.Tensor, srcRow, n int) {
	defer b.enter()()
	d, s := dev(dst), dev(src)
	width := d.Len() / d.Dims[0]
	if n == 0 {
		return
	}
	must(libs.cu.MemcpyDtoDAsync(d.ptr+uint64(4*dstRow*width), s.ptr+uint64(4*srcRow*width), uint64(4*n*width), b.stream).err("cuMemcpyDtoDAsync"))
}

// Embedding implements kernels.Backend.
func (b *Backend) Embedding(out, table kernels.Tensor, ids []int) {
	tt := dev(table)
	if tt.q8 != nil {
		panic("cuda backend: an embedding table held as Q8_0 (only projections are)")
	}
	d := tt.Dims[1]
	idt := b.ints(ids)
	k := "embedding_f32"
	if tt.bf16 {
		k = "embedding_bf16"
	}
	b.launch(k, len(ids), 256, 0, ptr(out), tt.ptr, idt.ptr, int32(d))
	runtime.KeepAlive(idt)
}

// MatMul implements kernels.Backend: y[m,n] = x[m,k] · w[n,k]ᵀ. In cuBLAS's
// column-major terms that is yᵀ = w · xᵀ, i.e. C(n×m) = Aᵀ(n×k) B(k×m)
// with A = w stored k×n.
func (b *Backend) MatMul(y, x, w, bias kernels.Tensor) {
	b.matmul(y, x, w, 1, 0)
	if bias != nil {
		n := dev(w).Dims[0]
		b.launch("bias_add", blocks(y.Len(), 256), 256, 0, ptr(y), ptr(bias), int64(y.Len()), int32(n))
	}
}

// MatMulAdd implements kernels.TrainBackend: MatMul's GEMM with alpha s
// and beta 1.
func (b *Backend) MatMulAdd(y, x, w kernels.Tensor, s float32) {
	b.matmul(y, x, w, s, 1)
}

// matmul: y = alpha·x·wᵀ + beta·y.
func (b *Backend) matmul(y, x, w kernels.Tensor, alpha, beta float32) {
	defer b.enter()()
	wt := dev(w)
	n, k := wt.Dims[0], wt.Dims[1]
	m := dev(x).Len() / k
	if wt.bf16 || b.BF16 {
		// Round the activations (and an f32 weight: training's autocast) to
		// bf16, then a tensor-core GEMM with f32 accumulation and output.
		wp, wk := b.asBF16(w)
		xp, xk := b.asBF16(x)
		b.gemmBF16(1, 0, n, m, k, alpha, wp, k, xp, k, beta, ptr(y), n)
		runtime.KeepAlive(wk)
		runtime.KeepAlive(xk)
	} else if st := b.sgemm(1, 0, int32(n), int32(m), int32(k), &alpha, wt.ptr, int32(k), ptr(x), int32(k), &beta, ptr(y), int32(n)); st != 0 {
		panic(fmt.Sprintf("cublasSgemm: status %d", st))
	}
}

// asBF16 returns t's data as bfloat16 on the device: t itself when it is
// held so, else a rounded (or, from Q8_0, widened) copy, returned too to
// keep it alive.
func (b *Backend) asBF16(t kernels.Tensor) (uint64, *Tensor) {
	ct := dev(t)
	if ct.bf16 {
		return ct.ptr, nil
	}
	n := ct.Len()
	c := b.alloc((n+1)/2, []int{n})
	if ct.q8 != nil {
		b.launch("dequant_q8_bf16", blocks(n, 256), 256, 0, c.ptr, ct.ptr, ct.q8.ptr, int64(n))
		runtime.KeepAlive(ct)
		return c.ptr, c
	}
	b.launch("narrow_bf16", blocks4(n), 256, 0, c.ptr, ct.ptr, int64(n))
	return c.ptr, c
}

// sgemm is cublasSgemm on the backend's handle (timed when profiling).
func (b *Backend) sgemm(ta, tb, m, n, k int32, alpha *float32, a uint64, lda int32, bm uint64, ldb int32, beta *float32, c uint64, ldc int32) int32 {
	defer b.mark("cublasSgemm (f32)")()
	return libs.blas.Sgemm(b.blas, ta, tb, m, n, k, alpha, a, lda, bm, ldb, beta, c, ldc)
}

// gemmBF16 is cublasGemmEx on bf16 A and B with f32 C, accumulation in f32
// (CUDA_R_16BF = 14, CUDA_R_32F = 0, CUBLAS_COMPUTE_32F = 68,
// CUBLAS_GEMM_DEFAULT = -1): C = A·B + beta·C, column-major, op codes as
// cuBLAS's (0 N, 1 T).
func (b *Backend) gemmBF16(ta, tb int32, m, n, k int, alpha float32, a uint64, lda int, bm uint64, ldb int, beta float32, c uint64, ldc int) {
	defer b.mark("cublasGemmEx (bf16)")()
	if st := libs.blas.GemmEx(b.blas, ta, tb, int32(m), int32(n), int32(k), unsafe.Pointer(&alpha), a, 14, int32(lda), bm, 14, int32(ldb),
		unsafe.Pointer(&beta), c, 0, int32(ldc), 68, -1); st != 0 {
		panic(fmt.Sprintf("cublasGemmEx: status %d", st))
	}
}

// RMSNorm implements kernels.Backend.
func (b *Backend) RMSNorm(y, x, w kernels.Tensor, eps float32) {
	d := dev(w).Len()
	rows := dev(x).Len() / d
	b.launch("rmsnorm", rows, 256, 0, ptr(y), ptr(x), ptr(w), int32(d), eps)
}

// Rope implements kernels.Backend.
func (b *Backend) Rope(x kernels.Tensor, pos []int, heads, headDim int, theta float64) {
	pt := b.ints(pos)
	n := len(pos) * heads * headDim / 2
	b.launch("rope", blocks(n, 256), 256, 0, ptr(x), pt.ptr, int32(len(pos)), int32(heads), int32(headDim), theta, float32(1))
	runtime.KeepAlive(pt)
}

// Attention implements kernels.Backend.
func (b *Backend) Attention(out, q, kc, vc kernels.Tensor, valid []bool, start, heads, kvHeads, hd int) {
	t := dev(q).Len() / (heads * hd)
	var vt *Tensor
	var vp uint64
	if valid != nil {
		v := make([]int, len(valid))
		for i, ok := range valid {
			if ok {
				v[i] = 1
			}
		}
		vt = b.ints(v)
		vp = vt.ptr
	}
	if valid == nil && t >= tiledMinRows && b.mmaAttention(hd) {
		b.attentionMMA(out, nil, q, kc, vc, t, start, heads, kvHeads, hd)
		return
	}
	if valid == nil && t >= tiledMinRows && hd <= tiledMaxHeadDim {
		b.attentionTiled(out, nil, q, kc, vc, t, start, heads, kvHeads, hd)
		return
	}
	b.launch("attention", t*heads, attnThreads, attnShared(hd), ptr(out), ptr(q), ptr(kc), ptr(vc), vp, uint64(0), int32(start), int32(heads), int32(kvHeads), int32(hd))
	runtime.KeepAlive(vt)
}

// PagedAttention implements kernels.PagedAttender. A few queries (a
// decode step) read the pool where it lies (attention_paged); a prompt's
// many gather their rows first and take the tiled (or tensor-core)
// kernels, whose tiles want contiguous keys.
func (b *Backend) PagedAttention(out, q, kpool, vpool kernels.Tensor, rows []int, start, heads, kvHeads, hd int) {
	t := dev(q).Len() / (heads * hd)
	if t == 0 {
		return
	}
	if t >= tiledMinRows && hd <= tiledMaxHeadDim {
		w := kvHeads * hd
		kc, vc := b.Zeros(len(rows), w), b.Zeros(len(rows), w)
		b.Embedding(kc, kpool, rows)
		b.Embedding(vc, vpool, rows)
		b.Attention(out, q, kc, vc, nil, start, heads, kvHeads, hd)
		return
	}
	rt := b.ints(rows)
	b.launch("attention_paged", t*heads, attnThreads, attnShared(hd), ptr(out), ptr(q), ptr(kpool), ptr(vpool), rt.ptr,
		int32(start), int32(heads), int32(kvHeads), int32(hd))
	runtime.KeepAlive(rt)
}

// DecodeAttention implements kernels.DecodeAttender: the step's keys and
// values appended and its attention run in two launches for all the
// sequences, the caches' addresses and paged block tables in small tables.
func (b *Backend) DecodeAttention(out, q, k, v kernels.Tensor, kc, vc []kernels.Tensor, rows [][]int, pos []int, heads, kvHeads, hd int) {
	n := len(pos)
	if n == 0 {
		return
	}
	addr := make([]uint64, 2*n)
	for r := range n {
		addr[r], addr[n+r] = ptr(kc[r]), ptr(vc[r])
	}
	dst, off, flat := decodeTables(rows, pos)
	at, dt, ot, pt, ft := b.u64s(addr), b.ints(dst), b.ints(off), b.ints(pos), b.ints(flat)
	vcs := at.ptr + uint64(8*n)
	b.launch("cache_append", n, 128, 0, at.ptr, vcs, ptr(k), ptr(v), dt.ptr, int32(kvHeads*hd))
	b.launch("attention_batch", n*heads, attnThreads, attnShared(hd), ptr(out), ptr(q), at.ptr, vcs, ft.ptr, ot.ptr, pt.ptr,
		int32(heads), int32(kvHeads), int32(hd))
	runtime.KeepAlive(kc)
	runtime.KeepAlive(vc)
	for _, t := range []*Tensor{at, dt, ot, pt, ft} {
		runtime.KeepAlive(t)
	}
}

// decodeTables are attention_batch's and cache_append's tables for a
// decode step: each row's destination row in its cache or pool, and the
// block tables of the paged ones end to end (off[r] where row r's starts,
// -1 for a contiguous cache).
func decodeTables(rows [][]int, pos []int) (dst, off, flat []int) {
	dst, off = make([]int, len(pos)), make([]int, len(pos))
	for r, p := range pos {
		dst[r], off[r] = p, -1
		if rows[r] != nil {
			dst[r], off[r] = rows[r][p], len(flat)
			flat = append(flat, rows[r][:p+1]...)
		}
	}
	return dst, off, flat
}

// SiLUMul implements kernels.Backend.
func (b *Backend) SiLUMul(out, gate, up kernels.Tensor) {
	n := dev(out).Len()
	b.launch("silu_mul", blocks(n, 256), 256, 0, ptr(out), ptr(gate), ptr(up), int64(n))
}

// Add implements kernels.Backend.
func (b *Backend) Add(y, x kernels.Tensor) {
	n := dev(y).Len()
	b.launch("add", blocks(n, 256), 256, 0, ptr(y), ptr(x), int64(n))
}

func (b *Backend) softmax(y, x kernels.Tensor, logp int32) {
	xt := dev(x)
	d := xt.Dims[len(xt.Dims)-1]
	b.launch("softmax_rows", xt.Len()/d, 256, 0, ptr(y), ptr(x), int32(d), logp)
}

// Softmax implements kernels.Backend.
func (b *Backend) Softmax(y, x kernels.Tensor) { b.softmax(y, x, 0) }

// LogSoftmax implements kernels.Backend.
func (b *Backend) LogSoftmax(y, x kernels.Tensor) { b.softmax(y, x, 1) }

// TopK implements kernels.TopKer: for each row of queries [q, d], the k
// rows of index [n, d] with the largest dot product, best first (ties:
// lower row), and their scores. With L2-normalised rows that is cosine
// top-k (Eq. 8-9): one GEMM for all the scores, then selection blocks.
func (b *Backend) TopK(index, queries kernels.Tensor, k int) ([][]int, [][]float32, error) {
	defer b.enter()()
	it, qt := dev(index), dev(queries)
	n, d := it.Dims[0], it.Dims[1]
	q := qt.Len() / d
	if k < 1 || k > kernels.MaxTopK {
		return nil, nil, fmt.Errorf("top-k: k = %d is outside [1, %d]", k, kernels.MaxTopK)
	}
	if qt.Dims[len(qt.Dims)-1] != d {
		return nil, nil, fmt.Errorf("top-k: queries have dimension %d, the index %d", qt.Dims[len(qt.Dims)-1], d)
	}
	scores := b.Zeros(q, n)
	b.MatMul(scores, queries, index, nil)
	// Pass 1: each row in chunks, a block each, so a few queries still fill
	// the GPU; pass 2: the chunks' winners of each row.
	// Candidate lists live in shared memory (8 bytes a slot): stay within
	// the 48 KiB a block gets without opting in.
	const chunkLen = 16384
	threads := min(128, (48<<10)/(k*8)/32*32)
	chunks := (n + chunkLen - 1) / chunkLen
	pIdx, pVal := b.alloc(q*chunks*k, []int{q, chunks * k}), b.alloc(q*chunks*k, []int{q, chunks * k})
	b.launch("topk_select", q*chunks, threads, threads*k*8, ptr(scores), uint64(0), int64(n), int64(chunkLen), int32(k), pIdx.ptr, pVal.ptr)
	idx, val := b.alloc(q*k, []int{q, k}), b.alloc(q*k, []int{q, k})
	b.launch("topk_select", q, threads, threads*k*8, pVal.ptr, pIdx.ptr, int64(chunks*k), int64(chunks*k), int32(k), idx.ptr, val.ptr)
	runtime.KeepAlive(pIdx)
	runtime.KeepAlive(pVal)
	rawIdx := make([]int32, q*k)
	b.download(unsafe.Pointer(&rawIdx[0]), idx.ptr, uint64(4*q*k))
	vals := b.ToHost(val)
	rows, scs := make([][]int, q), make([][]float32, q)
	for i := range q {
		for j := range k {
			if rawIdx[i*k+j] < 0 {
				break // fewer than k rows in the index
			}
			rows[i] = append(rows[i], int(rawIdx[i*k+j]))
			scs[i] = append(scs[i], vals[i*k+j])
		}
	}
	runtime.KeepAlive(scores)
	return rows, scs, nil
}

// Sync waits for the device to finish queued work (for timing).
func (b *Backend) Sync() {
	defer b.enter()()
	must(libs.cu.CtxSynchronize().err("cuCtxSynchronize"))
}

// MemInfo reports free and total device memory in bytes.
func (b *Backend) MemInfo() (free, total uint64) {
	defer b.enter()()
	libs.cu.MemGetInfo(&free, &total)
	return
}

var _ kernels.TopKer = (*Backend)(nil)
