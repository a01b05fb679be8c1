package cpu

import (
	"fmt"

	"github.com/agemem/agemem/kernels"
	"github.com/agemem/agemem/kernels/half"
	"github.com/agemem/agemem/kernels/vec"
)

// Tensor is a CPU tensor: a host slice, or a weight held as f32 or bf16.
type Tensor struct {
	kernels.Dims
	Data []float32
	w    *Matrix // set for uploaded weights
}

// Bytes is the memory t's values take: an uploaded weight's as held
// (bf16, Q8_0 blocks), else four a value.
func (t *Tensor) Bytes() int {
	if t.w != nil {
		return t.w.Bytes()
	}
	return 4 * len(t.Data)
}

// Backend is the pure-Go CPU backend.
type Backend struct {
	// BF16: GEMMs on bf16 weights round their activations to bf16, as the
	// CUDA backend's GEMMs on bf16 weights and ggml's bf16 matmul do, and
	// those of at least 4 rows (a prefill, a batch) run on AVX512_BF16's
	// VDPBF16PS where the CPU has it: twice the float32 FMA's products an
	// instruction, and no widening of the weights. device.Open sets it for
	// inference; training keeps it off (its backward widens the weights
	// against float32 activations, and its gradients are checked so).
	BF16 bool
}

// New returns the CPU backend.
func New() *Backend { return &Backend{} }

var _ kernels.Backend = (*Backend)(nil)

// Name implements kernels.Backend.
func (*Backend) Name() string { return "cpu" }

func host(t kernels.Tensor) *Tensor {
	ct, ok := t.(*Tensor)
	if !ok {
		panic(fmt.Sprintf("cpu backend: tensor of type %T belongs to another backend", t))
	}
	return ct
}

func data(t kernels.Tensor) []float32 {
	if t == nil {
		return nil
	}
	ct := host(t)
	if ct.w != nil {
		panic("cpu backend: a weight tensor used as an activation")
	}
	return ct.Data
}

// Zeros implements kernels.Backend.
func (*Backend) Zeros(shape ...int) kernels.Tensor {
	t := &Tensor{Dims: shape}
	t.Data = make([]float32, t.Len())
	return t
}

// Empty implements kernels.Backend: Go's memory comes zeroed anyway.
func (b *Backend) Empty(shape ...int) kernels.Tensor { return b.Zeros(shape...) }

// FromHost implements kernels.Backend.
func (*Backend) FromHost(d []float32, shape ...int) kernels.Tensor {
	t := &Tensor{Dims: shape}
	if t.Len() != len(d) {
		panic(fmt.Sprintf("cpu backend: %d values for shape %v", len(d), shape))
	}
	t.Data = append([]float32(nil), d...)
	return t
}

// ToHost implements kernels.Backend.
func (*Backend) ToHost(t kernels.Tensor) []float32 { return append([]float32(nil), data(t)...) }

// Upload implements kernels.Backend: weights stay where they are (bf16 in
// the mapped file).
func (*Backend) Upload(w kernels.Weight) kernels.Tensor {
	m := Matrix(w)
	return &Tensor{Dims: []int{w.Rows, w.Cols}, w: &m}
}

// Rows implements kernels.Backend.
func (*Backend) Rows(t kernels.Tensor, lo, hi int) kernels.Tensor {
	ct := host(t)
	width := ct.Len() / ct.Dims[0]
	shape := append([]int{hi - lo}, ct.Dims[1:]...)
	return &Tensor{Dims: shape, Data: ct.Data[lo*width : hi*width]}
}

// CopyRows implements kernels.Backend.
func (*Backend) CopyRows(dst kernels.Tensor, dstRow int, src kernels.Tensor, srcRow, n int) {
	d, s := host(dst), host(src)
	width := d.Len() / d.Dims[0]
	copy(d.Data[dstRow*width:(dstRow+n)*width], s.Data[srcRow*width:(srcRow+n)*width])
}

// Embedding implements kernels.Backend.
func (*Backend) Embedding(out, table kernels.Tensor, ids []int) {
	o, w := data(out), host(table).w
	if w == nil { // a trainable table: a plain tensor
		t := host(table)
		d := t.Dims[len(t.Dims)-1]
		for i, id := range ids {
			copy(o[i*d:(i+1)*d], t.Data[id*d:(id+1)*d])
		}
		return
	}
	for i, id := range ids {
		w.RowTo(o[i*w.Cols:(i+1)*w.Cols], id)
	}
}

