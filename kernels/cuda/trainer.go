package cuda

import (
	"fmt"
	"math"
	"runtime"
	"slices"

	"github.com/agemem/agemem/kernels"
)

var (
	_ kernels.TrainBackend   = (*Backend)(nil)
	_ kernels.PagedAttender  = (*Backend)(nil)
	_ kernels.DecodeAttender = (*Backend)(nil)
)

// Attention launches: four warps a (token, head), each with its partial
// softmax state in shared memory for the final merge.
const attnThreads = 128

func attnShared(hd int) int {
	if hd > 256 {
		panic(fmt.Sprintf("cuda attention: head_dim %d > 256", hd))
	}
	return attnThreads / 32 * (hd + 2) * 4
}

// Zero implements kernels.TrainBackend.
func (b *Backend) Zero(t kernels.Tensor) {
	defer b.enter()()
	b.zero(ptr(t), uint64(4*t.Len()))
}

// AddScaled implements kernels.TrainBackend.
func (b *Backend) AddScaled(y, x kernels.Tensor, s float32) {
	n := y.Len()
	b.launch("add_scaled", blocks4(n), 256, 0, ptr(y), ptr(x), s, int64(n))
}

// NarrowBF16 implements kernels.TrainBackend: the kernel that rounds
// activations for bf16 GEMMs, into a tensor Embedding reads as a bf16 table.
func (b *Backend) NarrowBF16(x kernels.Tensor) kernels.Tensor {
	defer b.enter()()
	xt := dev(x)
	n, rows := xt.Len(), xt.Dims[0]
	t := b.alloc((n+1)/2, []int{rows, n / max(rows, 1)})
	t.bf16 = true
	b.launch("narrow_bf16", blocks4(n), 256, 0, t.ptr, xt.ptr, int64(n))
	return t
}

// NarrowBF16Into implements kernels.TrainBackend.
func (b *Backend) NarrowBF16Into(dst, x kernels.Tensor) {
	defer b.enter()()
	d, n := dev(dst), x.Len()
	if !d.bf16 || d.Len() != n {
		panic(fmt.Sprintf("cuda backend: NarrowBF16Into a tensor that is not a bf16 tensor of %d values", n))
	}
	b.launch("narrow_bf16", blocks4(n), 256, 0, d.ptr, ptr(x), int64(n))
}

// Dropout implements kernels.TrainBackend.
func (b *Backend) Dropout(y, x kernels.Tensor, p float64, seed uint64) {
	b.dropout("dropout", ptr(y), x, p, seed)
}

// GEMMOperand implements kernels.TrainBackend: in BF16 mode, where every
// GEMM rounds its operands to bf16, a bf16 copy the GEMMs read as it is
// (asBF16), made once for all of them.
func (b *Backend) GEMMOperand(x kernels.Tensor) kernels.Tensor {
	if !b.BF16 || dev(x).bf16 {
		return x
	}
	defer b.enter()()
	n := x.Len()
	y := b.alloc((n+1)/2, append([]int(nil), x.Shape()...))
	y.bf16 = true
	b.launch("narrow_bf16", blocks4(n), 256, 0, y.ptr, ptr(x), int64(n))
	return y
}

// DropoutOperand implements kernels.TrainBackend: in BF16 mode, where
// every GEMM rounds its x to bf16 (matmul, MatMulBackward), the dropped-out
// x is written as bf16 at once (dropout_bf16) instead of in float32 and
// then narrowed by the GEMM.
func (b *Backend) DropoutOperand(x kernels.Tensor, p float64, seed uint64) kernels.Tensor {
	if !b.BF16 {
		y := b.Empty(x.Shape()...)
		b.Dropout(y, x, p, seed)
		return y
	}
	defer b.enter()()
	n := x.Len()
	y := b.alloc((n+1)/2, append([]int(nil), x.Shape()...))
	y.bf16 = true
	b.dropout("dropout_bf16", y.ptr, x, p, seed)
	return y
}

