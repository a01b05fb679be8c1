#include "textflag.h"

// func gemmBF16x6x32AVX512(x *uint32, ldx int, w *uint32, kp int, y *float32, ldy int)
//
// y[r][c] = Σ_p x[r][p] · w[p][c] for 6 rows r and 32 columns c, where
// x[r][p] (rows ldx uint32s apart) and w[p][c] (32 a pair index p) are
// pairs of bfloat16 and · is their two products summed: VDPBF16PS
// (AVX512_BF16), which Go's assembler does not know, so it is written as
// its bytes (GNU as's encoding, the mnemonic beside each). Each pair
// index loads the two 16-column panels of w once and broadcasts each row's
// pair: 12 accumulators of 16 floats, 12 dot instructions a pair.
TEXT ·gemmBF16x6x32AVX512(SB), NOSPLIT, $0-48
	MOVQ x+0(FP), SI
	MOVQ ldx+8(FP), BX
	SHLQ $2, BX
	MOVQ w+16(FP), DX
	MOVQ kp+24(FP), CX
	MOVQ y+32(FP), R8
	MOVQ ldy+40(FP), R9
	SHLQ $2, R9
	LEAQ (SI)(BX*2), DI
	ADDQ BX, DI
	VPXORD Z0, Z0, Z0
	VPXORD Z1, Z1, Z1
	VPXORD Z2, Z2, Z2
	VPXORD Z3, Z3, Z3
	VPXORD Z4, Z4, Z4
	VPXORD Z5, Z5, Z5
	VPXORD Z6, Z6, Z6
	VPXORD Z7, Z7, Z7
	VPXORD Z8, Z8, Z8
	VPXORD Z9, Z9, Z9
	VPXORD Z10, Z10, Z10
	VPXORD Z11, Z11, Z11

bfloop:
	TESTQ CX, CX
	JZ    bfdone
	VMOVDQU32 (DX), Z12
	VMOVDQU32 64(DX), Z13
	VPBROADCASTD (SI), Z14
	BYTE $0x62; BYTE $0xd2; BYTE $0x0e; BYTE $0x48; BYTE $0x52; BYTE $0xc4 // VDPBF16PS Z12, Z14, Z0: Z0 += bf16 pairs of Z14 · Z12
	BYTE $0x62; BYTE $0xd2; BYTE $0x0e; BYTE $0x48; BYTE $0x52; BYTE $0xcd // VDPBF16PS Z13, Z14, Z1: Z1 += bf16 pairs of Z14 · Z13
	VPBROADCASTD (SI)(BX*1), Z15
	BYTE $0x62; BYTE $0xd2; BYTE $0x06; BYTE $0x48; BYTE $0x52; BYTE $0xd4 // VDPBF16PS Z12, Z15, Z2: Z2 += bf16 pairs of Z15 · Z12
	BYTE $0x62; BYTE $0xd2; BYTE $0x06; BYTE $0x48; BYTE $0x52; BYTE $0xdd // VDPBF16PS Z13, Z15, Z3: Z3 += bf16 pairs of Z15 · Z13
	VPBROADCASTD (SI)(BX*2), Z14
	BYTE $0x62; BYTE $0xd2; BYTE $0x0e; BYTE $0x48; BYTE $0x52; BYTE $0xe4 // VDPBF16PS Z12, Z14, Z4: Z4 += bf16 pairs of Z14 · Z12
	BYTE $0x62; BYTE $0xd2; BYTE $0x0e; BYTE $0x48; BYTE $0x52; BYTE $0xed // VDPBF16PS Z13, Z14, Z5: Z5 += bf16 pairs of Z14 · Z13
	VPBROADCASTD (DI), Z15
	BYTE $0x62; BYTE $0xd2; BYTE $0x06; BYTE $0x48; BYTE $0x52; BYTE $0xf4 // VDPBF16PS Z12, Z15, Z6: Z6 += bf16 pairs of Z15 · Z12
	BYTE $0x62; BYTE $0xd2; BYTE $0x06; BYTE $0x48; BYTE $0x52; BYTE $0xfd // VDPBF16PS Z13, Z15, Z7: Z7 += bf16 pairs of Z15 · Z13
	VPBROADCASTD (DI)(BX*1), Z14
	BYTE $0x62; BYTE $0x52; BYTE $0x0e; BYTE $0x48; BYTE $0x52; BYTE $0xc4 // VDPBF16PS Z12, Z14, Z8: Z8 += bf16 pairs of Z14 · Z12
	BYTE $0x62; BYTE $0x52; BYTE $0x0e; BYTE $0x48; BYTE $0x52; BYTE $0xcd // VDPBF16PS Z13, Z14, Z9: Z9 += bf16 pairs of Z14 · Z13
	VPBROADCASTD (DI)(BX*2), Z15
	BYTE $0x62; BYTE $0x52; BYTE $0x06; BYTE $0x48; BYTE $0x52; BYTE $0xd4 // VDPBF16PS Z12, Z15, Z10: Z10 += bf16 pairs of Z15 · Z12
	BYTE $0x62; BYTE $0x52; BYTE $0x06; BYTE $0x48; BYTE $0x52; BYTE $0xdd // VDPBF16PS Z13, Z15, Z11: Z11 += bf16 pairs of Z15 · Z13
	ADDQ $4, SI
	ADDQ $4, DI
	ADDQ $128, DX
	DECQ CX
	JMP  bfloop

bfdone:
	VMOVUPS Z0, (R8)
	VMOVUPS Z1, 64(R8)
	ADDQ R9, R8
	VMOVUPS Z2, (R8)
	VMOVUPS Z3, 64(R8)
	ADDQ R9, R8
	VMOVUPS Z4, (R8)
	VMOVUPS Z5, 64(R8)
	ADDQ R9, R8
	VMOVUPS Z6, (R8)
	VMOVUPS Z7, 64(R8)
	ADDQ R9, R8
	VMOVUPS Z8, (R8)
	VMOVUPS Z9, 64(R8)
	ADDQ R9, R8
	VMOVUPS Z10, (R8)
	VMOVUPS Z11, 64(R8)
	VZEROUPPER
	RET