// MatMul implements kernels.Backend.
func (be *Backend) MatMul(y, x, w, bias kernels.Tensor) {
	wt := host(w)
	yd, xd := data(y), data(x)
	var b []float32
	if bias != nil {
		b = data(bias)
	}
	if wt.w != nil {
		m := len(xd) / wt.w.Cols
		if be.BF16 && wt.w.BF16 != nil {
			if m >= 4 && vec.HasBF16Dot && wt.w.Cols%32 == 0 {
				matMulBF16Dot(yd, xd, *wt.w, b, m)
				return
			}
			// The same rounding on every path, so a row's product does
			// not depend on how many rows share its GEMM beyond the
			// order of float32 sums (continuous batching).
			xr := make([]float32, len(xd))
			for i, v := range xd {
				xr[i] = half.BF16ToF32(half.F32ToBF16(v))
			}
			xd = xr
		}
		MatMul(yd, xd, *wt.w, b, m)
		return
	}
	n, k := wt.Dims[0], wt.Dims[1]
	MatMulT(yd, xd, wt.Data, b, len(xd)/k, k, n)
}

// RMSNorm implements kernels.Backend.
func (*Backend) RMSNorm(y, x, w kernels.Tensor, eps float32) {
	wd := data(w)
	RMSNorm(data(y), data(x), wd, len(wd), eps)
}

// Rope implements kernels.Backend.
func (b *Backend) Rope(x kernels.Tensor, pos []int, heads, headDim int, theta float64) {
	cos, sin := CachedRopeTables(pos, headDim, theta)
	Rope(data(x), pos, heads, headDim, cos, sin)
}

// Attention implements kernels.Backend.
func (*Backend) Attention(out, q, kc, vc kernels.Tensor, valid []bool, start, heads, kvHeads, hd int) {
	qd := data(q)
	Attention(data(out), qd, data(kc), data(vc), valid, len(qd)/(heads*hd), start, heads, kvHeads, hd)
}

// DecodeAttention implements kernels.DecodeAttender, sequence by sequence.
func (b *Backend) DecodeAttention(out, q, k, v kernels.Tensor, kc, vc []kernels.Tensor, rows [][]int, pos []int, heads, kvHeads, hd int) {
	for r, p := range pos {
		o, qr := b.Rows(out, r, r+1), b.Rows(q, r, r+1)
		if rows[r] == nil {
			b.CopyRows(kc[r], p, k, r, 1)
			b.CopyRows(vc[r], p, v, r, 1)
			b.Attention(o, qr, kc[r], vc[r], nil, p, heads, kvHeads, hd)
			continue
		}
		b.CopyRows(kc[r], rows[r][p], k, r, 1)
		b.CopyRows(vc[r], rows[r][p], v, r, 1)
		b.PagedAttention(o, qr, kc[r], vc[r], rows[r][:p+1], p, heads, kvHeads, hd)
	}
}

// PagedAttention implements kernels.PagedAttender.
func (*Backend) PagedAttention(out, q, kpool, vpool kernels.Tensor, rows []int, start, heads, kvHeads, hd int) {
	qd := data(q)
	PagedAttention(data(out), qd, data(kpool), data(vpool), rows, len(qd)/(heads*hd), start, heads, kvHeads, hd)
}

// SiLUMul implements kernels.Backend.
func (*Backend) SiLUMul(out, gate, up kernels.Tensor) { SiLUMul(data(out), data(gate), data(up)) }

// Add implements kernels.Backend.
func (*Backend) Add(y, x kernels.Tensor) { Add(data(y), data(x)) }

// LogSoftmax implements kernels.Backend.
func (*Backend) LogSoftmax(y, x kernels.Tensor) {
	lastDim(y, x, LogSoftmax)
}

// Softmax implements kernels.Backend.
func (*Backend) Softmax(y, x kernels.Tensor) {
	lastDim(y, x, func(yr, xr []float32) {
		copy(yr, xr)
		Softmax(yr)
	})
}

// lastDim applies f to each row of the last dimension.
func lastDim(y, x kernels.Tensor, f func(yr, xr []float32)) {
	xt := host(x)
	d := xt.Dims[len(xt.Dims)-1]
	yd, xd := data(y), xt.Data
	for r := 0; r < len(xd)/d; r++ {
		f(yd[r*d:(r+1)*d], xd[r*d:(r+1)*d])
	}
}
