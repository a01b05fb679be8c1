package cuda

import (
	"fmt"
	"runtime"

	"github.com/agemem/agemem/kernels"
)

// The backward ops of bidirectional encoders (kernels.EncoderTrainer;
// encoder_train.cu): what SimCSE's training step runs on the GPU.

var _ kernels.EncoderTrainer = (*Backend)(nil)

// LayerNormBackward implements kernels.EncoderTrainer.
func (b *Backend) LayerNormBackward(dx, dw, db, dy, x, w kernels.Tensor, eps float32) {
	d := w.Len()
	b.launch("layernorm_backward", x.Len()/d, 256, 4*256, ptr(dx), ptr(dw), ptr(db), ptr(dy), ptr(x), ptr(w), int32(d), eps)
}

// GELUBackward implements kernels.EncoderTrainer.
func (b *Backend) GELUBackward(dx, dy, x kernels.Tensor, tanh bool) {
	n := x.Len()
	approx := int32(0)
	if tanh {
		approx = 1
	}
	b.launch("gelu_backward", blocks(n, 256), 256, 0, ptr(dx), ptr(dy), ptr(x), int64(n), approx)
}

// TanhBackward implements kernels.EncoderTrainer.
func (b *Backend) TanhBackward(dx, dy, y kernels.Tensor) {
	n := y.Len()
	b.launch("tanh_backward", blocks(n, 256), 256, 0, ptr(dx), ptr(dy), ptr(y), int64(n))
}

// SegmentMeanBackward implements kernels.EncoderTrainer.
func (b *Backend) SegmentMeanBackward(dx, dy kernels.Tensor, bounds []int) {
	xt := dev(dx)
	bt := b.ints(bounds)
	b.launch("segment_mean_backward", len(bounds)-1, 256, 0, ptr(dx), ptr(dy), bt.ptr, int32(xt.Dims[len(xt.Dims)-1]))
	runtime.KeepAlive(bt)
}

// segmentSpans is each row's segment [lo, hi) as SegmentAttention's kernels
// read it, and the longest segment.
func segmentSpans(bounds []int, t int) (span []int, longest int) {
	if bounds[len(bounds)-1] != t {
		panic(fmt.Sprintf("cuda segment attention: bounds end at %d, q has %d rows", bounds[len(bounds)-1], t))
	}
	span = make([]int, 0, 2*t)
	for s := range len(bounds) - 1 {
		longest = max(longest, bounds[s+1]-bounds[s])
		for range bounds[s+1] - bounds[s] {
			span = append(span, bounds[s], bounds[s+1])
		}
	}
	return span, longest
}

// segmentThreads is the block of the segment attention kernels.
const segmentThreads = 128

// SegmentAttentionDropout implements kernels.EncoderTrainer: at p = 0 the
// inference kernel, else one block per (row, head) over the row's segment.
func (b *Backend) SegmentAttentionDropout(out, q, k, v kernels.Tensor, bounds []int, heads, hd int, p float64, seed uint64) {
	if p <= 0 {
		b.SegmentAttention(out, q, k, v, bounds, heads, hd)
		return
	}
	t := q.Len() / (heads * hd)
	span, longest := segmentSpans(bounds, t)
	st := b.ints(span)
	b.launch("segment_attention_drop", t*heads, segmentThreads, 4*(2*longest+segmentThreads), ptr(out), ptr(q), ptr(k), ptr(v), st.ptr,
		int32(heads), int32(hd), int32(t), int32(longest), seed, kernels.DropoutThreshold(p), float32(1/(1-p)))
	runtime.KeepAlive(st)
}

// SegmentAttentionBackward implements kernels.EncoderTrainer.
func (b *Backend) SegmentAttentionBackward(dq, dk, dv, dout, q, k, v kernels.Tensor, bounds []int, heads, hd int, p float64, seed uint64) {
	t := q.Len() / (heads * hd)
	span, longest := segmentSpans(bounds, t)
	st := b.ints(span)
	b.launch("segment_attention_backward", t*heads, segmentThreads, 4*(3*longest+segmentThreads), ptr(dq), ptr(dk), ptr(dv), ptr(dout),
		ptr(q), ptr(k), ptr(v), st.ptr, int32(heads), int32(hd), int32(t), int32(longest), seed, kernels.DropoutThreshold(p),
		float32(1/(1-p)))
	runtime.KeepAlive(st)
}
