package cuda

import (
	"encoding/binary"
	"math"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"testing"

	"github.com/agemem/agemem/kernels"
	"github.com/agemem/agemem/kernels/cpu"
	"github.com/agemem/agemem/kernels/half"
)

// The CPU emulator of the attention kernels (testdata/emulate.cc) and the
// tests that run the kernels' own source through it, so CI checks kernels
// no GPU has run yet; each has a GPU twin that make test-gpu runs.

// emulator builds testdata/emulate.cc (the kernels' own source on the
// CPU), or skips without a C++ compiler.
func emulator(t *testing.T) string {
	t.Helper()
	cxx, err := exec.LookPath("g++")
	if err != nil {
		if os.Getenv("AGEMEM_REQUIRE_CXX") != "" {
			t.Fatal("a C++ compiler is required here (AGEMEM_REQUIRE_CXX) but g++ is not on the PATH")
		}
		t.Skip("no C++ compiler (g++) to build the emulator")
	}
	bin := filepath.Join(t.TempDir(), "emulate")
	if out, err := exec.Command(cxx, "-std=c++20", "-O1", "-pthread", "-I.", "-o", bin, "testdata/emulate.cc").CombinedOutput(); err != nil {
		t.Fatalf("building the emulator: %v\n%s", err, out)
	}
	return bin
}

// emulate runs the emulator in mode on int32 dims and float32 data and
// returns the float32 values it writes.
func emulate(t *testing.T, bin, mode string, dims []int, data ...[]float32) []float32 {
	t.Helper()
	dir := t.TempDir()
	in, out := filepath.Join(dir, "in"), filepath.Join(dir, "out")
	var buf []byte
	for _, d := range dims {
		buf = binary.LittleEndian.AppendUint32(buf, uint32(d))
	}
	for _, x := range data {
		for _, f := range x {
			buf = binary.LittleEndian.AppendUint32(buf, math.Float32bits(f))
		}
	}
	if err := os.WriteFile(in, buf, 0o644); err != nil {
		t.Fatal(err)
	}
	if msg, err := exec.Command(bin, mode, in, out).CombinedOutput(); err != nil {
		t.Fatalf("emulator %s: %v\n%s", mode, err, msg)
	}
	raw, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	f := make([]float32, len(raw)/4)
	for j := range f {
		f[j] = math.Float32frombits(binary.LittleEndian.Uint32(raw[4*j:]))
	}
	return f
}

// decodeCase is a decode step of n sequences at positions pos over caches
// of maxT rows, with its inputs; a paged sequence's positions lie in its
// buffer in the order rows[r] gives (a block table of blocks of one).
type decodeCase struct {
	heads, kvh, hd, maxT int
	pos                  []int
	rows                 [][]int
	q, k, v, kc, vc      []float32
}

func newDecodeCase(heads, kvh, hd, maxT int, pos []int, paged []bool, seed uint64) decodeCase {
	r := rand.New(rand.NewPCG(seed, 11))
	n, kw := len(pos), kvh*hd
	rows := make([][]int, n)
	for i := range n {
		if paged[i] {
			rows[i] = r.Perm(maxT)
		}
	}
	return decodeCase{heads, kvh, hd, maxT, pos, rows, rnd(r, n*heads*hd), rnd(r, n*kw), rnd(r, n*kw), rnd(r, n*maxT*kw), rnd(r, n*maxT*kw)}
}

// run is DecodeAttention on be: out and the caches after it.
func (c decodeCase) run(be kernels.DecodeAttender) (out, kc, vc []float32) {
	n, kw := len(c.pos), c.kvh*c.hd
	kcs, vcs := make([]kernels.Tensor, n), make([]kernels.Tensor, n)
	for r := range n {
		kcs[r] = be.FromHost(c.kc[r*c.maxT*kw:(r+1)*c.maxT*kw], c.maxT, kw)
		vcs[r] = be.FromHost(c.vc[r*c.maxT*kw:(r+1)*c.maxT*kw], c.maxT, kw)
	}
	o := be.Zeros(n, c.heads*c.hd)
	be.DecodeAttention(o, be.FromHost(c.q, n, c.heads*c.hd), be.FromHost(c.k, n, kw), be.FromHost(c.v, n, kw), kcs, vcs, c.rows, c.pos, c.heads, c.kvh, c.hd)
	for r := range n {
		kc, vc = append(kc, be.ToHost(kcs[r])...), append(vc, be.ToHost(vcs[r])...)
	}
	return be.ToHost(o), kc, vc
}

var decodeCases = []struct {
	heads, kvh, hd, maxT int
	pos                  []int
	paged                []bool
}{{4, 2, 64, 40, []int{0, 7, 39, 12}, []bool{false, true, false, true}}, {3, 1, 33, 300, []int{299, 130}, []bool{true, false}}, {2, 2, 128, 9, []int{5}, []bool{false}}}

