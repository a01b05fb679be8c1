#include "textflag.h"

// func dotAVX2(a, b *float32, n int) float32
// Four 8-lane FMA accumulators hide the FMA latency; 32 floats a step.
TEXT ·dotAVX2(SB), NOSPLIT, $0-28
	MOVQ a+0(FP), SI
	MOVQ b+8(FP), DI
	MOVQ n+16(FP), CX
	VXORPS Y0, Y0, Y0
	VXORPS Y1, Y1, Y1
	VXORPS Y2, Y2, Y2
	VXORPS Y3, Y3, Y3

dot32:
	CMPQ CX, $32
	JL   dot8
	VMOVUPS (SI), Y4
	VMOVUPS 32(SI), Y5
	VMOVUPS 64(SI), Y6
	VMOVUPS 96(SI), Y7
	VFMADD231PS (DI), Y4, Y0
	VFMADD231PS 32(DI), Y5, Y1
	VFMADD231PS 64(DI), Y6, Y2
	VFMADD231PS 96(DI), Y7, Y3
	ADDQ $128, SI
	ADDQ $128, DI
	SUBQ $32, CX
	JMP  dot32

dot8:
	CMPQ CX, $8
	JL   dotreduce
	VMOVUPS (SI), Y4
	VFMADD231PS (DI), Y4, Y0
	ADDQ $32, SI
	ADDQ $32, DI
	SUBQ $8, CX
	JMP  dot8

dotreduce:
	VADDPS Y1, Y0, Y0
	VADDPS Y3, Y2, Y2
	VADDPS Y2, Y0, Y0
	VEXTRACTF128 $1, Y0, X1
	VADDPS X1, X0, X0
	VHADDPS X0, X0, X0
	VHADDPS X0, X0, X0

dot1:
	CMPQ CX, $0
	JE   dotdone
	VMOVSS (SI), X1
	VFMADD231SS (DI), X1, X0
	ADDQ $4, SI
	ADDQ $4, DI
	DECQ CX
	JMP  dot1

dotdone:
	VZEROUPPER
	MOVSS X0, ret+24(FP)
	RET

// func sumAVX2(a *float32, n int) float32
TEXT ·sumAVX2(SB), NOSPLIT, $0-20
	MOVQ a+0(FP), SI
	MOVQ n+8(FP), CX
	VXORPS Y0, Y0, Y0
	VXORPS Y1, Y1, Y1
	VXORPS Y2, Y2, Y2
	VXORPS Y3, Y3, Y3

sum32:
	CMPQ CX, $32
	JL   sum8
	VADDPS (SI), Y0, Y0
	VADDPS 32(SI), Y1, Y1
	VADDPS 64(SI), Y2, Y2
	VADDPS 96(SI), Y3, Y3
	ADDQ $128, SI
	SUBQ $32, CX
	JMP  sum32

sum8:
	CMPQ CX, $8
	JL   sumreduce
	VADDPS (SI), Y0, Y0
	ADDQ $32, SI
	SUBQ $8, CX
	JMP  sum8

sumreduce:
	VADDPS Y1, Y0, Y0
	VADDPS Y3, Y2, Y2
	VADDPS Y2, Y0, Y0
	VEXTRACTF128 $1, Y0, X1
	VADDPS X1, X0, X0
	VHADDPS X0, X0, X0
	VHADDPS X0, X0, X0

sum1:
	CMPQ CX, $0
	JE   sumdone
	VADDSS (SI), X0, X0
	ADDQ $4, SI
	DECQ CX
	JMP  sum1

sumdone:
	VZEROUPPER
	MOVSS X0, ret+16(FP)
	RET

// func dotBF16AVX2(x *float32, w *uint16, n int) float32
// bf16 -> f32 is a zero-extend to 32 bits and a shift left by 16.
TEXT ·dotBF16AVX2(SB), NOSPLIT, $0-28
	MOVQ x+0(FP), SI
	MOVQ w+8(FP), DI
	MOVQ n+16(FP), CX
	VXORPS Y0, Y0, Y0
	VXORPS Y1, Y1, Y1
	VXORPS Y2, Y2, Y2
	VXORPS Y3, Y3, Y3

