package cuda

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/agemem/agemem/kernels"
	"github.com/agemem/agemem/kernels/cpu"
)

// mmaShape is an attention problem for the tensor-core kernels: t queries
// after start cached positions, GQA heads over kvh kv heads.
type mmaShape struct{ t, start, heads, kvh, hd int }

// mmaShapes cover partial query blocks and key tiles, a prefix (start),
// groups of 1, 2 and 3 heads, every head_dim the kernels take in k-steps
// of 16 up to 128, fewer queries than a warp's 16 rows, and enough key
// and query tiles that both staging buffers are reused; the last is the
// Qwen2.5-7B shape's group of 7 heads a KV head, after a prefix.
var mmaShapes = []mmaShape{{70, 0, 4, 2, 128}, {50, 29, 3, 1, 64}, {17, 0, 2, 2, 16}, {9, 60, 2, 1, 48}, {150, 40, 6, 2, 32}, {100, 37, 7, 1, 128}}

// mmaInputs draws q, k, v and dout for s.
func mmaInputs(s mmaShape, seed uint64) (q, k, v, dout []float32) {
	r := rand.New(rand.NewPCG(seed, 7))
	nk := s.start + s.t
	return rnd(r, s.t*s.heads*s.hd), rnd(r, nk*s.kvh*s.hd), rnd(r, nk*s.kvh*s.hd), rnd(r, s.t*s.heads*s.hd)
}

// attentionOn runs Attention and AttentionBackward on be: out, dq, dk, dv.
func attentionOn(be kernels.TrainBackend, s mmaShape, q, k, v, dout []float32) [4][]float32 {
	nk := s.start + s.t
	qt, kt, vt := be.FromHost(q, s.t, s.heads*s.hd), be.FromHost(k, nk, s.kvh*s.hd), be.FromHost(v, nk, s.kvh*s.hd)
	out := be.Zeros(s.t, s.heads*s.hd)
	be.Attention(out, qt, kt, vt, nil, s.start, s.heads, s.kvh, s.hd)
	dq, dk, dv := be.Zeros(s.t, s.heads*s.hd), be.Zeros(nk, s.kvh*s.hd), be.Zeros(nk, s.kvh*s.hd)
	be.AttentionBackward(dq, dk, dv, be.FromHost(dout, s.t, s.heads*s.hd), out, qt, kt, vt, s.start, s.heads, s.kvh, s.hd)
	return [4][]float32{be.ToHost(out), be.ToHost(dq), be.ToHost(dk), be.ToHost(dv)}
}

// bf16Close holds a tensor-core result to the float32 one: within tol of
// the largest magnitude (bf16 operands carry 8 bits) and pointing the same
// way (cosine > 0.999), which a wrong mask, row or fragment cannot do.
func bf16Close(t *testing.T, name string, got, want []float32, tol float64) {
	t.Helper()
	var scale, worst, dot, g2, w2 float64
	for i, w := range want {
		g := float64(got[i])
		scale = math.Max(scale, math.Abs(float64(w)))
		worst = math.Max(worst, math.Abs(g-float64(w)))
		dot += g * float64(w)
		g2 += g * g
		w2 += float64(w) * float64(w)
	}
	cos := dot / math.Sqrt(g2*w2)
	if !(worst <= tol*scale) || !(cos > 0.999) {
		t.Fatalf("%s: max error %.3g relative to %.3g (> %.g), cosine %.5f", name, worst, scale, tol, cos)
	}
	t.Logf("%-24s max error %.2e of %.2e, cosine %.6f", name, worst, scale, cos)
}

// checkMMA holds out, dq, dk and dv of the tensor-core kernels to the CPU
// backend's float32 attention.
func checkMMA(t *testing.T, s mmaShape, q, k, v, dout []float32, got [4][]float32) {
	t.Helper()
	want := attentionOn(cpu.New(), s, q, k, v, dout)
	for i, name := range []string{"out", "dq", "dk", "dv"} {
		bf16Close(t, name+" "+shapeName(s), got[i], want[i], 2e-2)
	}
}

func shapeName(s mmaShape) string {
	return fmt.Sprintf("t%d+%d h%d/%d d%d", s.t, s.start, s.heads, s.kvh, s.hd)
}