// DropoutAdd implements kernels.TrainBackend.
func (b *Backend) DropoutAdd(y, x kernels.Tensor, p float64, seed uint64) {
	b.dropout("dropout_add", ptr(y), x, p, seed)
}

// dropout launches one of the dropout kernels (elementwise.cu) from x into y.
func (b *Backend) dropout(k string, y uint64, x kernels.Tensor, p float64, seed uint64) {
	n := x.Len()
	b.launch(k, blocks4(n), 256, 0, y, ptr(x), int64(n), seed, kernels.DropoutThreshold(p), float32(1/(1-p)))
}

// MatMulBackward implements kernels.TrainBackend with two cuBLAS GEMMs that
// accumulate (beta = 1). Column-major, for y[m,n] = x[m,k]·w[n,k]ᵀ:
// dxᵀ(k×m) += w(k×n)·dyᵀ(n×m) and dwᵀ(k×n) += xᵀ(k×m)·dy(m×n). In BF16
// mode both run on tensor cores with bf16 inputs (mixed precision: the
// weights, gradients and optimiser stay f32).
func (b *Backend) MatMulBackward(dx, dw, db, dy, x, w kernels.Tensor) {
	defer b.enter()()
	wt := dev(w)
	n, k := wt.Dims[0], wt.Dims[1]
	m := x.Len() / k
	if b.BF16 || wt.bf16 {
		// Tensor cores: bf16 copies of dy, w and x, f32 accumulation into
		// the f32 gradients.
		dyp, dyk := b.asBF16(dy)
		if dx != nil {
			wp, wk := b.asBF16(w)
			b.gemmBF16(0, 0, k, m, n, 1, wp, k, dyp, n, 1, ptr(dx), k)
			runtime.KeepAlive(wk)
		}
		if dw != nil {
			xp, xk := b.asBF16(x)
			b.gemmBF16(0, 1, k, n, m, 1, xp, k, dyp, n, 1, ptr(dw), k)
			runtime.KeepAlive(xk)
		}
		runtime.KeepAlive(dyk)
	} else {
		one := float32(1)
		if dx != nil {
			if st := b.sgemm(0, 0, int32(k), int32(m), int32(n), &one, wt.ptr, int32(k), ptr(dy), int32(n), &one, ptr(dx), int32(k)); st != 0 {
				panic(fmt.Sprintf("cublasSgemm (dx): status %d", st))
			}
		}
		if dw != nil {
			if st := b.sgemm(0, 1, int32(k), int32(n), int32(m), &one, ptr(x), int32(k), ptr(dy), int32(n), &one, ptr(dw), int32(k)); st != 0 {
				panic(fmt.Sprintf("cublasSgemm (dw): status %d", st))
			}
		}
	}
	if db != nil {
		b.launch("col_sum", blocks(n, 256), 256, 0, ptr(db), ptr(dy), int32(m), int32(n))
	}
}

// RMSNormBackward implements kernels.TrainBackend.
func (b *Backend) RMSNormBackward(dx, dw, dy, x, w kernels.Tensor, eps float32) {
	d := w.Len()
	b.launch("rmsnorm_backward", x.Len()/d, 256, 0, ptr(dx), ptr(dw), ptr(dy), ptr(x), ptr(w), int32(d), eps)
}

// RopeBackward implements kernels.TrainBackend: the forward kernel rotating by
// the opposite angle.
func (b *Backend) RopeBackward(dy kernels.Tensor, pos []int, heads, headDim int, theta float64) {
	pt := b.ints(pos)
	n := len(pos) * heads * headDim / 2
	b.launch("rope", blocks(n, 256), 256, 0, ptr(dy), pt.ptr, int32(len(pos)), int32(heads), int32(headDim), theta, float32(-1))
	runtime.KeepAlive(pt)
}

// SiLUMulBackward implements kernels.TrainBackend.
func (b *Backend) SiLUMulBackward(dgate, dup, dy, gate, up kernels.Tensor) {
	n := dy.Len()
	b.launch("silu_mul_backward", blocks(n, 256), 256, 0, ptr(dgate), ptr(dup), ptr(dy), ptr(gate), ptr(up), int64(n))
}

