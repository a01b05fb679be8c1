// Package cpu holds the forward kernels of the Qwen engine on float32 slices,
// parallel over cores. Each function names its shapes; row-major throughout.
// These are the readable reference the CUDA kernels are checked against.
package cpu

import (
	"math"
	"sync"

	"github.com/agemem/agemem/kernels/vec"
)

// MatMulT computes y[m,n] = sum_k x[m,k] * w[n,k] (+ bias[n]): a Linear
// layer with PyTorch's weight layout w[out, in]. bias may be nil.
//
// Tiled so that a block of x rows and a block of w rows, both cut to a k
// chunk, stay in L2 while every pair among them is dotted: without the
// tiling a long k (MLP down-projection, k = 4864) streams x from memory
// once per output column.
func MatMulT(y, x, w, bias []float32, m, k, n int) {
	matMulTiled(y, x, bias, m, k, n, func(j0, j1, k0, k1 int, _ []float32) ([]float32, int) {
		return w[j0*k+k0:], k
	})
}

const tileM, tileN, tileK = 16, 16, 1024

// tileBufs holds the 64 KiB buffers 16-bit and Q8_0 weights are widened
// into. Reused, not allocated per product: a fresh one each call was a
// cleared large allocation, 8% of a GRPO step's CPU time on the tiny
// model's small products (and garbage for the collector).
var tileBufs = sync.Pool{New: func() any { return new([tileN * tileK]float32) }}

// matMulTiled is the tiled product; rows(j0, j1, k0, k1, buf) returns W's
// rows j0..j1-1 cut to columns k0..k1-1 as a slice with its row stride,
// either a view of float32 weights or bf16 ones widened into buf.
func matMulTiled(y, x, bias []float32, m, k, n int, rows func(j0, j1, k0, k1 int, buf []float32) ([]float32, int)) {
	nTiles := (n + tileN - 1) / tileN
	parallelFor(nTiles, m*k*tileN, func(lo, hi int) {
		bp := tileBufs.Get().(*[tileN * tileK]float32)
		defer tileBufs.Put(bp)
		buf := bp[:]
		var acc [8]float32
		for jt := lo; jt < hi; jt++ {
			j0, j1 := jt*tileN, min((jt+1)*tileN, n)
			for i := range m {
				for j := j0; j < j1; j++ {
					if bias != nil {
						y[i*n+j] = bias[j]
					} else {
						y[i*n+j] = 0
					}
				}
			}
			for k0 := 0; k0 < k; k0 += tileK {
				kc := min(k0+tileK, k) - k0
				wt, ld := rows(j0, j1, k0, k0+kc, buf) // wt[(j-j0)*ld + c]
				for i0 := 0; i0 < m; i0 += tileM {
					i1 := min(i0+tileM, m)
					// 2×4 register tiles, then the ragged edges one dot at a time.
					j := j0
					for ; j+4 <= j1; j += 4 {
						wj := wt[(j-j0)*ld:]
						i := i0
						for ; i+2 <= i1; i += 2 {
							vec.Dot2x4(x[i*k+k0:], k, wj, ld, kc, &acc)
							for a := range 2 {
								for b := range 4 {
									y[(i+a)*n+j+b] += acc[a*4+b]
								}
							}
						}
						if i < i1 {
							// The odd row: Dot1x4 gives what Dot2x4 gives
							// for a row, bit for bit, so a row's result never
							// depends on whether it had a partner: decoding
							// beside other sequences gives the tokens decoding
							// alone gives, and a seeded run is reproducible.
							var one [4]float32
							vec.Dot1x4(x[i*k+k0:i*k+k0+kc], wj, ld, kc, &one)
							for b := range 4 {
								y[i*n+j+b] += one[b]
							}
						}
					}
					for ; j < j1; j++ {
						for i := i0; i < i1; i++ {
							y[i*n+j] += vec.Dot(x[i*k+k0:i*k+k0+kc], wt[(j-j0)*ld:])
						}
					}
				}
			}
		}
	})
}

// RMSNorm computes y[r,:] = x[r,:] / sqrt(mean(x[r,:]^2) + eps) * w, for
// rows of length d.
func RMSNorm(y, x, w []float32, d int, eps float32) {
	for r := 0; r < len(x)/d; r++ {
		row := x[r*d : (r+1)*d]
		ss := vec.Dot(row, row)
		inv := float32(1 / math.Sqrt(float64(ss/float32(d)+eps)))
		out := y[r*d : (r+1)*d]
		for i, v := range row {
			out[i] = v * inv * w[i]
		}
	}
}

