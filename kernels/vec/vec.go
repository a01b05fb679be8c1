// Package vec holds float32 vector primitives that the index, the embedders
// and the CPU kernels share. On amd64 with AVX2 and FMA they run in
// assembly; elsewhere they fall back to the plain Go loops below, which are
// also the reference the tests compare against.
package vec

import (
	"fmt"
	"math"

	"github.com/agemem/agemem/kernels/half"
)

// Dot returns sum(a[i]*b[i]) over len(a); b must be at least as long.
func Dot(a, b []float32) float32 {
	if len(a) == 0 {
		return 0
	}
	_ = b[len(a)-1]
	return dot(a, b)
}

// Sum returns sum(a[i]).
func Sum(a []float32) float32 {
	if len(a) == 0 {
		return 0
	}
	return sum(a)
}

func dotGeneric(a, b []float32) float32 {
	var s0, s1, s2, s3 float32
	i := 0
	for ; i+4 <= len(a); i += 4 {
		s0 += a[i] * b[i]
		s1 += a[i+1] * b[i+1]
		s2 += a[i+2] * b[i+2]
		s3 += a[i+3] * b[i+3]
	}
	for ; i < len(a); i++ {
		s0 += a[i] * b[i]
	}
	return (s0 + s1) + (s2 + s3)
}

func sumGeneric(a []float32) float32 {
	var s0, s1, s2, s3 float32
	i := 0
	for ; i+4 <= len(a); i += 4 {
		s0 += a[i]
		s1 += a[i+1]
		s2 += a[i+2]
		s3 += a[i+3]
	}
	for ; i < len(a); i++ {
		s0 += a[i]
	}
	return (s0 + s1) + (s2 + s3)
}

// DotBF16 returns sum(x[i] * bf16(w[i])) over len(x): a row of bfloat16
// weights against float32 activations, widened on the fly.
func DotBF16(x []float32, w []uint16) float32 {
	if len(x) == 0 {
		return 0
	}
	_ = w[len(x)-1]
	return dotBF16(x, w)
}

// DotQ8 returns the dot product of two rows of Q8_0 blocks, as ggml's
// ggml_vec_dot_q8_0_q8_0 computes it: per block of 32, the exact integer
// sum of xq[i]·q[i] times xd[b]·d[b], summed over blocks. x is the
// activation row quantized as the weights are (kernels.QuantizeQ8Block),
// so the inner loop is 8-bit multiplies.
//
// xs holds each block's Σxq (Q8Sums; computed once per activation row and
// shared by every weight row it meets), which the VNNI kernel needs.
func DotQ8(xq []int8, xd []float32, xs []int32, q []int8, d []float32) float32 {
	if len(xq) == 0 {
		return 0
	}
	if len(xq)%32 != 0 {
		panic("vec: DotQ8 of a length that is not a multiple of 32")
	}
	nb := len(xq) / 32
	_, _, _, _ = q[len(xq)-1], d[nb-1], xd[nb-1], xs[nb-1]
	return dotQ8(xq, xd, xs, q, d)
}

// DotQ8Rows sets y[r] = DotQ8(xq, xd, xs, q[r·n:], d[r·n/32:]) for the
// len(y) consecutive weight rows of n = len(xq) values in q and d.
func DotQ8Rows(y []float32, xq []int8, xd []float32, xs []int32, q []int8, d []float32) {
	n, nb := len(xq), len(xq)/32
	if len(y) == 0 || n == 0 {
		clear(y)
		return
	}
	if n%32 != 0 {
		panic("vec: DotQ8Rows of a length that is not a multiple of 32")
	}
	_, _, _, _ = q[len(y)*n-1], d[len(y)*nb-1], xd[nb-1], xs[nb-1]
	if dotQ8Rows(y, xq, xd, xs, q, d) {
		return
	}
	for r := range y {
		y[r] = dotQ8(xq, xd, xs, q[r*n:(r+1)*n], d[r*nb:(r+1)*nb])
	}
}

// Q8Sums writes each 32-value block's sum of xq into xs.
func Q8Sums(xs []int32, xq []int8) {
	for b := range len(xq) / 32 {
		var s int32
		for _, v := range xq[b*32 : (b+1)*32] {
			s += int32(v)
		}
		xs[b] = s
	}
}

func dotQ8Generic(xq []int8, xd []float32, q []int8, d []float32) float32 {
	var s float32
	for b := range len(xq) / 32 {
		var n int32
		for i := b * 32; i < (b+1)*32; i++ {
			n += int32(xq[i]) * int32(q[i])
		}
		s += xd[b] * d[b] * float32(n)
	}
	return s
}

