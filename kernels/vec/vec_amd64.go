package vec

import (
	"math"

	"golang.org/x/sys/cpu"
)

// HasSIMD reports whether the assembly kernels are in use.
var HasSIMD = cpu.X86.HasAVX2 && cpu.X86.HasFMA

//go:noescape
func dotAVX2(a, b *float32, n int) float32

//go:noescape
func sumAVX2(a *float32, n int) float32

func dot(a, b []float32) float32 {
	if HasSIMD {
		return dotAVX2(&a[0], &b[0], len(a))
	}
	return dotGeneric(a, b)
}

func sum(a []float32) float32 {
	if HasSIMD {
		return sumAVX2(&a[0], len(a))
	}
	return sumGeneric(a)
}

//go:noescape
func dotBF16AVX2(x *float32, w *uint16, n int) float32

func dotBF16(x []float32, w []uint16) float32 {
	if HasSIMD {
		return dotBF16AVX2(&x[0], &w[0], len(x))
	}
	return dotBF16Generic(x, w)
}

//go:noescape
func dotF16AVX2(x *float32, w *uint16, n int) float32

// hasF16C: every AVX2 CPU has F16C in practice, but it is its own flag.
var hasF16C = HasSIMD && cpu.X86.HasF16C

func dotF16(x []float32, w []uint16) float32 {
	if hasF16C {
		return dotF16AVX2(&x[0], &w[0], len(x))
	}
	return dotF16Generic(x, w)
}

//go:noescape
func dotQ8AVX2(xq *int8, xd *float32, q *int8, d *float32, blocks int) float32

//go:noescape
func dotQ8RowsVNNI(xq *int8, xd *float32, xs *int32, q *int8, d *float32, groups, tail4, rows int, y *float32)

// dotQ8Rows is dotQ8 of x with each of len(y) consecutive weight rows, in
// one assembly call where VNNI is there and rows are whole groups of four
// blocks (every Qwen width); false where it cannot.
func dotQ8Rows(y []float32, xq []int8, xd []float32, xs []int32, q []int8, d []float32) bool {
	blocks := len(xq) / 32
	if !hasVNNI || blocks%4 != 0 || len(y) == 0 {
		return false
	}
	dotQ8RowsVNNI(&xq[0], &xd[0], &xs[0], &q[0], &d[0], blocks/8, blocks%8/4, len(y), &y[0])
	return true
}

// hasVNNI: AVX-512 VNNI on 256-bit registers (VPDPBUSD needs AVX512VL).
var hasVNNI = HasSIMD && cpu.X86.HasAVX512VNNI && cpu.X86.HasAVX512VL

func dotQ8(xq []int8, xd []float32, xs []int32, q []int8, d []float32) float32 {
	if !HasSIMD {
		return dotQ8Generic(xq, xd, q, d)
	}
	blocks, done := len(xq)/32, 0
	var s float32
	if hasVNNI && blocks >= 4 {
		done = blocks / 4 * 4
		dotQ8RowsVNNI(&xq[0], &xd[0], &xs[0], &q[0], &d[0], done/8, done%8/4, 1, &s)
	}
	if done < blocks {
		s += dotQ8AVX2(&xq[32*done], &xd[done], &q[32*done], &d[done], blocks-done)
	}
	return s
}

//go:noescape
func dot2x4AVX2(x *float32, ldx int, w *float32, ldw int, k int, out *float32)

//go:noescape
func dot1x4AVX2(x *float32, w *float32, ldw int, k int, out *float32)

// Dot1x4 sets out[j] = Dot(x[:k], w[j*ldw:][:k]) for four rows of w, bit
// for bit what Dot2x4 gives for a row: a matrix product's odd row, so that
// a row's result never depends on whether it had a partner.
func Dot1x4(x []float32, w []float32, ldw int, k int, out *[4]float32) {
	_ = x[k-1]
	_ = w[3*ldw+k-1]
	k8 := k &^ 7
	if HasSIMD && k8 > 0 {
		dot1x4AVX2(&x[0], &w[0], ldw, k8, &out[0])
	} else {
		k8 = 0
		*out = [4]float32{}
	}
	if k8 < k {
		for j := range 4 {
			out[j] += dotGeneric(x[k8:k], w[j*ldw+k8:j*ldw+k])
		}
	}
}

// Dot2x4 sets out[i*4+j] = Dot(x[i*ldx:][:k], w[j*ldw:][:k]) for two rows
// of x and four rows of w: a register tile for matrix products.
func Dot2x4(x []float32, ldx int, w []float32, ldw int, k int, out *[8]float32) {
	_ = x[ldx+k-1]
	_ = w[3*ldw+k-1]
	k8 := k &^ 7
	if HasSIMD && k8 > 0 {
		dot2x4AVX2(&x[0], ldx, &w[0], ldw, k8, &out[0])
	} else {
		k8 = 0
		*out = [8]float32{}
	}
	if k8 < k {
		for i := range 2 {
			for j := range 4 {
				out[i*4+j] += dotGeneric(x[i*ldx+k8:i*ldx+k], w[j*ldw+k8:j*ldw+k])
			}
		}
	}
}

//go:noescape
func gemm4x16AVX2(a *float32, lda int, b *float32, ldb int, k int, c *float32, ldc int)

// Gemm4x16 adds to a 4×16 tile of c the product of 4 rows of a (k values
// each) and a k×16 block of b: c[r*ldc+j] += Σ_p a[r*lda+p]·b[p*ldb+j].
func Gemm4x16(a []float32, lda int, b []float32, ldb int, k int, c []float32, ldc int) {
	if k == 0 {
		return
	}
	_ = a[3*lda+k-1]
	_ = b[(k-1)*ldb+15]
	_ = c[3*ldc+15]
	if HasSIMD {
		gemm4x16AVX2(&a[0], lda, &b[0], ldb, k, &c[0], ldc)
		return
	}
	gemm4x16Generic(a, lda, b, ldb, k, c, ldc)
}

