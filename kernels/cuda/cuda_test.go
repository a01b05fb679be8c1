package cuda

import (
	"errors"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/agemem/agemem/embed"
	"github.com/agemem/agemem/kernels"
	"github.com/agemem/agemem/kernels/cpu"
)

// needNVRTC fails on err, or skips where NVRTC could not be loaded (unless
// $AGEMEM_REQUIRE_NVRTC, as CI sets).
func needNVRTC(t *testing.T, err error) {
	t.Helper()
	if err != nil && libs.nvrtc.CompileProgram == nil {
		if os.Getenv("AGEMEM_REQUIRE_NVRTC") != "" {
			t.Fatalf("NVRTC is required here (AGEMEM_REQUIRE_NVRTC) but: %v", err)
		}
		t.Skipf("NVRTC not found, kernels not compiled: %v", err)
	}
	if err != nil {
		t.Fatal(err)
	}
}

// TestKernelsCompile compiles every kernel with NVRTC for sm_80 and sm_90.
// It needs only libnvrtc, not a GPU.
func TestKernelsCompile(t *testing.T) {
	for _, arch := range []string{"80", "90"} {
		ptx, err := Compile(arch)
		needNVRTC(t, err)
		if len(ptx) < 1000 {
			t.Fatalf("sm_%s: PTX of %d bytes", arch, len(ptx))
		}
	}
}

// TestKernelsAssemble: ptxas (through NVRTC) turns every kernel into
// sm_80 and sm_90 machine code, which checks the inline PTX (mma.sync,
// ldmatrix, cp.async) that compiling to PTX copies unread, and the
// tensor-core attention kernels keep their fragments in registers: a
// spill would put every mma's operands through local memory.
func TestKernelsAssemble(t *testing.T) {
	for _, arch := range []string{"80", "90"} {
		report, err := Assemble(arch)
		needNVRTC(t, err)
		for _, k := range mmaKernels() {
			m := regexp.MustCompile(`Function properties for ` + k + `\n[^\n]*?(\d+) bytes spill stores[^\n]*\n[^\n]*Used (\d+) registers`).FindStringSubmatch(report)
			if m == nil {
				t.Fatalf("sm_%s: no ptxas report of %s's registers in:\n%s", arch, k, report)
			}
			if m[1] != "0" {
				t.Errorf("sm_%s: %s spills %s bytes of registers", arch, k, m[1])
			}
			t.Logf("sm_%s %s: %s registers, no spills", arch, k, m[2])
		}
	}
}

// TestEveryLaunchIsAKernel: the kernels are found in the source rather than
// listed by hand, so every name the Go side launches must be one the
// source defines (and each defined once), and the PTX must define each.
func TestEveryLaunchIsAKernel(t *testing.T) {
	defined := map[string]int{}
	for _, k := range kernelNames(source) {
		defined[k]++
	}
	if len(defined) < 20 {
		t.Fatalf("%d kernels found in the source", len(defined))
	}
	launch := regexp.MustCompile(`\.(?:launch2?|dropout)\("(\w+)"`)
	files, _ := filepath.Glob("*.go")
	launched := 0
	for _, f := range files {
		raw, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range launch.FindAllStringSubmatch(string(raw), -1) {
			launched++
			if defined[m[1]] != 1 {
				t.Errorf("%s launches %q, defined %d times in the kernel source", f, m[1], defined[m[1]])
			}
		}
	}
	if launched < 20 {
		t.Fatalf("only %d launches found", launched)
	}
	// The tensor-core kernels are launched by computed name (mmaKernel).
	for _, k := range mmaKernels() {
		if defined[k] != 1 {
			t.Errorf("mmaKernels names %q, defined %d times in the kernel source", k, defined[k])
		}
	}
	if !strings.Contains(mmaKernel("attention_mma_dkv", 128), "_hd128") || mmaKernel("attention_mma", 48) != "attention_mma" {
		t.Errorf("mmaKernel picks %q for hd 128 and %q for 48", mmaKernel("attention_mma_dkv", 128), mmaKernel("attention_mma", 48))
	}
	ptx, err := Compile("80")
	if err != nil {
		t.Skipf("NVRTC not found, PTX not checked: %v", err)
	}
	for k := range defined {
		if !strings.Contains(string(ptx), ".entry "+k+"(") {
			t.Errorf("the PTX has no entry %s", k)
		}
	}
}

