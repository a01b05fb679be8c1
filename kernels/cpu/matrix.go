package cpu

import (
	"math"

	"github.com/agemem/agemem/kernels"
	"github.com/agemem/agemem/kernels/half"

	"github.com/agemem/agemem/kernels/vec"
)

// Matrix is a [Rows, Cols] weight matrix held as float32, as bfloat16 or
// IEEE half (then usually a view into a memory-mapped checkpoint) or as
// Q8_0 blocks. Decoding reads every weight once per token, so 16-bit
// weights halve the bytes that bound its speed and Q8_0 (1.125 bytes a
// weight) nearly halves them again.
type Matrix kernels.Weight

// Bytes is the storage size.
func (w Matrix) Bytes() int { return kernels.Weight(w).Bytes() }

// RowTo widens row r into dst[:Cols].
func (w Matrix) RowTo(dst []float32, r int) {
	if w.Q8 != nil {
		q8Widen(dst, w, r*w.Cols, (r+1)*w.Cols)
		return
	}
	if w.BF16 != nil || w.F16 != nil {
		widen16(dst, w, r*w.Cols, (r+1)*w.Cols)
		return
	}
	copy(dst, w.F32[r*w.Cols:(r+1)*w.Cols])
}

// MatMul computes y[m, Rows] = x[m, Cols] W^T (+ bias[Rows]): a Linear
// layer with PyTorch's weight layout W[out, in]. bias may be nil. Work is
// split over output rows, so each core streams its own slice of W once.
func MatMul(y, x []float32, w Matrix, bias []float32, m int) {
	k, n := w.Cols, w.Rows
	if w.Q8 != nil {
		matMulQ8(y, x, w, bias, m)
		return
	}
	if w.BF16 == nil && w.F16 == nil {
		MatMulT(y, x, w.F32, bias, m, k, n)
		return
	}
	if m >= 4 {
		// Prefill: widen each 16-bit tile once and reuse it across all rows.
		matMulTiled(y, x, bias, m, k, n, func(j0, j1, k0, k1 int, buf []float32) ([]float32, int) {
			kc := k1 - k0
			for j := j0; j < j1; j++ {
				widen16(buf[(j-j0)*kc:(j-j0+1)*kc], w, j*k+k0, j*k+k1)
			}
			return buf, kc
		})
		return
	}
	// Decode: each weight is used once per row, so stream it as stored.
	bits, f16 := w.BF16, w.F16 != nil
	if f16 {
		bits = w.F16
	}
	parallelFor(n, m*k, func(lo, hi int) {
		// Rows in slices small enough to stay in cache for every input row.
		const slice = 64
		for j0 := lo; j0 < hi; j0 += slice {
			j1 := min(j0+slice, hi)
			for i := range m {
				yi := y[i*n+j0 : i*n+j1]
				vec.DotBF16Rows(yi, x[i*k:(i+1)*k], bits[j0*k:j1*k], f16)
				if bias != nil {
					for j := range yi {
						yi[j] += bias[j0+j]
					}
				}
			}
		}
	})
}

