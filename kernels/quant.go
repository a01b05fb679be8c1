package kernels

import (
	"fmt"
	"math"

	"github.com/agemem/agemem/internal/par"
	"github.com/agemem/agemem/kernels/half"
)

// QK8 is the number of values a Q8_0 block holds.
const QK8 = 32

// QuantizeQ8Block quantizes one block as ggml's reference
// quantize_row_q8_0 does: the scale d = max|x|/127, stored as f16 (the
// returned bits), and round(x/d) with halves away from zero into q.
func QuantizeQ8Block(q []int8, x []float32) uint16 {
	var amax float32
	for _, v := range x {
		amax = max(amax, float32(math.Abs(float64(v))))
	}
	d := amax / 127
	var id float32
	if d != 0 {
		id = 1 / d
	}
	for j, v := range x {
		q[j] = int8(math.Round(float64(v * id)))
	}
	return half.F32ToF16(d)
}

// QuantizeQ8 is w as Q8_0 blocks (the scales as the f16 GGUF stores,
// widened), exactly the values a Q8_0 GGUF export of w holds. A row whose
// length is not a multiple of QK8 cannot be blocked: an error.
func QuantizeQ8(w Weight) (Weight, error) {
	if w.Cols%QK8 != 0 {
		return w, fmt.Errorf("a [%d, %d] matrix: Q8_0 needs rows of a multiple of %d values", w.Rows, w.Cols, QK8)
	}
	n := w.Rows * w.Cols
	out := Weight{Rows: w.Rows, Cols: w.Cols, Q8: make([]int8, n), Q8Scale: make([]float32, n/QK8)}
	par.For(n/QK8, 1<<15, func(lo, hi int) { // blocks, on every core: a 7B base is 200M of them
		var buf [QK8]float32
		for b := lo; b < hi; b++ {
			x := buf[:]
			switch {
			case w.BF16 != nil:
				for j, v := range w.BF16[b*QK8 : (b+1)*QK8] {
					x[j] = math.Float32frombits(uint32(v) << 16)
				}
			case w.F16 != nil:
				for j, v := range w.F16[b*QK8 : (b+1)*QK8] {
					x[j] = half.F16ToF32(v)
				}
			default:
				x = w.F32[b*QK8 : (b+1)*QK8]
			}
			out.Q8Scale[b] = half.F16ToF32(QuantizeQ8Block(out.Q8[b*QK8:(b+1)*QK8], x))
		}
	})
	return out, nil
}

// Dequantize widens Q8_0 blocks and f16 values to float32 (bf16 and
// float32 weights are returned as they are): for backends with no 8-bit or
// f16 kernels.
func (w Weight) Dequantize() Weight {
	switch {
	case w.Q8 != nil:
		out := Weight{Rows: w.Rows, Cols: w.Cols, F32: make([]float32, len(w.Q8))}
		for i, q := range w.Q8 {
			out.F32[i] = w.Q8Scale[i/QK8] * float32(q)
		}
		return out
	case w.F16 != nil:
		out := Weight{Rows: w.Rows, Cols: w.Cols, F32: make([]float32, len(w.F16))}
		for i, h := range w.F16 {
			out.F32[i] = half.F16ToF32(h)
		}
		return out
	}
	return w
}

// Bytes is the weight's storage size.
func (w Weight) Bytes() int {
	return 4*len(w.F32) + 2*len(w.BF16) + 2*len(w.F16) + len(w.Q8) + 4*len(w.Q8Scale)
}