bf32:
	CMPQ CX, $32
	JL   bf8
	VPMOVZXWD (DI), Y4
	VPMOVZXWD 16(DI), Y5
	VPMOVZXWD 32(DI), Y6
	VPMOVZXWD 48(DI), Y7
	VPSLLD $16, Y4, Y4
	VPSLLD $16, Y5, Y5
	VPSLLD $16, Y6, Y6
	VPSLLD $16, Y7, Y7
	VFMADD231PS (SI), Y4, Y0
	VFMADD231PS 32(SI), Y5, Y1
	VFMADD231PS 64(SI), Y6, Y2
	VFMADD231PS 96(SI), Y7, Y3
	ADDQ $128, SI
	ADDQ $64, DI
	SUBQ $32, CX
	JMP  bf32

bf8:
	CMPQ CX, $8
	JL   bfreduce
	VPMOVZXWD (DI), Y4
	VPSLLD $16, Y4, Y4
	VFMADD231PS (SI), Y4, Y0
	ADDQ $32, SI
	ADDQ $16, DI
	SUBQ $8, CX
	JMP  bf8

bfreduce:
	VADDPS Y1, Y0, Y0
	VADDPS Y3, Y2, Y2
	VADDPS Y2, Y0, Y0
	VEXTRACTF128 $1, Y0, X1
	VADDPS X1, X0, X0
	VHADDPS X0, X0, X0
	VHADDPS X0, X0, X0

bf1:
	CMPQ CX, $0
	JE   bfdone
	MOVWLZX (DI), AX
	SHLL $16, AX
	VMOVD AX, X1
	VFMADD231SS (SI), X1, X0
	ADDQ $4, SI
	ADDQ $2, DI
	DECQ CX
	JMP  bf1

bfdone:
	VZEROUPPER
	MOVSS X0, ret+24(FP)
	RET

// func dot2x4AVX2(x *float32, ldx int, w *float32, ldw int, k int, out *float32)
// out[i*4+j] = dot(x row i, w row j) for i < 2, j < 4 over k (a multiple of
// 8): a register tile, so each loaded vector feeds two or four FMAs.
TEXT ·dot2x4AVX2(SB), NOSPLIT, $0-48
	MOVQ x+0(FP), SI
	MOVQ ldx+8(FP), R8
	SHLQ $2, R8
	MOVQ w+16(FP), DI
	MOVQ ldw+24(FP), R9
	SHLQ $2, R9
	MOVQ k+32(FP), CX
	MOVQ out+40(FP), DX
	LEAQ (R9)(R9*2), R10
	VXORPS Y0, Y0, Y0
	VXORPS Y1, Y1, Y1
	VXORPS Y2, Y2, Y2
	VXORPS Y3, Y3, Y3
	VXORPS Y4, Y4, Y4
	VXORPS Y5, Y5, Y5
	VXORPS Y6, Y6, Y6
	VXORPS Y7, Y7, Y7

t8:
	CMPQ CX, $8
	JL   tdone
	VMOVUPS (SI), Y8
	VMOVUPS (SI)(R8*1), Y9
	VMOVUPS (DI), Y10
	VFMADD231PS Y8, Y10, Y0
	VFMADD231PS Y9, Y10, Y4
	VMOVUPS (DI)(R9*1), Y11
	VFMADD231PS Y8, Y11, Y1
	VFMADD231PS Y9, Y11, Y5
	VMOVUPS (DI)(R9*2), Y12
	VFMADD231PS Y8, Y12, Y2
	VFMADD231PS Y9, Y12, Y6
	VMOVUPS (DI)(R10*1), Y13
	VFMADD231PS Y8, Y13, Y3
	VFMADD231PS Y9, Y13, Y7
	ADDQ $32, SI
	ADDQ $32, DI
	SUBQ $8, CX
	JMP  t8

tdone:
	// Reduce pairs of accumulators together to halve the horizontal work:
	// hadd(a, b) interleaves partial sums of a and b.
	VHADDPS Y1, Y0, Y0
	VHADDPS Y3, Y2, Y2
	VHADDPS Y2, Y0, Y0
	VEXTRACTF128 $1, Y0, X1
	VADDPS X1, X0, X0
	VMOVUPS X0, (DX)
	VHADDPS Y5, Y4, Y4
	VHADDPS Y7, Y6, Y6
	VHADDPS Y6, Y4, Y4
	VEXTRACTF128 $1, Y4, X5
	VADDPS X5, X4, X4
	VMOVUPS X4, 16(DX)
	VZEROUPPER
	RET