// TestDecodeAttentionEmulated: cache_append and attention_batch (one
// launch each for a decode step of every sequence, contiguous and paged
// caches mixed) on the CPU emulator against the CPU backend's
// sequence-by-sequence path: positions from the first to the cache's
// last, GQA groups, head dims under and over a warp.
func TestDecodeAttentionEmulated(t *testing.T) {
	bin := emulator(t)
	for i, dc := range decodeCases {
		c := newDecodeCase(dc.heads, dc.kvh, dc.hd, dc.maxT, dc.pos, dc.paged, uint64(i))
		dst, off, flat := decodeTables(c.rows, c.pos)
		dims := append([]int{len(c.pos), c.heads, c.kvh, c.hd, c.maxT}, c.pos...)
		dims = append(append(append(append(dims, dst...), off...), len(flat)), flat...)
		f := emulate(t, bin, "decode", dims, c.q, c.k, c.v, c.kc, c.vc)
		wo, wk, wv := c.run(cpu.New()) // CopyRows and Attention (or PagedAttention) per sequence
		if len(f) != len(wo)+len(wk)+len(wv) {
			t.Fatalf("case %d: %d values back, want %d", i, len(f), len(wo)+len(wk)+len(wv))
		}
		close(t, "decode out", f[:len(wo)], wo, 1e-5)
		close(t, "decode k cache", f[len(wo):len(wo)+len(wk)], wk, 0)
		close(t, "decode v cache", f[len(wo)+len(wk):], wv, 0)
	}
}

// TestDecodeAttentionOnGPU: the same on the GPU.
func TestDecodeAttentionOnGPU(t *testing.T) {
	g := gpu(t)
	for i, dc := range decodeCases {
		c := newDecodeCase(dc.heads, dc.kvh, dc.hd, dc.maxT, dc.pos, dc.paged, uint64(i))
		gOut, gk, gv := c.run(g)
		wo, wk, wv := c.run(cpu.New())
		close(t, "decode out", gOut, wo, 1e-5)
		close(t, "decode k cache", gk, wk, 0)
		close(t, "decode v cache", gv, wv, 0)
	}
}

// pagedCase is a paged cache's attention: positions 0..start+t-1 in rows
// of a pool of poolRows, scattered as a block table scatters them.
type pagedCase struct {
	t, start, heads, kvh, hd, poolRows int
	rows                               []int
	q, kp, vp                          []float32
}

func newPagedCase(t, start, heads, kvh, hd, blockSize int, seed uint64) pagedCase {
	r := rand.New(rand.NewPCG(seed, 13))
	n := start + t
	blocks := (n + blockSize - 1) / blockSize
	pool := 2*blocks + 1
	order := r.Perm(pool)[:blocks] // the blocks a sequence holds, anywhere in the pool
	rows := make([]int, n)
	for j := range rows {
		rows[j] = order[j/blockSize]*blockSize + j%blockSize
	}
	kw := kvh * hd
	return pagedCase{t, start, heads, kvh, hd, pool * blockSize, rows, rnd(r, t*heads*hd), rnd(r, pool*blockSize*kw), rnd(r, pool*blockSize*kw)}
}

// run is PagedAttention on be.
func (c pagedCase) run(be kernels.PagedAttender) []float32 {
	kw := c.kvh * c.hd
	out := be.Zeros(c.t, c.heads*c.hd)
	be.PagedAttention(out, be.FromHost(c.q, c.t, c.heads*c.hd), be.FromHost(c.kp, c.poolRows, kw), be.FromHost(c.vp, c.poolRows, kw), c.rows, c.start, c.heads, c.kvh, c.hd)
	return be.ToHost(out)
}

// pagedCases: decode steps (1 and 3 queries) over scattered blocks, and
// a prompt long enough for the gathered, tiled path.
var pagedCases = []struct{ t, start, heads, kvh, hd, bs int }{{1, 40, 4, 2, 64, 16}, {3, 70, 3, 1, 48, 8}, {20, 5, 2, 2, 32, 4}}

// TestPagedAttentionEmulated: attention_paged (a block table read where
// the blocks lie) on the CPU emulator against the CPU backend's
// PagedAttention.
func TestPagedAttentionEmulated(t *testing.T) {
	bin := emulator(t)
	for i, pc := range pagedCases {
		if pc.t >= tiledMinRows {
			continue // gathered, then the tiled kernels: TestPagedAttentionOnGPU
		}
		c := newPagedCase(pc.t, pc.start, pc.heads, pc.kvh, pc.hd, pc.bs, uint64(i))
		got := emulate(t, bin, "paged", append([]int{c.t, c.start, c.heads, c.kvh, c.hd, c.poolRows}, c.rows...), c.q, c.kp, c.vp)
		close(t, "paged attention", got, c.run(cpu.New()), 1e-5)
	}
}

// TestPagedAttentionOnGPU: the same on the GPU, the gathered path too.
func TestPagedAttentionOnGPU(t *testing.T) {
	g := gpu(t)
	for i, pc := range pagedCases {
		c := newPagedCase(pc.t, pc.start, pc.heads, pc.kvh, pc.hd, pc.bs, uint64(i))
		close(t, "paged attention", c.run(g), c.run(cpu.New()), 1e-5)
	}
}