//go:noescape
func expSubAVX2(x *float32, n int, m float32) float32

// ExpSub sets x[i] = exp(x[i] − m) and returns the sum: the exponential
// pass of a softmax (m is the maximum, so every argument is at most 0).
func ExpSub(x []float32, m float32) float32 {
	n8 := 0
	var s float32
	if HasSIMD {
		n8 = len(x) &^ 7
		if n8 > 0 {
			s = expSubAVX2(&x[0], n8, m)
		}
	}
	return s + expSubGeneric(x[n8:], m)
}

//go:noescape
func dotBF16RowsAVX2(x *float32, w *uint16, k, rows int, y *float32)

//go:noescape
func dotF16RowsAVX2(x *float32, w *uint16, k, rows int, y *float32)

// dot16Rows is the 16-bit row kernel in one assembly call where the width
// is whole 32-value steps (every Qwen width); false where it cannot.
func dot16Rows(y, x []float32, w []uint16, f16 bool) bool {
	if len(x)%32 != 0 || len(y) == 0 || !HasSIMD || (f16 && !hasF16C) {
		return false
	}
	if f16 {
		dotF16RowsAVX2(&x[0], &w[0], len(x), len(y), &y[0])
	} else {
		dotBF16RowsAVX2(&x[0], &w[0], len(x), len(y), &y[0])
	}
	return true
}

//go:noescape
func scaleMaxAVX2(x *float32, n int, s float32) float32

//go:noescape
func scaleAVX2(x *float32, n int, s float32)

//go:noescape
func axpyAVX2(y, x *float32, n int, a float32)

func scaleMax(x []float32, s float32) float32 {
	m := float32(math.Inf(-1))
	n8 := 0
	if HasSIMD {
		if n8 = len(x) &^ 7; n8 > 0 {
			m = scaleMaxAVX2(&x[0], n8, s)
		}
	}
	return max(m, scaleMaxGeneric(x[n8:], s))
}

func scale(x []float32, s float32) {
	n8 := 0
	if HasSIMD {
		if n8 = len(x) &^ 7; n8 > 0 {
			scaleAVX2(&x[0], n8, s)
		}
	}
	scaleGeneric(x[n8:], s)
}

func axpy(y, x []float32, a float32) {
	n8 := 0
	if HasSIMD {
		if n8 = len(y) &^ 7; n8 > 0 {
			axpyAVX2(&y[0], &x[0], n8, a)
		}
	}
	axpyGeneric(y[n8:], x[n8:len(y)], a)
}

// HasBF16Dot reports whether DotBF16x4x4 runs on AVX512_BF16's
// VDPBF16PS (every bf16 pair product summed in float32 in one instruction).
var HasBF16Dot = cpu.X86.HasAVX512F && cpu.X86.HasAVX512BF16 && cpu.X86.HasAVX512VL

//go:noescape
func dotBF16x4x4AVX512(x *uint16, ldx int, w *uint16, ldw int, k32 int, out *float32)

func dotBF16x4x4(x []uint16, ldx int, w []uint16, ldw int, k int, out *[16]float32) {
	if HasBF16Dot && k >= 32 && k%32 == 0 {
		dotBF16x4x4AVX512(&x[0], ldx, &w[0], ldw, k/32, &out[0])
		return
	}
	dotBF16x4x4Generic(x, ldx, w, ldw, k, out)
}

// Has16Dot reports whether Dot16x4x4 runs on AVX-512 (zmm FMAs over
// weights widened in registers).
var Has16Dot = cpu.X86.HasAVX512F

//go:noescape
func dotF16x4x4AVX512(x *float32, ldx int, w *uint16, ldw int, k16 int, out *float32)

//go:noescape
func dotBF16F32x4x4AVX512(x *float32, ldx int, w *uint16, ldw int, k16 int, out *float32)

func dot16x4x4(x []float32, ldx int, w []uint16, ldw int, k int, f16 bool, out *[16]float32) {
	switch {
	case !Has16Dot || k < 16 || k%16 != 0:
		dot16x4x4Generic(x, ldx, w, ldw, k, f16, out)
	case f16:
		dotF16x4x4AVX512(&x[0], ldx, &w[0], ldw, k/16, &out[0])
	default:
		dotBF16F32x4x4AVX512(&x[0], ldx, &w[0], ldw, k/16, &out[0])
	}
}

// HasQ8Gemm reports whether GemmQ8x6x16 runs on AVX-512 VNNI (zmm).
var HasQ8Gemm = cpu.X86.HasAVX512F && cpu.X86.HasAVX512VNNI

//go:noescape
func gemmQ8x6x16VNNI(x *uint32, ldx int, xd *float32, xc *int32, ldd int, w *uint32, wd *float32, nb int, y *float32, ldy int)

func gemmQ8x6x16(x []uint32, ldx int, xd []float32, xc []int32, ldd int, w []uint32, wd []float32, nb int, y []float32, ldy int) {
	if HasQ8Gemm && nb > 0 {
		gemmQ8x6x16VNNI(&x[0], ldx, &xd[0], &xc[0], ldd, &w[0], &wd[0], nb, &y[0], ldy)
		return
	}
	gemmQ8x6x16Generic(x, ldx, xd, xc, ldd, w, wd, nb, y, ldy)
}