// func gemm4x16AVX2(a *float32, lda int, b *float32, ldb int, k int, c *float32, ldc int)
// c[r*ldc+j] += Σ_p a[r*lda+p]·b[p*ldb+j] for r < 4, j < 16: the outer-
// product register tile (broadcast a, two vectors of b, eight accumulators)
// that suits short inner dimensions such as a head size.
TEXT ·gemm4x16AVX2(SB), NOSPLIT, $0-56
	MOVQ a+0(FP), SI
	MOVQ lda+8(FP), R8
	SHLQ $2, R8
	MOVQ b+16(FP), DI
	MOVQ ldb+24(FP), R9
	SHLQ $2, R9
	MOVQ k+32(FP), CX
	MOVQ c+40(FP), DX
	MOVQ ldc+48(FP), R10
	SHLQ $2, R10
	LEAQ (SI)(R8*1), R11
	LEAQ (R11)(R8*1), R12
	LEAQ (R12)(R8*1), R13
	VXORPS Y0, Y0, Y0
	VXORPS Y1, Y1, Y1
	VXORPS Y2, Y2, Y2
	VXORPS Y3, Y3, Y3
	VXORPS Y4, Y4, Y4
	VXORPS Y5, Y5, Y5
	VXORPS Y6, Y6, Y6
	VXORPS Y7, Y7, Y7

gloop:
	TESTQ CX, CX
	JEQ   gdone
	VMOVUPS (DI), Y8
	VMOVUPS 32(DI), Y9
	VBROADCASTSS (SI), Y10
	VFMADD231PS Y8, Y10, Y0
	VFMADD231PS Y9, Y10, Y1
	VBROADCASTSS (R11), Y11
	VFMADD231PS Y8, Y11, Y2
	VFMADD231PS Y9, Y11, Y3
	VBROADCASTSS (R12), Y12
	VFMADD231PS Y8, Y12, Y4
	VFMADD231PS Y9, Y12, Y5
	VBROADCASTSS (R13), Y13
	VFMADD231PS Y8, Y13, Y6
	VFMADD231PS Y9, Y13, Y7
	ADDQ $4, SI
	ADDQ $4, R11
	ADDQ $4, R12
	ADDQ $4, R13
	ADDQ R9, DI
	DECQ CX
	JMP  gloop

gdone:
	VADDPS (DX), Y0, Y0
	VMOVUPS Y0, (DX)
	VADDPS 32(DX), Y1, Y1
	VMOVUPS Y1, 32(DX)
	ADDQ R10, DX
	VADDPS (DX), Y2, Y2
	VMOVUPS Y2, (DX)
	VADDPS 32(DX), Y3, Y3
	VMOVUPS Y3, 32(DX)
	ADDQ R10, DX
	VADDPS (DX), Y4, Y4
	VMOVUPS Y4, (DX)
	VADDPS 32(DX), Y5, Y5
	VMOVUPS Y5, 32(DX)
	ADDQ R10, DX
	VADDPS (DX), Y6, Y6
	VMOVUPS Y6, (DX)
	VADDPS 32(DX), Y7, Y7
	VMOVUPS Y7, 32(DX)
	VZEROUPPER
	RET

#define BCAST(bits, reg) MOVL $bits, AX; VMOVD AX, X15; VBROADCASTSS X15, reg

// func expSubAVX2(x *float32, n int, m float32) float32
// x[i] = exp(x[i] - m) in place for n (a multiple of 8) values, returning
// their sum: the exponential pass of a softmax. Arguments below -87 (after
// subtracting m) are clamped there. e^y = 2^k·e^r with k = round(y·log2 e),
// r = y − k·ln2 (in two parts), e^r by its degree-6 Taylor polynomial.
TEXT ·expSubAVX2(SB), NOSPLIT, $0-28
	MOVQ x+0(FP), SI
	MOVQ n+8(FP), CX
	VBROADCASTSS m+16(FP), Y1
	VXORPS Y0, Y0, Y0
	BCAST(0x3fb8aa3b, Y2)  // log2 e
	BCAST(0x3f317200, Y3)  // ln2, high part
	BCAST(0x35bfbe8e, Y4)  // ln2, low part
	BCAST(0x3f800000, Y5)  // 1
	BCAST(0x3f000000, Y6)  // 1/2
	BCAST(0x3e2aaaab, Y7)  // 1/6
	BCAST(0x3d2aaaab, Y8)  // 1/24
	BCAST(0x3c088889, Y9)  // 1/120
	BCAST(0x3ab60b61, Y10) // 1/720
	BCAST(0xc2ae0000, Y11) // -87
	BCAST(0x0000007f, Y12) // exponent bias 127