func dotBF16Generic(x []float32, w []uint16) float32 {
	var s0, s1, s2, s3 float32
	i := 0
	for ; i+4 <= len(x); i += 4 {
		s0 += x[i] * math.Float32frombits(uint32(w[i])<<16)
		s1 += x[i+1] * math.Float32frombits(uint32(w[i+1])<<16)
		s2 += x[i+2] * math.Float32frombits(uint32(w[i+2])<<16)
		s3 += x[i+3] * math.Float32frombits(uint32(w[i+3])<<16)
	}
	for ; i < len(x); i++ {
		s0 += x[i] * math.Float32frombits(uint32(w[i])<<16)
	}
	return (s0 + s1) + (s2 + s3)
}

// DotF16 returns the dot product of x and IEEE half-precision weights w
// (raw bits), accumulated in float32: the decode kernel for f16
// checkpoints, which then stream half the bytes of float32.
func DotF16(x []float32, w []uint16) float32 {
	if len(x) == 0 {
		return 0
	}
	_ = w[len(x)-1]
	return dotF16(x, w)
}

// DotBF16Rows sets y[r] = DotBF16(x, w[r·k:]) for the len(y) consecutive
// bf16 weight rows of k = len(x) values in w; f16 rows when f16 is set
// (DotF16). One call streams a whole slice of a matrix.
func DotBF16Rows(y, x []float32, w []uint16, f16 bool) {
	k := len(x)
	if len(y) == 0 {
		return
	}
	_ = w[len(y)*k-1]
	if k > 0 && dot16Rows(y, x, w, f16) {
		return
	}
	dot := DotBF16
	if f16 {
		dot = DotF16
	}
	for r := range y {
		y[r] = dot(x, w[r*k:(r+1)*k])
	}
}

func dotF16Generic(x []float32, w []uint16) float32 {
	var s0, s1, s2, s3 float32
	i := 0
	for ; i+4 <= len(x); i += 4 {
		s0 += x[i] * half.F16ToF32(w[i])
		s1 += x[i+1] * half.F16ToF32(w[i+1])
		s2 += x[i+2] * half.F16ToF32(w[i+2])
		s3 += x[i+3] * half.F16ToF32(w[i+3])
	}
	for ; i < len(x); i++ {
		s0 += x[i] * half.F16ToF32(w[i])
	}
	return (s0 + s1) + (s2 + s3)
}

func gemm4x16Generic(a []float32, lda int, b []float32, ldb int, k int, c []float32, ldc int) {
	for r := range 4 {
		for j := range 16 {
			var s float32
			for p := range k {
				s += a[r*lda+p] * b[p*ldb+j]
			}
			c[r*ldc+j] += s
		}
	}
}

func expSubGeneric(x []float32, m float32) float32 {
	var s float32
	for i, v := range x {
		x[i] = float32(math.Exp(float64(max(v-m, -87))))
		s += x[i]
	}
	return s
}

// ScaleMax sets x[i] *= s and returns the largest x[i] (−Inf for none):
// the first pass of a softmax over scaled attention scores.
func ScaleMax(x []float32, s float32) float32 { return scaleMax(x, s) }

// Scale sets x[i] *= s.
func Scale(x []float32, s float32) { scale(x, s) }

// Axpy sets y[i] += a·x[i] over len(y); x must be at least as long. The
// assembly fuses the multiply and the add (one rounding).
func Axpy(y, x []float32, a float32) {
	if len(y) == 0 {
		return
	}
	_ = x[len(y)-1]
	axpy(y, x, a)
}

func scaleMaxGeneric(x []float32, s float32) float32 {
	m := float32(math.Inf(-1))
	for i, v := range x {
		x[i] = v * s
		m = max(m, x[i])
	}
	return m
}

func scaleGeneric(x []float32, s float32) {
	for i := range x {
		x[i] *= s
	}
}

func axpyGeneric(y, x []float32, a float32) {
	for i := range y {
		y[i] += a * x[i]
	}
}

// DotBF16x4x4 sets out[4r+c] to the dot product of row r of x and row c
// of w, 4 rows each of k bfloat16 values (rows ldx and ldw apart), the
// products summed in float32: a prefill's activations rounded to bf16
// times bf16 weights, as ggml's bf16 matmul computes them, read as stored.
// On AVX512_BF16 (HasBF16Dot) and k a multiple of 32, VDPBF16PS takes 32
// values of a row pair an instruction.
func DotBF16x4x4(x []uint16, ldx int, w []uint16, ldw int, k int, out *[16]float32) {
	if k < 0 || ldx < k || ldw < k || len(x) < 3*ldx+k || len(w) < 3*ldw+k {
		panic(fmt.Sprintf("vec: DotBF16x4x4 of %d values over x %d (ld %d), w %d (ld %d)", k, len(x), ldx, len(w), ldw))
	}
	dotBF16x4x4(x, ldx, w, ldw, k, out)
}