func gpu(t *testing.T) *Backend {
	b, err := New(0)
	if errors.Is(err, ErrNoDevice) {
		t.Skipf("GPU test skipped: %v", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("device: %s", b.Device())
	return b
}

func rnd(r *rand.Rand, n int) []float32 {
	v := make([]float32, n)
	for i := range v {
		v[i] = float32(r.NormFloat64())
	}
	return v
}

func close(t *testing.T, name string, got, want []float32, tol float64) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%s: %d values, want %d", name, len(got), len(want))
	}
	worst := 0.0
	for i := range want {
		d := math.Abs(float64(got[i]-want[i])) / math.Max(1, math.Abs(float64(want[i])))
		worst = math.Max(worst, d)
	}
	if worst > tol || math.IsNaN(worst) {
		t.Fatalf("%s: max relative error %.3g > %.3g", name, worst, tol)
	}
	t.Logf("%-12s max relative error %.2e", name, worst)
}

// TestOpsMatchCPU runs every op on both backends with the same inputs.
func TestOpsMatchCPU(t *testing.T) {
	g := gpu(t)
	c := cpu.New()
	r := rand.New(rand.NewPCG(1, 2))
	both := func(f func(be kernels.Backend) kernels.Tensor) ([]float32, []float32) {
		return g.ToHost(f(g)), c.ToHost(f(c))
	}
	const m, k, n = 37, 300, 129
	x, w, bias := rnd(r, m*k), rnd(r, n*k), rnd(r, n)
	wb := make([]uint16, n*k)
	for i := range wb {
		wb[i] = uint16(math.Float32bits(w[i]) >> 16)
	}
	for _, wt := range []kernels.Weight{{Rows: n, Cols: k, F32: w}, {Rows: n, Cols: k, BF16: wb}} {
		got, want := both(func(be kernels.Backend) kernels.Tensor {
			y := be.Zeros(m, n)
			be.MatMul(y, be.FromHost(x, m, k), be.Upload(wt), be.FromHost(bias, n))
			return y
		})
		close(t, "matmul", got, want, 1e-4)
	}
	// BF16 mode: tensor-core GEMM on bf16 weights and bf16-rounded
	// activations equals the CPU product of the same rounded values.
	g.BF16 = true
	yg := g.Zeros(m, n)
	g.MatMul(yg, g.FromHost(x, m, k), g.Upload(kernels.Weight{Rows: n, Cols: k, BF16: wb}), g.FromHost(bias, n))
	g.BF16 = false
	xb := make([]float32, len(x))
	for i, v := range x {
		xb[i] = bf16Round(v)
	}
	yc := c.Zeros(m, n)
	c.MatMul(yc, c.FromHost(xb, m, k), c.Upload(kernels.Weight{Rows: n, Cols: k, BF16: wb}), c.FromHost(bias, n))
	close(t, "matmul bf16", g.ToHost(yg), c.ToHost(yc), 1e-4)
	// A Q8_0 weight in BF16 mode (model.train_dtype: q8_0) stays in blocks
	// and is widened to bf16 for the GEMM: the CPU product of the rounded
	// values.
	const k8 = 320
	x8, w8 := rnd(r, m*k8), rnd(r, n*k8)
	q8, err := kernels.QuantizeQ8(kernels.Weight{Rows: n, Cols: k8, F32: w8})
	if err != nil {
		t.Fatal(err)
	}
	g.BF16 = true
	y8 := g.Zeros(m, n)
	g.MatMul(y8, g.FromHost(x8, m, k8), g.Upload(q8), nil)
	g.BF16 = false
	w8r := q8.Dequantize().F32
	for i, v := range w8r {
		w8r[i] = bf16Round(v)
	}
	for i, v := range x8 {
		x8[i] = bf16Round(v)
	}
	yc8 := c.Zeros(m, n)
	c.MatMul(yc8, c.FromHost(x8, m, k8), c.FromHost(w8r, n, k8), nil)
	close(t, "matmul q8_0", g.ToHost(y8), c.ToHost(yc8), 1e-4)
	got, want := both(func(be kernels.Backend) kernels.Tensor {
		d := 64
		y := be.Zeros(m*k/d, d)
		be.RMSNorm(y, be.FromHost(x[:m*k/d*d], m*k/d, d), be.FromHost(w[:d], d), 1e-6)
		return y
	})
	close(t, "rmsnorm", got, want, 1e-5)
	const tt, heads, kvh, hd, start = 5, 4, 2, 32, 7
	pos := []int{7, 8, 9, 10, 11}
	q := rnd(r, tt*heads*hd)
	got, want = both(func(be kernels.Backend) kernels.Tensor {
		y := be.FromHost(q, tt, heads*hd)
		be.Rope(y, pos, heads, hd, 1e6)
		return y
	})
	close(t, "rope", got, want, 1e-5)
	kc, vc := rnd(r, 16*kvh*hd), rnd(r, 16*kvh*hd)
	for _, valid := range [][]bool{nil, {true, false, true, true, false, true, true, true, true, true, false, true, true, true, true, true}} {
		got, want = both(func(be kernels.Backend) kernels.Tensor {
			out := be.Zeros(tt, heads*hd)
			be.Attention(out, be.FromHost(q, tt, heads*hd), be.FromHost(kc, 16, kvh*hd), be.FromHost(vc, 16, kvh*hd), valid, start, heads, kvh, hd)
			return out
		})
		close(t, "attention", got, want, 1e-5)
	}
	a, b2 := rnd(r, 1000), rnd(r, 1000)
	got, want = both(func(be kernels.Backend) kernels.Tensor {
		y := be.Zeros(1000)
		be.SiLUMul(y, be.FromHost(a, 1000), be.FromHost(b2, 1000))
		be.Add(y, be.FromHost(a, 1000))
		return y
	})
	close(t, "silu+add", got, want, 1e-5)
	got, want = both(func(be kernels.Backend) kernels.Tensor {
		y := be.Zeros(10, 100)
		be.LogSoftmax(y, be.FromHost(a, 10, 100))
		return y
	})
	close(t, "logsoftmax", got, want, 1e-5)
	got, want = both(func(be kernels.Backend) kernels.Tensor {
		y := be.Zeros(10, 100)
		be.Softmax(y, be.FromHost(a, 10, 100))
		return y
	})
	close(t, "softmax", got, want, 1e-5)
	got, want = both(func(be kernels.Backend) kernels.Tensor {
		y := be.Zeros(3, k)
		be.Embedding(y, be.Upload(kernels.Weight{Rows: n, Cols: k, BF16: wb}), []int{5, 0, 128})
		dst := be.Zeros(6, k)
		be.CopyRows(dst, 2, be.Rows(y, 1, 3), 0, 2)
		return dst
	})
	close(t, "embed+copy", got, want, 0)

	// The encoder ops: LayerNorm (rows offset far from zero), both GELUs,
	// tanh, attention within packed sequences, per-sequence means.
	const ed = 96
	xe := rnd(r, 20*ed)
	for i := range xe[:ed] {
		xe[i] += 50
	}
	got, want = both(func(be kernels.Backend) kernels.Tensor {
		y := be.Zeros(20, ed)
		be.LayerNorm(y, be.FromHost(xe, 20, ed), be.FromHost(w[:ed], ed), be.FromHost(bias[:ed], ed), 1e-12)
		return y
	})
	close(t, "layernorm", got, want, 1e-5)
	for _, approx := range []bool{false, true} {
		got, want = both(func(be kernels.Backend) kernels.Tensor {
			y, th := be.Zeros(20, ed), be.Zeros(20, ed)
			be.GELU(y, be.FromHost(xe, 20, ed), approx)
			be.Tanh(th, y)
			be.Add(y, th)
			return y
		})
		close(t, "gelu+tanh", got, want, 1e-5)
	}
	bounds := []int{0, 3, 4, 11, 20} // a one-token sequence among them
	const eh, ehd = 3, 32
	qe, ke, ve := rnd(r, 20*eh*ehd), rnd(r, 20*eh*ehd), rnd(r, 20*eh*ehd)
	got, want = both(func(be kernels.Backend) kernels.Tensor {
		out := be.Zeros(20, eh*ehd)
		be.SegmentAttention(out, be.FromHost(qe, 20, eh*ehd), be.FromHost(ke, 20, eh*ehd), be.FromHost(ve, 20, eh*ehd), bounds, eh, ehd)
		m := be.Zeros(len(bounds)-1, eh*ehd)
		be.SegmentMean(m, out, bounds)
		return m
	})
	close(t, "segment attention+mean", got, want, 1e-5)
}

