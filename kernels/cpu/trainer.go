package cpu

import (
	"fmt"
	"math"

	"github.com/agemem/agemem/kernels"
	"github.com/agemem/agemem/kernels/half"
)

var _ kernels.TrainBackend = (*Backend)(nil)

// Zero implements kernels.TrainBackend.
func (*Backend) Zero(t kernels.Tensor) { clear(data(t)) }

// AddScaled implements kernels.TrainBackend.
func (*Backend) AddScaled(y, x kernels.Tensor, s float32) {
	yd := data(y)
	for i, v := range data(x) {
		yd[i] += s * v
	}
}

// MatMulAdd implements kernels.TrainBackend.
func (b *Backend) MatMulAdd(y, x, w kernels.Tensor, s float32) {
	t := b.Zeros(y.Shape()...)
	b.MatMul(t, x, w, nil)
	b.AddScaled(y, t, s)
}

// NarrowBF16 implements kernels.TrainBackend.
func (b *Backend) NarrowBF16(x kernels.Tensor) kernels.Tensor {
	xd := data(x)
	bits := make([]uint16, len(xd))
	for i, v := range xd {
		bits[i] = half.F32ToBF16(v)
	}
	rows := x.Shape()[0]
	return b.Upload(kernels.Weight{Rows: rows, Cols: len(xd) / max(rows, 1), BF16: bits})
}

// NarrowBF16Into implements kernels.TrainBackend: dst's matrix is
// replaced in place, so every holder of dst reads the new values.
func (b *Backend) NarrowBF16Into(dst, x kernels.Tensor) {
	d := host(dst)
	if d.w == nil || d.w.BF16 == nil || d.Len() != x.Len() {
		panic(fmt.Sprintf("cpu backend: NarrowBF16Into a tensor that is not a bf16 weight of %d values", x.Len()))
	}
	*d.w = *host(b.NarrowBF16(x)).w
}

// Dropout implements kernels.TrainBackend.
func (*Backend) Dropout(y, x kernels.Tensor, p float64, seed uint64) {
	yd, thr, scale := data(y), kernels.DropoutThreshold(p), float32(1/(1-p))
	for i, v := range data(x) {
		if kernels.DropoutBits(seed, uint64(i)) >= thr {
			yd[i] = v * scale
		} else {
			yd[i] = 0
		}
	}
}

// GEMMOperand implements kernels.TrainBackend: the CPU's GEMMs read
// float32, x itself.
func (*Backend) GEMMOperand(x kernels.Tensor) kernels.Tensor { return x }

// DropoutOperand implements kernels.TrainBackend: the CPU's GEMMs read
// float32, so it is Dropout into a new tensor.
func (b *Backend) DropoutOperand(x kernels.Tensor, p float64, seed uint64) kernels.Tensor {
	y := b.Empty(x.Shape()...)
	b.Dropout(y, x, p, seed)
	return y
}

// DropoutAdd implements kernels.TrainBackend.
func (*Backend) DropoutAdd(y, x kernels.Tensor, p float64, seed uint64) {
	yd, thr, scale := data(y), kernels.DropoutThreshold(p), float32(1/(1-p))
	for i, v := range data(x) {
		if kernels.DropoutBits(seed, uint64(i)) >= thr {
			yd[i] += v * scale
		}
	}
}

// MatMulBackward implements kernels.TrainBackend. w may be an uploaded
// (possibly bf16) weight: it is widened for dx's product, as the reference
// the GPU's bf16 GEMM is held to; dw does not read w (a bf16 working copy
// under ZeRO-2 gets its gradient so).
func (*Backend) MatMulBackward(dx, dw, db, dy, x, w kernels.Tensor) {
	wt := host(w)
	n, k := wt.Dims[0], wt.Dims[1]
	xd := data(x)
	wd := wt.Data
	if wt.w != nil && dx != nil {
		wd = make([]float32, n*k)
		for r := range n {
			wt.w.RowTo(wd[r*k:(r+1)*k], r)
		}
	}
	LinearBackward(data(dx), data(dw), data(db), data(dy), xd, wd, len(xd)/k, k, n)
}

// LinearBackward is MatMulTBackward for float32 through the tiled
// matmuls. dx = dy·w multiplies by w's transpose; dw is computed as its
// transpose, dwᵀ[k,n] = xᵀ·dy, so that what is transposed is x and the
// [n, k] result, never dy: with n a vocabulary and k a small hidden size,
// dy is by far the largest, and transposing it cost as much as the product.
func LinearBackward(dx, dw, db, dy, x, w []float32, m, k, n int) {
	switch {
	case dx == nil:
	case n <= 8*k:
		// dx += dy·w straight from w's [n, k] layout: the 4×16 tiles run a
		// layer's shapes 1.2-2.3× faster than transposing w for the dot
		// kernels (BenchmarkLinearBackwardDX).
		MatMulNNAdd(dx, dy, w, m, n, k)
	default:
		// A vocabulary over a narrow hidden size: the k-strips are too few
		// and the dot kernels win.
		tmp := make([]float32, m*k)
		MatMulT(tmp, dy, Transpose(w, n, k), nil, m, n, k)
		Add(dx, tmp)
	}
	if dw != nil {
		tmp := make([]float32, k*n)
		MatMulNNAdd(tmp, Transpose(x, m, k), dy, k, m, n)
		Add(dw, Transpose(tmp, k, n))
	}
	if db != nil {
		for i := range m {
			Add(db, dy[i*n:(i+1)*n])
		}
	}
}