// RopeTables returns cos and sin of shape [maxPos, headDim/2] for base theta:
// angle(p, i) = p * theta^(-2i/headDim).
func RopeTables(maxPos, headDim int, theta float64) (cos, sin []float32) {
	half := headDim / 2
	cos = make([]float32, maxPos*half)
	sin = make([]float32, maxPos*half)
	for p := range maxPos {
		for i := range half {
			a := float64(p) * math.Pow(theta, -2*float64(i)/float64(headDim))
			cos[p*half+i] = float32(math.Cos(a))
			sin[p*half+i] = float32(math.Sin(a))
		}
	}
	return cos, sin
}

type ropeKey struct {
	headDim int
	theta   float64
}

type ropeTable struct {
	maxPos   int
	cos, sin []float32
}

var ropes struct {
	sync.Mutex
	tabs map[ropeKey]*ropeTable
}

// CachedRopeTables returns RopeTables covering every position in pos, built
// once per head size and base and grown (doubling) as positions grow: the
// trig of a table is a tenth of a small model's training step if rebuilt
// every call. Tables are never written after they are published.
func CachedRopeTables(pos []int, headDim int, theta float64) (cos, sin []float32) {
	maxPos := 0
	for _, p := range pos {
		maxPos = max(maxPos, p+1)
	}
	ropes.Lock()
	defer ropes.Unlock()
	if ropes.tabs == nil {
		ropes.tabs = map[ropeKey]*ropeTable{}
	}
	k := ropeKey{headDim, theta}
	tab := ropes.tabs[k]
	if tab == nil || tab.maxPos < maxPos {
		n := max(maxPos, 256)
		if tab != nil {
			n = max(n, 2*tab.maxPos)
		}
		c, s := RopeTables(n, headDim, theta)
		tab = &ropeTable{n, c, s}
		ropes.tabs[k] = tab
	}
	return tab.cos, tab.sin
}

// Rope rotates x[t, heads, headDim] in place as Qwen (and HF's rotate_half)
// does: the first and second halves of each head form the pairs.
// pos[t] is token t's position.
func Rope(x []float32, pos []int, heads, headDim int, cos, sin []float32) {
	half := headDim / 2
	for t, p := range pos {
		c, s := cos[p*half:(p+1)*half], sin[p*half:(p+1)*half]
		for h := range heads {
			v := x[(t*heads+h)*headDim : (t*heads+h+1)*headDim]
			for i := range half {
				a, b := v[i], v[i+half]
				v[i] = a*c[i] - b*s[i]
				v[i+half] = b*c[i] + a*s[i]
			}
		}
	}
}

// SiLUMul computes out = silu(gate) * up elementwise (SwiGLU).
func SiLUMul(out, gate, up []float32) {
	parallelFor(len(gate), 8, func(lo, hi int) {
		var sb [siluChunk]float32
		for c := lo; c < hi; c += siluChunk {
			g := gate[c:min(c+siluChunk, hi)]
			s := sb[:len(g)]
			sigmoid(s, g)
			for i, v := range g {
				out[c+i] = v * s[i] * up[c+i]
			}
		}
	})
}

// siluChunk elements are sigmoided at a time, on the stack.
const siluChunk = 512

// sigmoid sets s[i] = σ(g[i]) with the vector exponential, whose argument
// −|g| is never positive: σ(g) = 1/(1+e^−g) for g ≥ 0 and e^g/(1+e^g)
// below, so neither form overflows. It is what math.Exp gives to within
// the kernel's relative error (5e-7), at a fraction of the time: SwiGLU's
// exponentials were an eighth of a small model's training step.
func sigmoid(s, g []float32) {
	for i, v := range g {
		s[i] = -abs32(v)
	}
	vec.ExpSub(s, 0)
	for i, v := range g {
		if e := s[i]; v >= 0 {
			s[i] = 1 / (1 + e)
		} else {
			s[i] = e / (1 + e)
		}
	}
}

func abs32(v float32) float32 { return math.Float32frombits(math.Float32bits(v) &^ (1 << 31)) }

// Add computes y += x.
func Add(y, x []float32) {
	for i, v := range x {
		y[i] += v
	}
}

// Softmax normalises x in place (max-subtracted).
func Softmax(x []float32) {
	m := float32(math.Inf(-1))
	for _, v := range x {
		m = max(m, v)
	}
	var s float32
	for i, v := range x {
		e := float32(math.Exp(float64(v - m)))
		x[i] = e
		s += e
	}
	for i := range x {
		x[i] /= s
	}
}