// bf16Round rounds to the nearest bfloat16, ties to even, as the device does.
func bf16Round(f float32) float32 {
	u := math.Float32bits(f)
	u += 0x7fff + (u>>16)&1
	return math.Float32frombits(u &^ 0xffff)
}

// TestAllocatorBoundsMemory allocates 3 GiB of short-lived tensors: the
// caching allocator must reuse blocks (forcing collections as needed) so
// the device never holds much more than the collection interval.
func TestAllocatorBoundsMemory(t *testing.T) {
	g := gpu(t)
	free0, total := g.MemInfo()
	for i := range 3072 {
		x := g.Zeros(256, 1024) // 1 MiB
		if i%512 == 0 {
			g.Add(x, x)
		}
	}
	free1, _ := g.MemInfo()
	used := int64(free0) - int64(free1)
	live, cached := g.MemStats()
	t.Logf("3 GiB allocated in 1 MiB tensors: device memory grew by %d MiB (live %d MiB, cached %d MiB, total %d GiB)", used>>20, live>>20, cached>>20, total>>30)
	if used > 1<<30+gcEvery {
		t.Fatalf("device memory grew by %d MiB: blocks are not reused", used>>20)
	}
}

// TestTopKMatchesCPUIndex compares GPU cosine top-k with the CPU index.
func TestTopKMatchesCPUIndex(t *testing.T) {
	g := gpu(t)
	r := rand.New(rand.NewPCG(9, 9))
	const n, d, q, k = 50000, 64, 5, 10
	data := rnd(r, n*d)
	idx := embed.NewIndex(d)
	for i := range n {
		embed.Normalize(data[i*d : (i+1)*d])
		idx.Add(data[i*d : (i+1)*d])
	}
	qs := rnd(r, q*d)
	for i := range q {
		embed.Normalize(qs[i*d : (i+1)*d])
	}
	rows, scores, err := g.TopK(g.FromHost(data, n, d), g.FromHost(qs, q, d), k)
	if err != nil {
		t.Fatal(err)
	}
	for i := range q {
		want, _ := idx.Search(qs[i*d:(i+1)*d], k, nil)
		for j := range k {
			if rows[i][j] != want[j].Row || math.Abs(float64(scores[i][j]-want[j].Score)) > 1e-4 {
				t.Fatalf("query %d rank %d: GPU row %d (%.5f), CPU row %d (%.5f)", i, j, rows[i][j], scores[i][j], want[j].Row, want[j].Score)
			}
		}
	}
	// k = MaxTopK, and an index smaller than k.
	rows, _, err = g.TopK(g.FromHost(data, n, d), g.FromHost(qs, q, d), kernels.MaxTopK)
	if err != nil {
		t.Fatal(err)
	}
	want, _ := idx.Search(qs[:d], kernels.MaxTopK, nil)
	for j := range kernels.MaxTopK {
		if rows[0][j] != want[j].Row {
			t.Fatalf("k=64 rank %d: GPU row %d, CPU row %d", j, rows[0][j], want[j].Row)
		}
	}
	rows, _, err = g.TopK(g.FromHost(data[:5*d], 5, d), g.FromHost(qs, q, d), 10)
	if err != nil || len(rows[0]) != 5 {
		t.Fatalf("index of 5 rows, k = 10: %v %v", rows, err)
	}
	if _, _, err := g.TopK(g.FromHost(data, n, d), g.FromHost(qs, q, d), 65); err == nil {
		t.Fatal("k above MaxTopK must be refused")
	}
}