eloop:
	CMPQ CX, $8
	JL   edone
	VMOVUPS (SI), Y13
	VSUBPS Y1, Y13, Y13
	VMAXPS Y11, Y13, Y13
	VMULPS Y2, Y13, Y14
	VROUNDPS $0, Y14, Y14
	VFNMADD231PS Y3, Y14, Y13
	VFNMADD231PS Y4, Y14, Y13
	VMOVAPS Y10, Y15
	VFMADD213PS Y9, Y13, Y15
	VFMADD213PS Y8, Y13, Y15
	VFMADD213PS Y7, Y13, Y15
	VFMADD213PS Y6, Y13, Y15
	VFMADD213PS Y5, Y13, Y15
	VFMADD213PS Y5, Y13, Y15
	VCVTPS2DQ Y14, Y14
	VPADDD Y12, Y14, Y14
	VPSLLD $23, Y14, Y14
	VMULPS Y14, Y15, Y15
	VMOVUPS Y15, (SI)
	VADDPS Y15, Y0, Y0
	ADDQ $32, SI
	SUBQ $8, CX
	JMP  eloop

edone:
	VEXTRACTF128 $1, Y0, X1
	VADDPS X1, X0, X0
	VHADDPS X0, X0, X0
	VHADDPS X0, X0, X0
	VZEROUPPER
	MOVSS X0, ret+24(FP)
	RET

// func dot1x4AVX2(x *float32, w *float32, ldw int, k int, out *float32)
// Row 0 of dot2x4AVX2 alone: the same accumulators, FMAs and reduction in
// the same order, so its four results equal dot2x4AVX2's bit for bit.
TEXT ·dot1x4AVX2(SB), NOSPLIT, $0-40
	MOVQ x+0(FP), SI
	MOVQ w+8(FP), DI
	MOVQ ldw+16(FP), R9
	SHLQ $2, R9
	MOVQ k+24(FP), CX
	MOVQ out+32(FP), DX
	LEAQ (R9)(R9*2), R10
	VXORPS Y0, Y0, Y0
	VXORPS Y1, Y1, Y1
	VXORPS Y2, Y2, Y2
	VXORPS Y3, Y3, Y3

o8:
	CMPQ CX, $8
	JL   odone
	VMOVUPS (SI), Y8
	VMOVUPS (DI), Y10
	VFMADD231PS Y8, Y10, Y0
	VMOVUPS (DI)(R9*1), Y11
	VFMADD231PS Y8, Y11, Y1
	VMOVUPS (DI)(R9*2), Y12
	VFMADD231PS Y8, Y12, Y2
	VMOVUPS (DI)(R10*1), Y13
	VFMADD231PS Y8, Y13, Y3
	ADDQ $32, SI
	ADDQ $32, DI
	SUBQ $8, CX
	JMP  o8

odone:
	VHADDPS Y1, Y0, Y0
	VHADDPS Y3, Y2, Y2
	VHADDPS Y2, Y0, Y0
	VEXTRACTF128 $1, Y0, X1
	VADDPS X1, X0, X0
	VMOVUPS X0, (DX)
	VZEROUPPER
	RET

// func dotQ8AVX2(xq *int8, xd *float32, q *int8, d *float32, blocks int) float32
// ggml's q8_0·q8_0 dot: per block of 32, |x| (unsigned) times w with x's
// sign (signed) in VPMADDUBSW (pairs of products, at most 2·127·127, no
// saturation), VPMADDWD with ones to 8 int32 sums, converted to float and
// scaled by xd[b]·d[b]; four blocks an iteration into four totals.
TEXT ·dotQ8AVX2(SB), NOSPLIT, $0-44
	MOVQ xq+0(FP), SI
	MOVQ xd+8(FP), R8
	MOVQ q+16(FP), DI
	MOVQ d+24(FP), DX
	MOVQ blocks+32(FP), CX
	VXORPS Y0, Y0, Y0
	VXORPS Y1, Y1, Y1
	VXORPS Y13, Y13, Y13
	VXORPS Y14, Y14, Y14
	VPCMPEQW Y15, Y15, Y15
	VPSRLW $15, Y15, Y15

