package cpu

import "github.com/agemem/agemem/kernels/vec"

// MatMulNNAdd accumulates y[m,n] += x[m,k]·b[k,n], both row-major: the
// product whose inner dimension may be short (a head size), built from
// 4×16 outer-product tiles. Column strips of 16 run in parallel; k is cut
// into blocks so a strip's block of b stays in L1 across the rows of x.
func MatMulNNAdd(y, x, b []float32, m, k, n int) { matMulNNAdd(y, n, x, b, n, m, k, n) }

// matMulNNAdd is MatMulNNAdd on the first n columns of matrices whose rows
// are ldy (y) and ldb (b) apart: the causal blocks of attention.
func matMulNNAdd(y []float32, ldy int, x, b []float32, ldbFull, m, k, n int) {
	const kb = 256
	strips := (n + 15) / 16
	parallelFor(strips, m*k*16, func(lo, hi int) {
		var tile [4 * 16]float32
		var bt [kb * 16]float32 // a ragged last strip, padded to 16 columns
		for s := lo; s < hi; s++ {
			j0 := s * 16
			w := min(16, n-j0)
			for k0 := 0; k0 < k; k0 += kb {
				kc := min(kb, k-k0)
				bs, ldb := b[k0*ldbFull+j0:], ldbFull
				if w < 16 {
					for p := range kc {
						copy(bt[p*16:p*16+w], b[(k0+p)*ldbFull+j0:(k0+p)*ldbFull+j0+w])
						clear(bt[p*16+w : p*16+16])
					}
					bs, ldb = bt[:], 16
				}
				i := 0
				for ; i+4 <= m; i += 4 {
					if w == 16 {
						vec.Gemm4x16(x[i*k+k0:], k, bs, ldb, kc, y[i*ldy+j0:], ldy)
						continue
					}
					tile = [4 * 16]float32{}
					vec.Gemm4x16(x[i*k+k0:], k, bs, ldb, kc, tile[:], 16)
					for r := range 4 {
						row := y[(i+r)*ldy+j0 : (i+r)*ldy+j0+w]
						for c := range row {
							row[c] += tile[r*16+c]
						}
					}
				}
				for ; i < m; i++ {
					row := y[i*ldy+j0 : i*ldy+j0+w]
					for p := range kc {
						a := x[i*k+k0+p]
						if a == 0 {
							continue
						}
						br := bs[p*ldb : p*ldb+w]
						for c := range row {
							row[c] += a * br[c]
						}
					}
				}
			}
		}
	})
}