// BenchmarkTopK1Mx768 reports GPU top-10 queries/s over 1,000,000 × 768
// vectors in batches of 32 queries (compare with torch.topk on the same
// machine: model/qwen/testdata/torch_anchors.py prints it).
func BenchmarkTopK1Mx768(b *testing.B) {
	g, err := New(0)
	if err != nil {
		b.Skip(err)
	}
	const n, d, q = 1_000_000, 768, 32
	index := g.Zeros(n, d)
	queries := g.Zeros(q, d)
	g.TopK(index, queries, 10)
	g.Sync()
	for b.Loop() {
		if _, _, err := g.TopK(index, queries, 10); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(q*b.N)/b.Elapsed().Seconds(), "queries/s")
}

// TestIndexOnGPUMatchesScan: an embed.Index searched on the GPU answers
// as the CPU scan does, through replaced, removed and added rows (the
// device copy synced lazily) and filters.
func TestIndexOnGPUMatchesScan(t *testing.T) {
	g := gpu(t)
	r := rand.New(rand.NewPCG(13, 14))
	const d = 128
	onGPU, onCPU := embed.NewIndex(d), embed.NewIndex(d)
	onGPU.OnDevice(g)
	add := func(n int) {
		for range n {
			v := rnd(r, d)
			onGPU.Add(v)
			onCPU.Add(v)
		}
	}
	check := func(what string, k int, keep func(int) bool) {
		q := rnd(r, d)
		got, err := onGPU.Search(q, k, keep)
		if err != nil {
			t.Fatal(err)
		}
		want, _ := onCPU.Search(q, k, keep)
		if len(got) != len(want) {
			t.Fatalf("%s: %d hits, CPU %d", what, len(got), len(want))
		}
		for i := range want {
			if got[i].Row != want[i].Row || math.Abs(float64(got[i].Score-want[i].Score)) > 1e-4 {
				t.Fatalf("%s: hit %d GPU %+v, CPU %+v", what, i, got[i], want[i])
			}
		}
	}
	add(embed.DeviceMinFloats / d)
	check("plain", 10, nil)
	check("filtered", 5, func(row int) bool { return row%3 == 0 })
	v := rnd(r, d)
	onGPU.Set(100, v)
	onCPU.Set(100, v)
	onGPU.SwapRemove(7)
	onCPU.SwapRemove(7)
	add(5000)
	check("after Set, SwapRemove and growth", 10, nil)
}