q8four:
	CMPQ CX, $4
	JL   q8one
	VMOVDQU 0(SI), Y2
	VMOVDQU 0(DI), Y3
	VPSIGNB Y2, Y2, Y4
	VPSIGNB Y2, Y3, Y3
	VPMADDUBSW Y3, Y4, Y4
	VPMADDWD Y15, Y4, Y4
	VCVTDQ2PS Y4, Y4
	VBROADCASTSS 0(R8), Y2
	VBROADCASTSS 0(DX), Y3
	VMULPS Y3, Y2, Y2
	VFMADD231PS Y2, Y4, Y0
	VMOVDQU 32(SI), Y5
	VMOVDQU 32(DI), Y6
	VPSIGNB Y5, Y5, Y7
	VPSIGNB Y5, Y6, Y6
	VPMADDUBSW Y6, Y7, Y7
	VPMADDWD Y15, Y7, Y7
	VCVTDQ2PS Y7, Y7
	VBROADCASTSS 4(R8), Y5
	VBROADCASTSS 4(DX), Y6
	VMULPS Y6, Y5, Y5
	VFMADD231PS Y5, Y7, Y1
	VMOVDQU 64(SI), Y2
	VMOVDQU 64(DI), Y3
	VPSIGNB Y2, Y2, Y4
	VPSIGNB Y2, Y3, Y3
	VPMADDUBSW Y3, Y4, Y4
	VPMADDWD Y15, Y4, Y4
	VCVTDQ2PS Y4, Y4
	VBROADCASTSS 8(R8), Y2
	VBROADCASTSS 8(DX), Y3
	VMULPS Y3, Y2, Y2
	VFMADD231PS Y2, Y4, Y13
	VMOVDQU 96(SI), Y5
	VMOVDQU 96(DI), Y6
	VPSIGNB Y5, Y5, Y7
	VPSIGNB Y5, Y6, Y6
	VPMADDUBSW Y6, Y7, Y7
	VPMADDWD Y15, Y7, Y7
	VCVTDQ2PS Y7, Y7
	VBROADCASTSS 12(R8), Y5
	VBROADCASTSS 12(DX), Y6
	VMULPS Y6, Y5, Y5
	VFMADD231PS Y5, Y7, Y14
	ADDQ $128, SI
	ADDQ $128, DI
	ADDQ $16, R8
	ADDQ $16, DX
	SUBQ $4, CX
	JMP  q8four

q8one:
	CMPQ CX, $0
	JE   q8reduce
	VMOVDQU 0(SI), Y2
	VMOVDQU 0(DI), Y3
	VPSIGNB Y2, Y2, Y4
	VPSIGNB Y2, Y3, Y3
	VPMADDUBSW Y3, Y4, Y4
	VPMADDWD Y15, Y4, Y4
	VCVTDQ2PS Y4, Y4
	VBROADCASTSS 0(R8), Y2
	VBROADCASTSS 0(DX), Y3
	VMULPS Y3, Y2, Y2
	VFMADD231PS Y2, Y4, Y0
	ADDQ $32, SI
	ADDQ $32, DI
	ADDQ $4, R8
	ADDQ $4, DX
	DECQ CX
	JMP  q8one

q8reduce:
	VADDPS Y1, Y0, Y0
	VADDPS Y14, Y13, Y13
	VADDPS Y13, Y0, Y0
	VEXTRACTF128 $1, Y0, X1
	VADDPS X1, X0, X0
	VHADDPS X0, X0, X0
	VHADDPS X0, X0, X0
	VZEROUPPER
	MOVSS X0, ret+40(FP)
	RET

// func dotF16AVX2(x *float32, w *uint16, n int) float32
// IEEE half -> f32 by F16C's VCVTPH2PS, eight values a load.
TEXT ·dotF16AVX2(SB), NOSPLIT, $0-28
	MOVQ x+0(FP), SI
	MOVQ w+8(FP), DI
	MOVQ n+16(FP), CX
	VXORPS Y0, Y0, Y0
	VXORPS Y1, Y1, Y1
	VXORPS Y2, Y2, Y2
	VXORPS Y3, Y3, Y3

h32:
	CMPQ CX, $32
	JL   h8
	VCVTPH2PS (DI), Y4
	VCVTPH2PS 16(DI), Y5
	VCVTPH2PS 32(DI), Y6
	VCVTPH2PS 48(DI), Y7
	VFMADD231PS (SI), Y4, Y0
	VFMADD231PS 32(SI), Y5, Y1
	VFMADD231PS 64(SI), Y6, Y2
	VFMADD231PS 96(SI), Y7, Y3
	ADDQ $128, SI
	ADDQ $64, DI
	SUBQ $32, CX
	JMP  h32