// EmbeddingBackward implements kernels.TrainBackend.
func (b *Backend) EmbeddingBackward(dtable, dy kernels.Tensor, ids []int) {
	if len(ids) == 0 {
		return
	}
	d := dtable.Shape()[len(dtable.Shape())-1]
	idt := b.ints(ids)
	b.launch("embedding_backward", len(ids), 256, 0, ptr(dtable), ptr(dy), idt.ptr, int32(d))
	runtime.KeepAlive(idt)
}

// The tiled attention kernels (attention.cu) serve prompts of at least
// tiledMinRows queries with head_dim up to tiledMaxHeadDim; a decode step's
// single query keeps the kernel that splits its keys across warps.
const (
	tiledMinRows    = 16
	tiledMaxHeadDim = 128
	tiledQueries    = 8 // ATT_NQ: queries (warps) a block
)

// attentionTiled runs attention_tiled; lse, when not nil, receives the
// rows' log-sum-exps and the values are skipped.
func (b *Backend) attentionTiled(out, lse, q, k, v kernels.Tensor, t, start, heads, kvHeads, hd int) {
	kp := hd | 1
	lseOnly := int32(0)
	if lse != nil {
		lseOnly = 1
	}
	b.launch2("attention_tiled", [2]int{(t + tiledQueries - 1) / tiledQueries, heads}, tiledQueries*32, 4*(32*kp+32*hd+tiledQueries*hd),
		ptr(out), ptr(lse), ptr(q), ptr(k), ptr(v), int32(t), int32(start), int32(heads), int32(kvHeads), int32(hd), lseOnly)
}

// mmaAttention: in BF16 mode on sm_80 and later, attention over head
// dimensions that are multiples of 16 up to 128 runs on tensor cores
// (attention_mma.cu): bf16 operands, f32 accumulation and softmax, as
// PyTorch's SDPA under autocast. Otherwise the float32 kernels, which
// match the CPU backend to float32 rounding.
func (b *Backend) mmaAttention(hd int) bool {
	return b.BF16 && b.sm >= 80 && hd%16 == 0 && hd <= 128
}

// The tensor-core kernels' blocks (attention_mma.cu's MMA_*): 64 queries
// (four warps of 16) in the forward and dq passes, key tiles of 64 and 32,
// and for dk/dv blocks of 64 keys over query tiles of 32.
const (
	mmaQueries, mmaKeys, mmaDQKeys, mmaQTile = 64, 64, 32, 32
)

// mmaHeadDims are the head dimensions the tensor-core kernels are also
// compiled for (attention_mma.cu's _hdN kernels): their loops over hd are
// straight code there.
var mmaHeadDims = []int{64, 128}

// mmaKernel names base's kernel for head dimension hd: the one compiled
// for it, else the one that takes any.
func mmaKernel(base string, hd int) string {
	if slices.Contains(mmaHeadDims, hd) {
		return fmt.Sprintf("%s_hd%d", base, hd)
	}
	return base
}

// mmaKernels lists every tensor-core attention kernel.
func mmaKernels() []string {
	var out []string
	for _, base := range []string{"attention_mma", "attention_mma_dq", "attention_mma_dkv"} {
		out = append(out, base)
		for _, hd := range mmaHeadDims {
			out = append(out, mmaKernel(base, hd))
		}
	}
	return out
}

// mmaShared is the dynamic shared memory of the tensor-core kernels for
// head dimension hd: two buffers of bf16 tiles with rows of hd+8 (the
// padding keeps ldmatrix's eight rows on distinct banks); dk/dv holds its
// block's K and V once and two buffers of q, dout and their rows' lse and D.
func mmaShared(hd int) (fwd, dq, dkv int) {
	row := 2 * (hd + 8)
	return 4 * mmaKeys * row, 4 * mmaDQKeys * row, (2*mmaKeys+4*mmaQTile)*row + 4*4*mmaQTile
}

