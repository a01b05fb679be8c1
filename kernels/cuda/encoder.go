package cuda

import (
	"runtime"

	"github.com/agemem/agemem/kernels"
)

// The forward ops of bidirectional encoders (BERT, RoBERTa).

// LayerNorm implements kernels.Backend.
func (b *Backend) LayerNorm(y, x, w, bias kernels.Tensor, eps float32) {
	d := dev(w).Len()
	b.launch("layernorm", dev(x).Len()/d, 256, 0, ptr(y), ptr(x), ptr(w), ptr(bias), int32(d), eps)
}

// GELU implements kernels.Backend.
func (b *Backend) GELU(y, x kernels.Tensor, tanh bool) {
	n := dev(x).Len()
	approx := int32(0)
	if tanh {
		approx = 1
	}
	b.launch("gelu", blocks(n, 256), 256, 0, ptr(y), ptr(x), int64(n), approx)
}

// Tanh implements kernels.Backend.
func (b *Backend) Tanh(y, x kernels.Tensor) {
	n := dev(x).Len()
	b.launch("act_tanh", blocks(n, 256), 256, 0, ptr(y), ptr(x), int64(n))
}

// SegmentAttention implements kernels.Backend: the attention kernel with
// each query's key range [lo, hi) given (its sequence) instead of causal.
func (b *Backend) SegmentAttention(out, q, k, v kernels.Tensor, bounds []int, heads, hd int) {
	t := dev(q).Len() / (heads * hd)
	span, _ := segmentSpans(bounds, t)
	st := b.ints(span)
	b.launch("attention", t*heads, attnThreads, attnShared(hd), ptr(out), ptr(q), ptr(k), ptr(v), uint64(0), st.ptr, int32(0), int32(heads), int32(heads), int32(hd))
	runtime.KeepAlive(st)
}

// SegmentMean implements kernels.Backend.
func (b *Backend) SegmentMean(out, x kernels.Tensor, bounds []int) {
	xt := dev(x)
	d := xt.Dims[len(xt.Dims)-1]
	bt := b.ints(bounds)
	b.launch("segment_mean", len(bounds)-1, 256, 0, ptr(out), ptr(x), bt.ptr, int32(d))
	runtime.KeepAlive(bt)
}