// RMSNormBackward implements kernels.TrainBackend.
func (*Backend) RMSNormBackward(dx, dw, dy, x, w kernels.Tensor, eps float32) {
	wd := data(w)
	RMSNormBackward(data(dx), data(dw), data(dy), data(x), wd, len(wd), eps)
}

// RopeBackward implements kernels.TrainBackend.
func (*Backend) RopeBackward(dy kernels.Tensor, pos []int, heads, headDim int, theta float64) {
	RopeBackward(data(dy), pos, heads, headDim, theta)
}

// SiLUMulBackward implements kernels.TrainBackend.
func (*Backend) SiLUMulBackward(dgate, dup, dy, gate, up kernels.Tensor) {
	SiLUMulBackward(data(dgate), data(dup), data(dy), data(gate), data(up))
}

// EmbeddingBackward implements kernels.TrainBackend.
func (*Backend) EmbeddingBackward(dtable, dy kernels.Tensor, ids []int) {
	t := host(dtable)
	EmbeddingBackward(t.Data, data(dy), ids, t.Dims[len(t.Dims)-1])
}

// AttentionBackward implements kernels.TrainBackend.
func (*Backend) AttentionBackward(dq, dk, dv, dout, out, q, k, v kernels.Tensor, start, heads, kvHeads, hd int) {
	qd := data(q)
	AttentionBackwardMatMul(data(dq), data(dk), data(dv), data(dout), qd, data(k), data(v), len(qd)/(heads*hd), start, heads, kvHeads, hd)
}

// LogProbs implements kernels.TrainBackend.
func (*Backend) LogProbs(out, ent, logits kernels.Tensor, targets []int) {
	l := host(logits)
	v := l.Dims[len(l.Dims)-1]
	copy(data(out), LogProbGather(l.Data, targets, v))
	if ent != nil {
		for i, e := range Entropy(l.Data, v) {
			data(ent)[i] = float32(e)
		}
	}
}

// Entropy is each row's −Σ p log p of softmax(logits[r, :]).
func Entropy[T Float](logits []T, v int) []float64 {
	out := make([]float64, len(logits)/v)
	for r := range out {
		row := logits[r*v : (r+1)*v]
		m := float64(maxOf(row))
		var z, s float64
		for _, x := range row {
			e := math.Exp(float64(x) - m)
			z += e
			s += e * (float64(x) - m)
		}
		out[r] = math.Log(z) - s/z
	}
	return out
}

// LogProbsBackward implements kernels.TrainBackend.
func (*Backend) LogProbsBackward(dlogits, dout, logits kernels.Tensor, targets []int) {
	l := host(logits)
	LogProbGatherBackward(data(dlogits), data(dout), l.Data, targets, l.Dims[len(l.Dims)-1])
}

// SumSquares implements kernels.TrainBackend.
func (*Backend) SumSquares(acc, x kernels.Tensor) {
	var s float64
	for _, v := range data(x) {
		s += float64(v) * float64(v)
	}
	data(acc)[0] += float32(s)
}

// AdamW implements kernels.TrainBackend.
func (*Backend) AdamW(w, g, m, v, sumSq kernels.Tensor, s kernels.AdamWStep) {
	scale := 1.0
	if sumSq != nil && s.MaxNorm > 0 {
		if norm := math.Sqrt(float64(data(sumSq)[0])); norm > s.MaxNorm {
			scale = s.MaxNorm / (norm + 1e-6)
		}
	}
	AdamWUpdate(data(w), data(g), data(m), data(v), scale, s)
}

// AdamWUpdate is the elementwise AdamW step (s's formula) in float64
// arithmetic on float32 storage, each gradient first multiplied by scale;
// parallel over cores. optim.AdamW runs the same function.
func AdamWUpdate(w, g, m, v []float32, scale float64, s kernels.AdamWStep) {
	parallelFor(len(w), 16, func(lo, hi int) {
		for i := lo; i < hi; i++ {
			gv := float64(g[i]) * scale
			mi := s.Beta1*float64(m[i]) + (1-s.Beta1)*gv
			vi := s.Beta2*float64(v[i]) + (1-s.Beta2)*gv*gv
			m[i], v[i] = float32(mi), float32(vi)
			w[i] = float32(float64(w[i])*s.Decay - s.LR*(mi/s.BC1)/(math.Sqrt(vi/s.BC2)+s.Eps))
		}
	})
}