h8:
	CMPQ CX, $8
	JL   hreduce
	VCVTPH2PS (DI), Y4
	VFMADD231PS (SI), Y4, Y0
	ADDQ $32, SI
	ADDQ $16, DI
	SUBQ $8, CX
	JMP  h8

hreduce:
	VADDPS Y1, Y0, Y0
	VADDPS Y3, Y2, Y2
	VADDPS Y2, Y0, Y0
	VEXTRACTF128 $1, Y0, X1
	VADDPS X1, X0, X0
	VHADDPS X0, X0, X0
	VHADDPS X0, X0, X0

h1:
	CMPQ CX, $0
	JE   hdone
	MOVWLZX (DI), AX
	VMOVD AX, X1
	VCVTPH2PS X1, X1
	VFMADD231SS (SI), X1, X0
	ADDQ $4, SI
	ADDQ $2, DI
	DECQ CX
	JMP  h1

hdone:
	VZEROUPPER
	MOVSS X0, ret+24(FP)
	RET

// func dotQ8RowsVNNI(xq *int8, xd *float32, xs *int32, q *int8, d *float32, groups, tail4, rows int, y *float32)
// y[r] = the dot of x with each of `rows` consecutive weight rows of
// 8·groups + 4·tail4 Q8_0 blocks: one call a matrix slice, so short rows
// (896 values) pay no per-row call.
//
// VPDPBUSD multiplies unsigned by signed bytes into int32 with no 16-bit
// intermediate, so the weights are made unsigned (q XOR 0x80 = q+128) and
// the product corrected by 128·Σx per block (xs, computed once per input
// row): Σ(q+128)x − 128Σx = Σqx exactly. Eight blocks' int32 lanes are
// summed horizontally into one vector, so the scales apply eight blocks at
// a time.
TEXT ·dotQ8RowsVNNI(SB), NOSPLIT, $0-72
	MOVQ xq+0(FP), R11
	MOVQ xd+8(FP), R12
	MOVQ xs+16(FP), R13
	MOVQ q+24(FP), DI
	MOVQ d+32(FP), DX
	MOVQ groups+40(FP), AX
	MOVQ rows+56(FP), R10
	MOVQ y+64(FP), BX
	MOVL $0x80808080, CX
	VMOVD CX, X15
	VPBROADCASTD X15, Y15

rrow:
	CMPQ R10, $0
	JE   rdone
	MOVQ R11, SI
	MOVQ R12, R8
	MOVQ R13, R9
	MOVQ AX, CX
	VXORPS Y14, Y14, Y14
	VXORPS Y13, Y13, Y13

rgroup:
	CMPQ CX, $0
	JE   rtail
	VPXOR 0(DI), Y15, Y8
	VPXOR Y0, Y0, Y0
	VPDPBUSD 0(SI), Y8, Y0
	VPXOR 32(DI), Y15, Y9
	VPXOR Y1, Y1, Y1
	VPDPBUSD 32(SI), Y9, Y1
	VPXOR 64(DI), Y15, Y10
	VPXOR Y2, Y2, Y2
	VPDPBUSD 64(SI), Y10, Y2
	VPXOR 96(DI), Y15, Y11
	VPXOR Y3, Y3, Y3
	VPDPBUSD 96(SI), Y11, Y3
	VPXOR 128(DI), Y15, Y8
	VPXOR Y4, Y4, Y4
	VPDPBUSD 128(SI), Y8, Y4
	VPXOR 160(DI), Y15, Y9
	VPXOR Y5, Y5, Y5
	VPDPBUSD 160(SI), Y9, Y5
	VPXOR 192(DI), Y15, Y10
	VPXOR Y6, Y6, Y6
	VPDPBUSD 192(SI), Y10, Y6
	VPXOR 224(DI), Y15, Y11
	VPXOR Y7, Y7, Y7
	VPDPBUSD 224(SI), Y11, Y7
	VPHADDD Y1, Y0, Y0
	VPHADDD Y3, Y2, Y2
	VPHADDD Y5, Y4, Y4
	VPHADDD Y7, Y6, Y6
	VPHADDD Y2, Y0, Y0
	VPHADDD Y6, Y4, Y4
	VPERM2I128 $0x20, Y4, Y0, Y1
	VPERM2I128 $0x31, Y4, Y0, Y2
	VPADDD Y2, Y1, Y1
	VMOVDQU (R9), Y3
	VPSLLD $7, Y3, Y3
	VPSUBD Y3, Y1, Y1
	VCVTDQ2PS Y1, Y1
	VMOVUPS (R8), Y2
	VMULPS (DX), Y2, Y2
	VFMADD231PS Y2, Y1, Y14
	ADDQ $256, SI
	ADDQ $256, DI
	ADDQ $32, R8
	ADDQ $32, R9
	ADDQ $32, DX
	DECQ CX
	JMP  rgroup

