package cpu

import (
	"math"
	"unsafe"

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
	if m >= 4 && vec.Has16Dot && k%16 == 0 {
		matMul16Dot(y, x, w, bias, m)
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
// nearest even), on vec.DotBF16x4x4's tiles: x is rounded once (its rows
// padded to a multiple of 4 with zeros). k a multiple of 32 (every Qwen
// width), else the caller's path.
func matMulBF16Dot(y, x []float32, w Matrix, bias []float32, m int) {
	k := w.Cols
	xb := make([]uint16, (m+3)/4*4*k)
	parallelFor(m, k, func(lo, hi int) {
		for i, v := range x[lo*k : hi*k] {
			xb[lo*k+i] = half.F32ToBF16(v)
		}
	})
	matMul4x4(y, w.BF16, bias, m, w.Rows, k, func(i0 int, wr []uint16, tile *[16]float32) {
		vec.DotBF16x4x4(xb[i0*k:], k, wr, k, k, tile)
	})
}

// matMul16Dot is MatMul's prefill for 16-bit weights on vec.Dot16x4x4's
// tiles (float32 activations; the weights widened in registers as they
// are read, not into a float32 copy first). k a multiple of 16.
func matMul16Dot(y, x []float32, w Matrix, bias []float32, m int) {
	k := w.Cols
	if m%4 != 0 {
		xp := make([]float32, (m+3)/4*4*k)
		copy(xp, x[:m*k])
		x = xp
	}
	bits, f16 := w.BF16, w.F16 != nil
	if f16 {
		bits = w.F16
	}
	matMul4x4(y, bits, bias, m, w.Rows, k, func(i0 int, wr []uint16, tile *[16]float32) {
		vec.Dot16x4x4(x[i0*k:], k, wr, k, k, f16, tile)
	})
}

// matMul4x4 runs y[m, n] = x W^T (+ bias) on tiles of 4 rows of x by 4
// rows of w ([n, k] 16-bit values, read as stored): each worker takes
// groups of 4 weight rows and runs dot over every 4 rows of x (whose
// rows the caller pads to a multiple of 4). A last group of fewer than 4
// weight rows is copied beside zero rows.
func matMul4x4(y []float32, w []uint16, bias []float32, m, n, k int, dot func(i0 int, wr []uint16, tile *[16]float32)) {
	parallelFor((n+3)/4, 4*k*m, func(lo, hi int) {
		var tile [16]float32
		for g := lo; g < hi; g++ {
			j0 := 4 * g
			wr, cols := w[j0*k:], min(4, n-j0)
			if cols < 4 {
				wr = make([]uint16, 4*k)
				copy(wr, w[j0*k:n*k])
			}
			for i0 := 0; i0 < m; i0 += 4 {
				dot(i0, wr, &tile)
				for r := range min(4, m-i0) {
					yr := y[(i0+r)*n+j0 : (i0+r)*n+j0+cols]
					copy(yr, tile[4*r:4*r+cols])
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

// matMulQ8Tiles is matMulQ8's prefill on vec.GemmQ8x6x16's tiles of 6
// rows by 16 outputs (AVX-512 VNNI), the decode's arithmetic (ggml's),
// each block summed in int32: x's quants (xq, block scales xd) are
// regrouped once with their blocks' −128·sums, and each worker packs a
// panel of 16 weight rows block by block, four quants a word offset to
// unsigned, and runs every 6 rows of x over it. Padded rows and columns
// have scale 0.
func matMulQ8Tiles(y []float32, xq []int8, xd []float32, w Matrix, bias []float32, m int) {
	k, n := w.Cols, w.Rows
	nb, ldx, mp := k/kernels.QK8, k/4, (m+5)/6*6
	xg := make([]uint32, mp*ldx)
	copy(unsafe.Slice((*int8)(unsafe.Pointer(&xg[0])), m*k), xq)
	xdp, xc := make([]float32, mp*nb), make([]int32, mp*nb)
	copy(xdp, xd)
	vec.Q8Sums(xc[:m*nb], xq)
	for i := range xc {
		xc[i] *= -128
	}
	q := unsafe.Slice((*uint32)(unsafe.Pointer(&w.Q8[0])), len(w.Q8)/4)
	parallelFor((n+15)/16, 16*k*m, func(lo, hi int) {
		wp, wd := make([]uint32, nb*128), make([]float32, nb*16)
		var tile [6 * 16]float32
		for pn := lo; pn < hi; pn++ {
			j0 := pn * 16
			for c := range 16 {
				j := j0 + c
				if j >= n {
					for b := range nb {
						wd[b*16+c] = 0
					}
					continue
				}
				row, scales := q[j*ldx:(j+1)*ldx], w.Q8Scale[j*nb:(j+1)*nb]
				for b, d := range scales {
					wd[b*16+c] = d
					dst, src := wp[b*128+c:], row[b*8:b*8+8]
					for g, v := range src {
						dst[g*16] = v ^ 0x80808080
					}
				}
			}
			cols := min(16, n-j0)
			for i0 := 0; i0 < m; i0 += 6 {
				vec.GemmQ8x6x16(xg[i0*ldx:], ldx, xdp[i0*nb:], xc[i0*nb:], nb, wp, wd, nb, tile[:], 16)
				for r := range min(6, m-i0) {
					yr := y[(i0+r)*n+j0 : (i0+r)*n+j0+cols]
					copy(yr, tile[r*16:r*16+cols])
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
	if m >= 4 && vec.HasQ8Gemm {
		matMulQ8Tiles(y, xq, xd, w, bias, m)
		return
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