// BenchmarkIndexSearchGPU reports single-query top-10 searches/s of an
// embed.Index of 1,000,000 × 768 on the GPU (query upload and result
// download included) beside the memory-bandwidth bound: the index read
// once per query at the device-to-device copy rate measured in the run.
func BenchmarkIndexSearchGPU(b *testing.B) {
	g, err := New(0)
	if err != nil {
		b.Skip(err)
	}
	const n, d = 1_000_000, 768
	r := rand.New(rand.NewPCG(1, 1))
	idx := embed.NewIndex(d)
	idx.OnDevice(g)
	row := rnd(r, d)
	for i := range n {
		row[i%d] += 1
		idx.Add(row)
	}
	q := rnd(r, d)
	idx.Search(q, 10, nil)                     // copies the index to the device
	src, dst := g.Zeros(1<<28), g.Zeros(1<<28) // 1 GiB each
	g.CopyRows(dst, 0, src, 0, 1<<28)
	g.Sync()
	t0 := time.Now()
	for range 5 {
		g.CopyRows(dst, 0, src, 0, 1<<28)
	}
	g.Sync()
	bw := 5 * 2 * float64(1<<30) / time.Since(t0).Seconds() // read + write
	b.ResetTimer()
	for b.Loop() {
		if _, err := idx.Search(q, 10, nil); err != nil {
			b.Fatal(err)
		}
	}
	qps := float64(b.N) / b.Elapsed().Seconds()
	bound := bw / (n * d * 4)
	b.ReportMetric(qps, "queries/s")
	b.ReportMetric(bound, "bound_queries/s")
	b.ReportMetric(qps/bound, "ratio")
}