// elementwiseCases are lengths that leave a tail of the four-a-thread
// kernels, on pointers aligned and not (off 1: one element past an
// allocation's start, as a Rows view can be).
var elementwiseCases = []struct{ n, off int }{{1, 0}, {7, 1}, {1024, 0}, {1027, 0}, {1027, 1}}

// elementwiseWant: y + 0.5 x, dropout(x) (p 0.25, seed 12345), bf16(x),
// bf16(dropout(x)) and y + dropout(x) on the CPU backend.
func elementwiseWant(x, y []float32) [5][]float32 {
	c := cpu.New()
	xs, ys := c.FromHost(x, len(x)), c.FromHost(y, len(y))
	c.AddScaled(ys, xs, 0.5)
	d := c.Zeros(len(x))
	c.Dropout(d, xs, 0.25, 12345)
	ya := c.FromHost(y, len(y))
	c.DropoutAdd(ya, xs, 0.25, 12345)
	return [5][]float32{c.ToHost(ys), c.ToHost(d), bf16Of(x), bf16Of(c.ToHost(d)), c.ToHost(ya)}
}

// bf16Of: x rounded to bfloat16 (to nearest even) and widened back.
func bf16Of(x []float32) []float32 {
	w := make([]float32, len(x))
	for i, v := range x {
		w[i] = math.Float32frombits(uint32(half.F32ToBF16(v)) << 16)
	}
	return w
}

func checkElementwise(t *testing.T, n, off int, got, want [5][]float32) {
	t.Helper()
	for k, name := range []string{"add_scaled", "dropout", "narrow_bf16", "dropout_bf16", "dropout_add"} {
		for i := range want[k] {
			if got[k][i] != want[k][i] {
				t.Fatalf("%s n %d off %d: element %d is %g, want %g", name, n, off, i, got[k][i], want[k][i])
			}
		}
	}
}

// TestElementwiseEmulated runs the four-a-thread kernels (add_scaled,
// dropout, narrow_bf16, dropout_bf16, dropout_add) through the emulator
// against the CPU backend.
func TestElementwiseEmulated(t *testing.T) {
	bin := emulator(t)
	for _, s := range elementwiseCases {
		r := rand.New(rand.NewPCG(uint64(s.n), uint64(s.off)))
		x, y := rnd(r, s.off+s.n), rnd(r, s.off+s.n)
		f := emulate(t, bin, "elementwise", []int{s.n, s.off}, x, y)
		if len(f) != 5*s.n {
			t.Fatalf("n %d: %d values back, want %d", s.n, len(f), 5*s.n)
		}
		var got [5][]float32
		for k := range got {
			got[k] = f[k*s.n : (k+1)*s.n]
		}
		checkElementwise(t, s.n, s.off, got, elementwiseWant(x[s.off:], y[s.off:]))
	}
}

// TestElementwiseOnGPU is its GPU twin, through the backend's ops on Rows
// views (off 1 misaligns them); in BF16 mode DropoutOperand is
// dropout_bf16 and GEMMOperand narrow_bf16.
func TestElementwiseOnGPU(t *testing.T) {
	g := gpu(t)
	for _, s := range elementwiseCases {
		r := rand.New(rand.NewPCG(uint64(s.n), uint64(s.off)))
		x, y := rnd(r, s.off+s.n), rnd(r, s.off+s.n)
		xs := g.Rows(g.FromHost(x, s.off+s.n, 1), s.off, s.off+s.n)
		ys := g.Rows(g.FromHost(y, s.off+s.n, 1), s.off, s.off+s.n)
		ya := g.Rows(g.FromHost(y, s.off+s.n, 1), s.off, s.off+s.n)
		g.AddScaled(ys, xs, 0.5)
		d := g.Rows(g.Zeros(s.off+s.n, 1), s.off, s.off+s.n)
		g.Dropout(d, xs, 0.25, 12345)
		g.DropoutAdd(ya, xs, 0.25, 12345)
		ids := make([]int, s.n)
		for i := range ids {
			ids[i] = i
		}
		w, wd := g.Zeros(s.n, 1), g.Zeros(s.n, 1)
		g.Embedding(w, g.NarrowBF16(xs), ids)
		wo := g.Zeros(s.n, 1)
		g.BF16 = true
		g.Embedding(wd, g.DropoutOperand(xs, 0.25, 12345), ids)
		g.Embedding(wo, g.GEMMOperand(xs), ids)
		g.BF16 = false
		want := elementwiseWant(x[s.off:], y[s.off:])
		checkElementwise(t, s.n, s.off, [5][]float32{g.ToHost(ys), g.ToHost(d), g.ToHost(w), g.ToHost(wd), g.ToHost(ya)}, want)
		if got := g.ToHost(wo); !slices.Equal(got, want[2]) {
			t.Fatalf("GEMMOperand in BF16 mode, n %d off %d: %v, want bf16(x) %v", s.n, s.off, got, want[2])
		}
	}
}