// dotBF16x4x4Generic is DotBF16x4x4 in Go.
func dotBF16x4x4Generic(x []uint16, ldx int, w []uint16, ldw int, k int, out *[16]float32) {
	for r := range 4 {
		for c := range 4 {
			var acc float32
			for i := range k {
				acc += half.BF16ToF32(x[r*ldx+i]) * half.BF16ToF32(w[c*ldw+i])
			}
			out[4*r+c] = acc
		}
	}
}

// Dot16x4x4 sets out[4r+c] to the dot product of row r of x (float32)
// and row c of w (bfloat16, or IEEE half if f16), 4 rows each of k values
// (rows ldx and ldw apart), the products summed in float32: a prefill's
// activations times 16-bit weights read as stored. With AVX-512
// (Has16Dot) and k a multiple of 16, the weights are widened 16 a load
// in registers (VCVTPH2PS for halves) into the FMAs' operand.
func Dot16x4x4(x []float32, ldx int, w []uint16, ldw int, k int, f16 bool, out *[16]float32) {
	if k < 0 || ldx < k || ldw < k || len(x) < 3*ldx+k || len(w) < 3*ldw+k {
		panic(fmt.Sprintf("vec: Dot16x4x4 of %d values over x %d (ld %d), w %d (ld %d)", k, len(x), ldx, len(w), ldw))
	}
	dot16x4x4(x, ldx, w, ldw, k, f16, out)
}

// dot16x4x4Generic is Dot16x4x4 in Go.
func dot16x4x4Generic(x []float32, ldx int, w []uint16, ldw int, k int, f16 bool, out *[16]float32) {
	widen := half.BF16ToF32
	if f16 {
		widen = half.F16ToF32
	}
	for r := range 4 {
		for c := range 4 {
			var acc float32
			for i := range k {
				acc += x[r*ldx+i] * widen(w[c*ldw+i])
			}
			out[4*r+c] = acc
		}
	}
}

// GemmQ8x6x16 sets a 6×16 tile of y (rows ldy apart) to the product of 6
// rows of Q8_0 activations and 16 columns of Q8_0 weights over nb blocks
// of 32, ggml's q8_0 arithmetic: each block's 32 products summed exactly
// in int32, then scaled by both blocks' scales into a float32 sum. x holds
// each row's quants as 8 four-byte groups a block, rows ldx groups apart;
// xd the rows' block scales and xc their −128·Σ quants (Q8Sums times
// −128), rows ldd apart. For each block, w holds 8 groups of the 16
// columns' four quants offset to unsigned (q XOR 0x80; column c's in word
// c of a 16-word group), and wd their scales. On AVX-512 VNNI (HasQ8Gemm)
// one VPDPBUSD takes a group of all 16 columns.
func GemmQ8x6x16(x []uint32, ldx int, xd []float32, xc []int32, ldd int, w []uint32, wd []float32, nb int, y []float32, ldy int) {
	if nb < 0 || ldx < 8*nb || ldd < nb || len(x) < 5*ldx+8*nb || len(xd) < 5*ldd+nb || len(xc) < 5*ldd+nb ||
		len(w) < nb*128 || len(wd) < nb*16 || ldy < 16 || len(y) < 5*ldy+16 {
		panic(fmt.Sprintf("vec: GemmQ8x6x16 of %d blocks over x %d (ld %d), xd %d, xc %d (ld %d), w %d, wd %d, y %d (ld %d)",
			nb, len(x), ldx, len(xd), len(xc), ldd, len(w), len(wd), len(y), ldy))
	}
	gemmQ8x6x16(x, ldx, xd, xc, ldd, w, wd, nb, y, ldy)
}

// gemmQ8x6x16Generic is GemmQ8x6x16 in Go.
func gemmQ8x6x16Generic(x []uint32, ldx int, xd []float32, xc []int32, ldd int, w []uint32, wd []float32, nb int, y []float32, ldy int) {
	for r := range 6 {
		for c := range 16 {
			var acc float32
			for b := range nb {
				s := xc[r*ldd+b]
				for g := range 8 {
					xv, wv := x[r*ldx+b*8+g], w[b*128+g*16+c]
					for t := range 4 {
						s += int32(int8(xv>>(8*t))) * int32(uint8(wv>>(8*t)))
					}
				}
				acc += float32(s) * (xd[r*ldd+b] * wd[b*16+c])
			}
			y[r*ldy+c] = acc
		}
	}
}