// LogSoftmax writes log(softmax(x)) into y.
func LogSoftmax(y, x []float32) {
	m := float64(maxOf(x))
	var s float64
	for _, v := range x {
		s += math.Exp(float64(v) - m)
	}
	lse := m + math.Log(s)
	for i, v := range x {
		y[i] = float32(float64(v) - lse)
	}
}

// Attention is causal grouped-query attention for one sequence.
// q[t, heads, d] holds the new tokens at positions start..start+t-1;
// kc and vc [maxT, kvHeads, d] hold keys and values of positions 0..start+t-1
// (the cache, new tokens already written). valid, if not nil, masks cache
// positions (false = padding) on top of causality. out[t, heads, d].
func Attention(out, q, kc, vc []float32, valid []bool, t, start, heads, kvHeads, d int) {
	attend(out, q, kc, vc, valid, nil, t, heads, kvHeads, d, start+t, func(i int) (int, int) {
		return 0, start + i + 1 // causal: keys 0..start+i
	})
}

// PagedAttention is Attention over keys and values kept in a block pool:
// position j's are row rows[j] of kpool and vpool [rows, kvHeads, d]
// (vLLM's block table, one entry per position), read where they are, so
// paging costs no copy. It computes what Attention computes over the
// gathered rows, in the same order, to the bit.
func PagedAttention(out, q, kpool, vpool []float32, rows []int, t, start, heads, kvHeads, d int) {
	attend(out, q, kpool, vpool, nil, rows, t, heads, kvHeads, d, start+t, func(i int) (int, int) {
		return 0, start + i + 1
	})
}

// SegmentAttention is bidirectional attention over packed sequences:
// q, k, v, out [t, heads, d], row i attending to the rows of its segment
// [bounds[s], bounds[s+1]).
func SegmentAttention(out, q, k, v []float32, bounds []int, heads, d int) {
	t := bounds[len(bounds)-1]
	seg := make([]int, t)
	longest := 0
	for s := range len(bounds) - 1 {
		for i := bounds[s]; i < bounds[s+1]; i++ {
			seg[i] = s
		}
		longest = max(longest, bounds[s+1]-bounds[s])
	}
	attend(out, q, k, v, nil, nil, t, heads, heads, d, longest, func(i int) (int, int) {
		return bounds[seg[i]], bounds[seg[i]+1]
	})
}

// attend is softmax attention of each query row i over the key rows
// keys(i) = [lo, hi) (at most span of them), valid masking keys; with rows
// (a block table) key j is row rows[j] of kc and vc.
func attend(out, q, kc, vc []float32, valid []bool, rows []int, t, heads, kvHeads, d, span int, keys func(i int) (lo, hi int)) {
	group := heads / kvHeads
	scale := float32(1 / math.Sqrt(float64(d)))
	parallelFor(t*heads, span*d, func(lo, hi int) {
		buf := make([]float32, span)
		for th := lo; th < hi; th++ {
			i, h := th/heads, th%heads
			kvh := h / group
			qv := q[(i*heads+h)*d : (i*heads+h+1)*d]
			j0, j1 := keys(i)
			scores := buf[:j1-j0]
			m := float32(math.Inf(-1))
			for jj := range scores {
				j := j0 + jj
				if valid != nil && !valid[j] {
					scores[jj] = float32(math.Inf(-1))
					continue
				}
				r := j
				if rows != nil {
					r = rows[j]
				}
				scores[jj] = vec.Dot(qv, kc[(r*kvHeads+kvh)*d:(r*kvHeads+kvh+1)*d]) * scale
				m = max(m, scores[jj])
			}
			o := out[(i*heads+h)*d : (i*heads+h+1)*d]
			clear(o)
			if math.IsInf(float64(m), -1) {
				continue // every key masked: output zeros, not NaN
			}
			// ExpSub gives a masked key exp(−87), not 0: zero it, so that
			// whatever its row holds never reaches the output.
			inv := 1 / vec.ExpSub(scores, m)
			for jj := range scores {
				if valid != nil && !valid[j0+jj] {
					continue
				}
				r := j0 + jj
				if rows != nil {
					r = rows[r]
				}
				vec.Axpy(o, vc[(r*kvHeads+kvh)*d:(r*kvHeads+kvh+1)*d], scores[jj]*inv)
			}
		}
	})
}