// matMulBF16Dot is MatMul for bf16 weights with x rounded to bf16 (to
// nearest even), on vec.GemmBF16x6x32's tiles of 6 rows by 32 outputs:
// x is rounded once into rows of pairs, each worker packs a panel of 32
// weight rows pair index by pair index (the layout the tile broadcasts
// against) and runs every 6 rows of x over it. Rows and outputs past m and
// n, and an odd k's last pair, are zeros.
func matMulBF16Dot(y, x []float32, w Matrix, bias []float32, m int) {
	k, n := w.Cols, w.Rows
	kp, mp := (k+1)/2, (m+5)/6*6
	xb := make([]uint32, mp*kp)
	parallelFor(m, k, func(lo, hi int) {
		for i := lo; i < hi; i++ {
			row, out := x[i*k:(i+1)*k], xb[i*kp:(i+1)*kp]
			for p := range out {
				v := uint32(half.F32ToBF16(row[2*p]))
				if 2*p+1 < k {
					v |= uint32(half.F32ToBF16(row[2*p+1])) << 16
				}
				out[p] = v
			}
		}
	})
	parallelFor((n+31)/32, 32*k*m, func(lo, hi int) {
		wp := make([]uint32, kp*32)
		var tile [6 * 32]float32
		for pn := lo; pn < hi; pn++ {
			j0 := pn * 32
			for c := range 32 {
				j := j0 + c
				if j >= n {
					for p := range kp {
						wp[p*32+c] = 0
					}
					continue
				}
				row := w.BF16[j*k : (j+1)*k]
				for p := range k / 2 {
					wp[p*32+c] = uint32(row[2*p]) | uint32(row[2*p+1])<<16
				}
				if k%2 == 1 {
					wp[(kp-1)*32+c] = uint32(row[k-1])
				}
			}
			cols := min(32, n-j0)
			for i0 := 0; i0 < m; i0 += 6 {
				vec.GemmBF16x6x32(xb[i0*kp:], kp, wp, kp, tile[:], 32)
				for r := range min(6, m-i0) {
					yr := y[(i0+r)*n+j0 : (i0+r)*n+j0+cols]
					copy(yr, tile[r*32:r*32+cols])
					if bias != nil {
						for c := range yr {
							yr[c] += bias[j0+c]
						}
					}
				}
			}
		}
	})
}

// widen16 writes the values of w's flat positions [lo, hi), bf16 or f16,
// as float32.
func widen16(dst []float32, w Matrix, lo, hi int) {
	if w.BF16 != nil {
		for i, b := range w.BF16[lo:hi] {
			dst[i] = math.Float32frombits(uint32(b) << 16)
		}
		return
	}
	for i, h := range w.F16[lo:hi] {
		dst[i] = half.F16ToF32(h)
	}
}

// q8Widen writes the values of w's flat positions [lo, hi) (whole blocks)
// as float32.
func q8Widen(dst []float32, w Matrix, lo, hi int) {
	for i, q := range w.Q8[lo:hi] {
		dst[i] = w.Q8Scale[(lo+i)/kernels.QK8] * float32(q)
	}
}

// matMulQ8 is MatMul over Q8_0 blocks as ggml computes a q8_0 matmul:
// the activations are quantized to Q8_0 blocks too (per row and block of
// 32), so a decode streams 8-bit rows through integer dots (vec.DotQ8),
// and a prefill multiplies the same quantized activations, widened, by
// tiles widened from the blocks: both paths compute the same products.
func matMulQ8(y, x []float32, w Matrix, bias []float32, m int) {
	k, n := w.Cols, w.Rows
	nb := k / kernels.QK8
	xq, xd := make([]int8, m*k), make([]float32, m*nb)
	for b := range m * nb {
		xd[b] = half.F16ToF32(kernels.QuantizeQ8Block(xq[b*kernels.QK8:(b+1)*kernels.QK8], x[b*kernels.QK8:(b+1)*kernels.QK8]))
	}
	if m >= 4 {
		xf := make([]float32, m*k)
		for i, q := range xq {
			xf[i] = xd[i/kernels.QK8] * float32(q)
		}
		matMulTiled(y, xf, bias, m, k, n, func(j0, j1, k0, k1 int, buf []float32) ([]float32, int) {
			kc := k1 - k0
			for j := j0; j < j1; j++ {
				q8Widen(buf[(j-j0)*kc:(j-j0+1)*kc], w, j*k+k0, j*k+k1)
			}
			return buf, kc
		})
		return
	}
	xs := make([]int32, m*nb)
	vec.Q8Sums(xs, xq)
	parallelFor(n, m*k, func(lo, hi int) {
		// Rows in slices small enough to stay in cache for every input row.
		const slice = 64
		for j0 := lo; j0 < hi; j0 += slice {
			j1 := min(j0+slice, hi)
			q, d := w.Q8[j0*k:j1*k], w.Q8Scale[j0*nb:j1*nb]
			for i := range m {
				yi := y[i*n+j0 : i*n+j1]
				vec.DotQ8Rows(yi, xq[i*k:(i+1)*k], xd[i*nb:(i+1)*nb], xs[i*nb:(i+1)*nb], q, d)
				if bias != nil {
					for j := range yi {
						yi[j] += bias[j0+j]
					}
				}
			}
		}
	})
}