// TestAllocatorSizeClasses: small requests share power-of-two blocks, large
// ones round to 2 MiB (a 136 MiB matrix must not take 256 MiB), and a
// cached large block serves a request at most an eighth smaller.
func TestAllocatorSizeClasses(t *testing.T) {
	for _, c := range []struct{ n, want uint64 }{{1, 512}, {513, 1024}, {1 << 20, 1 << 20}, {1<<20 + 1, 2 << 20},
		{18944 * 3584 * 2, 18944*3584*2 + (2<<20 - 18944*3584*2%(2<<20))}, {4 << 20, 4 << 20}} {
		if got := sizeClass(c.n); got != c.want {
			t.Errorf("sizeClass(%d) = %d, want %d", c.n, got, c.want)
		}
	}
	b := &Backend{cache: map[uint64][]uint64{100 << 20: {7}, 64 << 20: {9}, 1024: {3}}, cachedBytes: 164<<20 + 1024}
	if p, got := b.takeCached(90 << 20); p != 7 || got != 100<<20 {
		t.Errorf("90 MiB request: block %d of %d bytes, want the cached 100 MiB one", p, got)
	}
	if p, _ := b.takeCached(50 << 20); p != 0 {
		t.Errorf("50 MiB request took block %d: 64 MiB is more than an eighth larger", p)
	}
	if p, _ := b.takeCached(512); p != 0 {
		t.Errorf("512-byte request took block %d of another class", p)
	}
	if p, got := b.takeCached(1024); p != 3 || got != 1024 {
		t.Errorf("1 KiB request: block %d of %d bytes", p, got)
	}
	if b.cachedBytes != 64<<20 {
		t.Errorf("cachedBytes %d after taking two blocks, want %d", b.cachedBytes, 64<<20)
	}
}

// TestProfileTimesKernels: between StartProfile and StopProfile each launch
// and GEMM is counted under its kernel's name with a positive device time.
func TestProfileTimesKernels(t *testing.T) {
	g := gpu(t)
	if err := g.StartProfile(); err != nil {
		t.Skipf("no profiling: %v", err)
	}
	x, w := g.FromHost(make([]float32, 64*256), 64, 256), g.Upload(kernels.Weight{Rows: 128, Cols: 256, F32: make([]float32, 128*256)})
	y := g.Zeros(64, 128)
	for range 3 {
		g.MatMul(y, x, w, nil)
		g.Add(y, y)
	}
	p, err := g.StopProfile()
	if err != nil {
		t.Fatal(err)
	}
	calls := map[string]int{}
	for _, r := range p.Rows {
		calls[r.Name] = r.Calls
		if r.Time <= 0 {
			t.Fatalf("%s: device time %v", r.Name, r.Time)
		}
	}
	if calls["add"] != 3 || calls["cublasSgemm (f32)"] != 3 {
		t.Fatalf("calls by kernel %v: want 3 adds and 3 SGEMMs", calls)
	}
	if _, err := g.StopProfile(); err == nil {
		t.Fatal("a second StopProfile did not fail")
	}
}

// TestMemoryLimitSetting: $AGEMEM_CUDA_MEMORY_GIB is a positive number of
// GiB or unset; anything else is an error that names the variable.
func TestMemoryLimitSetting(t *testing.T) {
	for v, want := range map[string]uint64{"": 0, "24": 24 << 30, "0.5": 1 << 29, "1e1": 10 << 30} {
		got, err := memoryLimit(v)
		if err != nil || got != want {
			t.Errorf("%q: %d, %v; want %d", v, got, err, want)
		}
	}
	for _, v := range []string{"0", "-3", "24GiB", "NaN", "inf", " 24"} {
		if _, err := memoryLimit(v); err == nil || !strings.Contains(err.Error(), "AGEMEM_CUDA_MEMORY_GIB") {
			t.Errorf("%q: error %v, want one naming AGEMEM_CUDA_MEMORY_GIB", v, err)
		}
	}
}