// attentionMMA runs attention_mma on bf16 copies of q, k and v (the
// rounding a bf16 GEMM gives its operands): out, when not nil, gets the
// values; lse, when not nil, the rows' log-sum-exps.
func (b *Backend) attentionMMA(out, lse, q, k, v kernels.Tensor, t, start, heads, kvHeads, hd int) {
	lseOnly := int32(0)
	if out == nil {
		lseOnly = 1
	}
	qb, qc := b.asBF16(q)
	kb, kc := b.asBF16(k)
	vb, vc := b.asBF16(v)
	fwd, _, _ := mmaShared(hd)
	b.launch2(mmaKernel("attention_mma", hd), [2]int{(t + mmaQueries - 1) / mmaQueries, heads}, 128, fwd,
		ptr(out), ptr(lse), qb, kb, vb, int32(t), int32(start), int32(heads), int32(kvHeads), int32(hd), lseOnly)
	runtime.KeepAlive(qc)
	runtime.KeepAlive(kc)
	runtime.KeepAlive(vc)
}

// AttentionLSE implements kernels.LSEAttender: on the tensor-core kernels
// the forward writes the log-sum-exps beside the values.
func (b *Backend) AttentionLSE(out, lse, q, k, v kernels.Tensor, start, heads, kvHeads, hd int) bool {
	if !b.mmaAttention(hd) {
		b.Attention(out, q, k, v, nil, start, heads, kvHeads, hd)
		return false
	}
	b.attentionMMA(out, lse, q, k, v, dev(q).Len()/(heads*hd), start, heads, kvHeads, hd)
	return true
}

// AttentionBackward implements kernels.TrainBackend (flash-style: the scores
// are recomputed, never stored). Up to head_dim 128 it is three tiled
// passes without atomics: the rows' log-sum-exps, dq by query blocks, dk
// and dv by key blocks (on tensor cores where mmaAttention says).
func (b *Backend) AttentionBackward(dq, dk, dv, dout, out, q, k, v kernels.Tensor, start, heads, kvHeads, hd int) {
	b.AttentionBackwardLSE(dq, dk, dv, dout, out, nil, q, k, v, start, heads, kvHeads, hd)
}

// AttentionBackwardLSE implements kernels.LSEAttender: AttentionBackward
// with the forward's log-sum-exps (nil: computed here).
func (b *Backend) AttentionBackwardLSE(dq, dk, dv, dout, out, lse, q, k, v kernels.Tensor, start, heads, kvHeads, hd int) {
	t := q.Len() / (heads * hd)
	if b.mmaAttention(hd) {
		if lse == nil {
			lse = b.Zeros(t, heads)
			b.attentionMMA(nil, lse, q, k, v, t, start, heads, kvHeads, hd)
		}
		d := b.Zeros(t, heads)
		b.launch("attention_rowdot", blocks(t*heads, 8), 256, 0, ptr(d), ptr(dout), ptr(out), int32(t*heads), int32(hd))
		qb, qc := b.asBF16(q)
		kb, kc := b.asBF16(k)
		vb, vc := b.asBF16(v)
		gb, gc := b.asBF16(dout)
		_, dqs, dkvs := mmaShared(hd)
		b.launch2(mmaKernel("attention_mma_dq", hd), [2]int{(t + mmaQueries - 1) / mmaQueries, heads}, 128, dqs,
			ptr(dq), qb, kb, vb, gb, ptr(lse), ptr(d), int32(t), int32(start), int32(heads), int32(kvHeads), int32(hd))
		b.launch2(mmaKernel("attention_mma_dkv", hd), [2]int{(start + t + mmaKeys - 1) / mmaKeys, kvHeads}, 128, dkvs,
			ptr(dk), ptr(dv), qb, kb, vb, gb, ptr(lse), ptr(d), int32(t), int32(start), int32(heads), int32(kvHeads), int32(hd))
		runtime.KeepAlive([]*Tensor{qc, kc, vc, gc})
		return
	}
	if lse != nil {
		panic("cuda backend: AttentionBackwardLSE with an lse the forward did not keep")
	}
	if hd <= tiledMaxHeadDim {
		lse, d := b.Zeros(t, heads), b.Zeros(t, heads)
		b.attentionTiled(nil, lse, q, k, v, t, start, heads, kvHeads, hd)
		b.launch("attention_rowdot", blocks(t*heads, 8), 256, 0, ptr(d), ptr(dout), ptr(out), int32(t*heads), int32(hd))
		kp := hd | 1
		b.launch2("attention_bwd_dq", [2]int{(t + tiledQueries - 1) / tiledQueries, heads}, tiledQueries*32, 4*(64*kp+2*tiledQueries*hd),
			ptr(dq), ptr(q), ptr(k), ptr(v), ptr(dout), ptr(lse), ptr(d), int32(t), int32(start), int32(heads), int32(kvHeads), int32(hd))
		b.launch2("attention_bwd_dkv", [2]int{(start + t + tiledQueries - 1) / tiledQueries, kvHeads}, tiledQueries*32, 4*(64*kp+2*tiledQueries*hd+64),
			ptr(dk), ptr(dv), ptr(q), ptr(k), ptr(v), ptr(dout), ptr(lse), ptr(d), int32(t), int32(start), int32(heads), int32(kvHeads), int32(hd))
		return
	}
	b.launch("attention_backward", t*heads, attnThreads, attnShared(hd), ptr(dq), ptr(dk), ptr(dv), ptr(dout), ptr(out),
		ptr(q), ptr(k), ptr(v), int32(start), int32(heads), int32(kvHeads), int32(hd))
}