// TestMMAAttentionMatchesFloat32: on a GPU of sm_80 or later in BF16 mode,
// Attention and AttentionBackward take the tensor-core kernels; their
// results against the CPU backend's float32 attention.
func TestMMAAttentionMatchesFloat32(t *testing.T) {
	g := gpu(t)
	if g.sm < 80 {
		t.Skipf("sm_%s: no bf16 mma.sync (sm_80 and later)", g.arch)
	}
	g.BF16 = true
	defer func() { g.BF16 = false }()
	for i, s := range mmaShapes {
		if !g.mmaAttention(s.hd) {
			t.Fatalf("head_dim %d does not take the tensor-core kernels", s.hd)
		}
		q, k, v, dout := mmaInputs(s, uint64(i))
		got := attentionOn(g, s, q, k, v, dout)
		checkMMA(t, s, q, k, v, dout, got)
		// The training path that keeps the forward's log-sum-exps for the
		// backward: the same kernels on the same lse, so the same bits
		// (below tiledMinRows queries Attention takes the row kernel).
		keep := attentionLSEOn(t, g, s, q, k, v, dout)
		if s.t < tiledMinRows {
			checkMMA(t, s, q, k, v, dout, keep)
			continue
		}
		for j, name := range []string{"out", "dq", "dk", "dv"} {
			for e := range got[j] {
				if keep[j][e] != got[j][e] {
					t.Fatalf("%s %s: AttentionLSE's path gives %g at %d, AttentionBackward's %g", name, shapeName(s), keep[j][e], e, got[j][e])
				}
			}
		}
	}
}

// attentionLSEOn is attentionOn through kernels.LSEAttender.
func attentionLSEOn(t *testing.T, g *Backend, s mmaShape, q, k, v, dout []float32) [4][]float32 {
	nk := s.start + s.t
	qt, kt, vt := g.FromHost(q, s.t, s.heads*s.hd), g.FromHost(k, nk, s.kvh*s.hd), g.FromHost(v, nk, s.kvh*s.hd)
	out, lse := g.Zeros(s.t, s.heads*s.hd), g.Zeros(s.t, s.heads)
	if !g.AttentionLSE(out, lse, qt, kt, vt, s.start, s.heads, s.kvh, s.hd) {
		t.Fatalf("%s: the tensor-core kernels did not keep the lse", shapeName(s))
	}
	dq, dk, dv := g.Zeros(s.t, s.heads*s.hd), g.Zeros(nk, s.kvh*s.hd), g.Zeros(nk, s.kvh*s.hd)
	g.AttentionBackwardLSE(dq, dk, dv, g.FromHost(dout, s.t, s.heads*s.hd), out, lse, qt, kt, vt, s.start, s.heads, s.kvh, s.hd)
	return [4][]float32{g.ToHost(out), g.ToHost(dq), g.ToHost(dk), g.ToHost(dv)}
}

// TestMMAAttentionEmulated runs the tensor-core kernels' own source on the
// CPU (testdata/emulate.cc: threads as GPU threads, mma.sync and ldmatrix
// from the PTX ISA's fragment layouts, cp.async landing late and early),
// so that CI checks their tiling, masking, online softmax, fragment reuse
// and double-buffered staging without a GPU.
func TestMMAAttentionEmulated(t *testing.T) {
	bin := emulator(t)
	for i, s := range mmaShapes {
		q, k, v, dout := mmaInputs(s, uint64(i))
		f := emulate(t, bin, "mma", []int{s.t, s.start, s.heads, s.kvh, s.hd}, q, k, v, dout)
		nq, nkv, nl := len(q), len(k), s.t*s.heads
		if len(f) != 2*nq+nl+2*nkv {
			t.Fatalf("%s: %d values back, want %d", shapeName(s), len(f), 2*nq+nl+2*nkv)
		}
		got := [4][]float32{f[:nq], f[nq+nl : 2*nq+nl], f[2*nq+nl : 2*nq+nl+nkv], f[2*nq+nl+nkv:]}
		checkMMA(t, s, q, k, v, dout, got)
		// The emulator lands cp.async copies as late as the ISA allows
		// (a tile read before its wait and barrier reads stale data); with
		// them landing at once instead (a buffer refilled while a warp
		// still reads it is overwritten early), the same bits.
		early := emulate(t, bin, "mma-early", []int{s.t, s.start, s.heads, s.kvh, s.hd}, q, k, v, dout)
		for j := range f {
			if early[j] != f[j] {
				t.Fatalf("%s: value %d is %g with copies landing at once, %g landing at their wait", shapeName(s), j, early[j], f[j])
			}
		}
		// The lse pass: each row's log-sum-exp of its scaled scores.
		lse := f[nq : nq+nl]
		worst := 0.0
		for i := range s.t {
			for h := range s.heads {
				kvh := h / (s.heads / s.kvh)
				var m, z float64 = math.Inf(-1), 0
				sc := make([]float64, s.start+i+1)
				for j := range sc {
					for d := range s.hd {
						sc[j] += float64(q[(i*s.heads+h)*s.hd+d]) * float64(k[(j*s.kvh+kvh)*s.hd+d])
					}
					sc[j] /= math.Sqrt(float64(s.hd))
					m = math.Max(m, sc[j])
				}
				for _, x := range sc {
					z += math.Exp(x - m)
				}
				worst = math.Max(worst, math.Abs(float64(lse[i*s.heads+h])-(m+math.Log(z))))
			}
		}
		if worst > 0.05 {
			t.Fatalf("%s: row log-sum-exps off by %.3g", shapeName(s), worst)
		}
	}
}
