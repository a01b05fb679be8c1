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

// func dotQ8AVX2(x *float32, q *int8, d *float32, blocks int) float32
// Per block of 32: int8 sign-extended to int32, converted to float, four
// products summed in two chains, then the block's scale times that sum
// added to the total; two blocks an iteration into two totals.
TEXT ·dotQ8AVX2(SB), NOSPLIT, $0-36
	MOVQ x+0(FP), SI
	MOVQ q+8(FP), DI
	MOVQ d+16(FP), DX
	MOVQ blocks+24(FP), CX
	VXORPS Y0, Y0, Y0
	VXORPS Y1, Y1, Y1

q8two:
	CMPQ CX, $2
	JL   q8one
	VPMOVSXBD 0(DI), Y4
	VPMOVSXBD 8(DI), Y5
	VPMOVSXBD 16(DI), Y6
	VPMOVSXBD 24(DI), Y7
	VCVTDQ2PS Y4, Y4
	VCVTDQ2PS Y5, Y5
	VCVTDQ2PS Y6, Y6
	VCVTDQ2PS Y7, Y7
	VMULPS 0(SI), Y4, Y4
	VMULPS 32(SI), Y5, Y5
	VFMADD231PS 64(SI), Y6, Y4
	VFMADD231PS 96(SI), Y7, Y5
	VADDPS Y5, Y4, Y4
	VBROADCASTSS 0(DX), Y6
	VFMADD231PS Y6, Y4, Y0
	VPMOVSXBD 32(DI), Y4
	VPMOVSXBD 40(DI), Y5
	VPMOVSXBD 48(DI), Y6
	VPMOVSXBD 56(DI), Y7
	VCVTDQ2PS Y4, Y4
	VCVTDQ2PS Y5, Y5
	VCVTDQ2PS Y6, Y6
	VCVTDQ2PS Y7, Y7
	VMULPS 128(SI), Y4, Y4
	VMULPS 160(SI), Y5, Y5
	VFMADD231PS 192(SI), Y6, Y4
	VFMADD231PS 224(SI), Y7, Y5
	VADDPS Y5, Y4, Y4
	VBROADCASTSS 4(DX), Y6
	VFMADD231PS Y6, Y4, Y1
	ADDQ $256, SI
	ADDQ $64, DI
	ADDQ $8, DX
	SUBQ $2, CX
	JMP  q8two

q8one:
	CMPQ CX, $0
	JE   q8reduce
	VPMOVSXBD 0(DI), Y4
	VPMOVSXBD 8(DI), Y5
	VPMOVSXBD 16(DI), Y6
	VPMOVSXBD 24(DI), Y7
	VCVTDQ2PS Y4, Y4
	VCVTDQ2PS Y5, Y5
	VCVTDQ2PS Y6, Y6
	VCVTDQ2PS Y7, Y7
	VMULPS 0(SI), Y4, Y4
	VMULPS 32(SI), Y5, Y5
	VFMADD231PS 64(SI), Y6, Y4
	VFMADD231PS 96(SI), Y7, Y5
	VADDPS Y5, Y4, Y4
	VBROADCASTSS 0(DX), Y6
	VFMADD231PS Y6, Y4, Y0
	ADDQ $128, SI
	ADDQ $32, DI
	ADDQ $4, DX
	DECQ CX
	JMP  q8one

q8reduce:
	VADDPS Y1, Y0, Y0
	VEXTRACTF128 $1, Y0, X1
	VADDPS X1, X0, X0
	VHADDPS X0, X0, X0
	VHADDPS X0, X0, X0
	VZEROUPPER
	MOVSS X0, ret+32(FP)
	RET