// LogProbs implements kernels.TrainBackend.
func (b *Backend) LogProbs(out, ent, logits kernels.Tensor, targets []int) {
	b.logprob(out, ent, nil, nil, logits, targets)
}

// LogProbsBackward implements kernels.TrainBackend.
func (b *Backend) LogProbsBackward(dlogits, dout, logits kernels.Tensor, targets []int) {
	b.logprob(nil, nil, dlogits, dout, logits, targets)
}

func (b *Backend) logprob(out, ent, dlogits, dout, logits kernels.Tensor, targets []int) {
	if len(targets) == 0 {
		return
	}
	v := logits.Shape()[len(logits.Shape())-1]
	tt := b.ints(targets)
	b.launch("logprob", len(targets), 256, 0, ptr(out), ptr(ent), ptr(dlogits), ptr(dout), ptr(logits), tt.ptr, int32(v))
	runtime.KeepAlive(tt)
}

// SumSquares implements kernels.TrainBackend.
func (b *Backend) SumSquares(acc, x kernels.Tensor) {
	n := x.Len()
	b.launch("sum_squares", min(blocks(n, 256), 1024), 256, 0, ptr(acc), ptr(x), int64(n))
}

// AdamW implements kernels.TrainBackend: one fused kernel, clipping included.
func (b *Backend) AdamW(w, g, m, v, sumSq kernels.Tensor, s kernels.AdamWStep) {
	n := w.Len()
	if math.IsNaN(s.LR) {
		panic("cuda AdamW: learning rate is NaN")
	}
	b.launch("adamw", blocks(n, 256), 256, 0, ptr(w), ptr(g), ptr(m), ptr(v), int64(n), s.LR, s.Beta1, s.Beta2, s.Eps,
		s.Decay, s.BC1, s.BC2, ptr(sumSq), s.MaxNorm)
}

// PolicyGradient implements kernels.PolicyGradienter.
func (b *Backend) PolicyGradient(dlogp, stats, logp, ent, old, ref, adv, w kernels.Tensor, clip, beta float32) {
	n := dev(logp).Len()
	b.launch("policy_gradient", blocks(n, 256), 256, 0, ptr(dlogp), ptr(stats), ptr(logp), ptr(ent), ptr(old), ptr(ref), ptr(adv), ptr(w), int32(n), clip, beta)
}