rtail:
	CMPQ tail4+48(FP), $0
	JE   rstore
	// Four blocks: the same sums, one 128-bit vector of them.
	VPXOR 0(DI), Y15, Y8
	VPXOR Y0, Y0, Y0
	VPDPBUSD 0(SI), Y8, Y0
	VPXOR 32(DI), Y15, Y9
	VPXOR Y1, Y1, Y1
	VPDPBUSD 32(SI), Y9, Y1
	VPXOR 64(DI), Y15, Y10
	VPXOR Y2, Y2, Y2
	VPDPBUSD 64(SI), Y10, Y2
	VPXOR 96(DI), Y15, Y11
	VPXOR Y3, Y3, Y3
	VPDPBUSD 96(SI), Y11, Y3
	VPHADDD Y1, Y0, Y0
	VPHADDD Y3, Y2, Y2
	VPHADDD Y2, Y0, Y0
	VEXTRACTI128 $1, Y0, X1
	VPADDD X1, X0, X0
	VMOVDQU (R9), X3
	VPSLLD $7, X3, X3
	VPSUBD X3, X0, X0
	VCVTDQ2PS X0, X0
	VMOVUPS (R8), X2
	VMULPS (DX), X2, X2
	VFMADD231PS X2, X0, X13
	ADDQ $128, DI
	ADDQ $16, DX

rstore:
	VEXTRACTF128 $1, Y14, X1
	VADDPS X1, X14, X0
	VADDPS X13, X0, X0
	VHADDPS X0, X0, X0
	VHADDPS X0, X0, X0
	MOVSS X0, (BX)
	ADDQ $4, BX
	DECQ R10
	JMP  rrow

rdone:
	VZEROUPPER
	RET

// func dotBF16RowsAVX2(x *float32, w *uint16, k, rows int, y *float32)
// The dot of x with each of `rows` consecutive weight rows of k values
// (k a multiple of 32) into y: one call a slice of rows.
TEXT ·dotBF16RowsAVX2(SB), NOSPLIT, $0-40
	MOVQ x+0(FP), R11
	MOVQ w+8(FP), DI
	MOVQ k+16(FP), AX
	MOVQ rows+24(FP), R10
	MOVQ y+32(FP), BX

dotBF16RowsAVX2row:
	CMPQ R10, $0
	JE   dotBF16RowsAVX2done
	MOVQ R11, SI
	MOVQ AX, CX
	VXORPS Y0, Y0, Y0
	VXORPS Y1, Y1, Y1
	VXORPS Y2, Y2, Y2
	VXORPS Y3, Y3, Y3

dotBF16RowsAVX2loop:
	VPMOVZXWD (DI), Y4
	VPMOVZXWD 16(DI), Y5
	VPMOVZXWD 32(DI), Y6
	VPMOVZXWD 48(DI), Y7
	VPSLLD $16, Y4, Y4
	VPSLLD $16, Y5, Y5
	VPSLLD $16, Y6, Y6
	VPSLLD $16, Y7, Y7
	VFMADD231PS (SI), Y4, Y0
	VFMADD231PS 32(SI), Y5, Y1
	VFMADD231PS 64(SI), Y6, Y2
	VFMADD231PS 96(SI), Y7, Y3
	ADDQ $128, SI
	ADDQ $64, DI
	SUBQ $32, CX
	JNZ  dotBF16RowsAVX2loop
	VADDPS Y1, Y0, Y0
	VADDPS Y3, Y2, Y2
	VADDPS Y2, Y0, Y0
	VEXTRACTF128 $1, Y0, X1
	VADDPS X1, X0, X0
	VHADDPS X0, X0, X0
	VHADDPS X0, X0, X0
	MOVSS X0, (BX)
	ADDQ $4, BX
	DECQ R10
	JMP  dotBF16RowsAVX2row

dotBF16RowsAVX2done:
	VZEROUPPER
	RET

