package cpu

import (
	"math"

	"github.com/agemem/agemem/kernels"

	"github.com/agemem/agemem/kernels/vec"
)

// Matrix is a [Rows, Cols] weight matrix held as float32 or as bfloat16
// (then usually a view into a memory-mapped checkpoint). Decoding reads every
// weight once per token, so bf16 halves the bytes that bound its speed.
type Matrix kernels.Weight

// Bytes is the storage size.
func (w Matrix) Bytes() int { return 4*len(w.F32) + 2*len(w.BF16) }

// RowTo widens row r into dst[:Cols].
func (w Matrix) RowTo(dst []float32, r int) {
	if w.BF16 != nil {
		for i, b := range w.BF16[r*w.Cols : (r+1)*w.Cols] {
			dst[i] = math.Float32frombits(uint32(b) << 16)
		}
		return
	}
	copy(dst, w.F32[r*w.Cols:(r+1)*w.Cols])
}

// MatMul computes y[m, Rows] = x[m, Cols] W^T (+ bias[Rows]): a Linear
// layer with PyTorch's weight layout W[out, in]. bias may be nil. Work is
// split over output rows, so each core streams its own slice of W once.
func MatMul(y, x []float32, w Matrix, bias []float32, m int) {
	k, n := w.Cols, w.Rows
	if w.BF16 == nil {
		MatMulT(y, x, w.F32, bias, m, k, n)
		return
	}
	if m >= 4 {
		// Prefill: widen each bf16 tile once and reuse it across all rows.
		matMulTiled(y, x, bias, m, k, n, func(j0, j1, k0, k1 int, buf []float32) ([]float32, int) {
			kc := k1 - k0
			for j := j0; j < j1; j++ {
				dst := buf[(j-j0)*kc : (j-j0+1)*kc]
				for c, b := range w.BF16[j*k+k0 : j*k+k1] {
					dst[c] = math.Float32frombits(uint32(b) << 16)
				}
			}
			return buf, kc
		})
		return
	}
	// Decode: each weight is used once per row, so stream it as bf16.
	parallelFor(n, m*k, func(lo, hi int) {
		for j := lo; j < hi; j++ {
			wr := w.BF16[j*k : (j+1)*k]
			var b float32
			if bias != nil {
				b = bias[j]
			}
			for i := range m {
				y[i*n+j] = vec.DotBF16(x[i*k:(i+1)*k], wr) + b
			}
		}
	})
}