// func dotF16RowsAVX2(x *float32, w *uint16, k, rows int, y *float32)
// The dot of x with each of `rows` consecutive weight rows of k values
// (k a multiple of 32) into y: one call a slice of rows.
TEXT ·dotF16RowsAVX2(SB), NOSPLIT, $0-40
	MOVQ x+0(FP), R11
	MOVQ w+8(FP), DI
	MOVQ k+16(FP), AX
	MOVQ rows+24(FP), R10
	MOVQ y+32(FP), BX

dotF16RowsAVX2row:
	CMPQ R10, $0
	JE   dotF16RowsAVX2done
	MOVQ R11, SI
	MOVQ AX, CX
	VXORPS Y0, Y0, Y0
	VXORPS Y1, Y1, Y1
	VXORPS Y2, Y2, Y2
	VXORPS Y3, Y3, Y3

dotF16RowsAVX2loop:
	VCVTPH2PS (DI), Y4
	VCVTPH2PS 16(DI), Y5
	VCVTPH2PS 32(DI), Y6
	VCVTPH2PS 48(DI), Y7
	VFMADD231PS (SI), Y4, Y0
	VFMADD231PS 32(SI), Y5, Y1
	VFMADD231PS 64(SI), Y6, Y2
	VFMADD231PS 96(SI), Y7, Y3
	ADDQ $128, SI
	ADDQ $64, DI
	SUBQ $32, CX
	JNZ  dotF16RowsAVX2loop
	VADDPS Y1, Y0, Y0
	VADDPS Y3, Y2, Y2
	VADDPS Y2, Y0, Y0
	VEXTRACTF128 $1, Y0, X1
	VADDPS X1, X0, X0
	VHADDPS X0, X0, X0
	VHADDPS X0, X0, X0
	MOVSS X0, (BX)
	ADDQ $4, BX
	DECQ R10
	JMP  dotF16RowsAVX2row

dotF16RowsAVX2done:
	VZEROUPPER
	RET

// func scaleMaxAVX2(x *float32, n int, s float32) float32
// x[i] *= s in place for n (a multiple of 8, at least 8) values, returning
// their maximum: the first pass of a softmax over scaled scores.
TEXT ·scaleMaxAVX2(SB), NOSPLIT, $0-28
	MOVQ x+0(FP), SI
	MOVQ n+8(FP), CX
	VBROADCASTSS s+16(FP), Y1
	BCAST(0xff800000, Y0) // -Inf

smloop:
	CMPQ CX, $8
	JL   smdone
	VMULPS (SI), Y1, Y2
	VMOVUPS Y2, (SI)
	VMAXPS Y2, Y0, Y0
	ADDQ $32, SI
	SUBQ $8, CX
	JMP  smloop

smdone:
	VEXTRACTF128 $1, Y0, X1
	VMAXPS X1, X0, X0
	VPERMILPS $0x4e, X0, X1
	VMAXPS X1, X0, X0
	VPERMILPS $0xb1, X0, X1
	VMAXPS X1, X0, X0
	VZEROUPPER
	MOVSS X0, ret+24(FP)
	RET

// func scaleAVX2(x *float32, n int, s float32)
// x[i] *= s in place for n (a multiple of 8) values.
TEXT ·scaleAVX2(SB), NOSPLIT, $0-20
	MOVQ x+0(FP), SI
	MOVQ n+8(FP), CX
	VBROADCASTSS s+16(FP), Y1

scloop:
	CMPQ CX, $8
	JL   scdone
	VMULPS (SI), Y1, Y2
	VMOVUPS Y2, (SI)
	ADDQ $32, SI
	SUBQ $8, CX
	JMP  scloop

scdone:
	VZEROUPPER
	RET

// func axpyAVX2(y, x *float32, n int, a float32)
// y[i] += a·x[i] (one fused multiply-add) for n (a multiple of 8) values.
TEXT ·axpyAVX2(SB), NOSPLIT, $0-28
	MOVQ y+0(FP), DI
	MOVQ x+8(FP), SI
	MOVQ n+16(FP), CX
	VBROADCASTSS a+24(FP), Y0

axloop:
	CMPQ CX, $8
	JL   axdone
	VMOVUPS (DI), Y1
	VFMADD231PS (SI), Y0, Y1
	VMOVUPS Y1, (DI)
	ADDQ $32, SI
	ADDQ $32, DI
	SUBQ $8, CX
	JMP  axloop

axdone:
	VZEROUPPER
	RET
