package cpu

import (
	"math"

	"github.com/agemem/agemem/kernels/vec"
)

// AttentionBackwardMatMul is AttentionBackward for float32 without a mask,
// written as matrix products per head so that the tiled matmul does the
// work (the plain version's per-key loops are three quarters of a training
// step otherwise). Per head h over its kv head g, with Q [t, d], K and
// V [n, d] (n = start + t), dO [t, d]:
//
//	P  = softmax(Q Kᵀ / √d, causal)      dP = dO Vᵀ
//	dS = P ∘ (dP − rowsum(P ∘ dP)) / √d
//	dQ = dS K     dK += dSᵀ Q     dV += Pᵀ dO
//
// Shapes and accumulation as AttentionBackward.
func AttentionBackwardMatMul(dq, dkc, dvc, dout, q, kc, vc []float32, t, start, heads, kvHeads, d int) {
	n := start + t
	group := heads / kvHeads
	scale := float32(1 / math.Sqrt(float64(d)))
	head := func(src []float32, rows, stride, h int) []float32 { return headRows(src, rows, stride, h, d) }
	scatterAdd := func(dst []float32, rows, stride, h int, src []float32) {
		for r := range rows {
			row := dst[r*stride+h*d : r*stride+(h+1)*d]
			for c, v := range src[r*d : (r+1)*d] {
				row[c] += v
			}
		}
	}
	s, dp := make([]float32, t*n), make([]float32, t*n)
	dqh, dkT, dvT := make([]float32, t*d), make([]float32, d*n), make([]float32, d*n)
	for g := range kvHeads {
		kT := Transpose(head(kc, n, kvHeads*d, g), n, d)
		vT := Transpose(head(vc, n, kvHeads*d, g), n, d)
		clear(dkT)
		clear(dvT)
		for h := g * group; h < (g+1)*group; h++ {
			qh, doh := head(q, t, heads*d, h), head(dout, t, heads*d, h)
			clear(s)
			clear(dp)
			MatMulNNAdd(s, qh, kT, t, d, n)
			MatMulNNAdd(dp, doh, vT, t, d, n)
			parallelFor(t, n, func(lo, hi int) {
				for i := lo; i < hi; i++ {
					row, drow := s[i*n:(i+1)*n], dp[i*n:(i+1)*n]
					last := start + i // causal: keys 0..start+i
					softmaxCausal(row, last, scale)
					var pdp float32
					for j := 0; j <= last; j++ {
						pdp += row[j] * drow[j]
					}
					for j := 0; j <= last; j++ {
						drow[j] = row[j] * (drow[j] - pdp) * scale
					}
					clear(drow[last+1:])
				}
			})
			// dp now holds dS and s holds P. dQ = dS K; the key and value
			// gradients are formed transposed (dKᵀ = Qᵀ dS, dVᵀ = dOᵀ P) so
			// no t×n matrix is ever transposed.
			MatMulT(dqh, dp, kT, nil, t, n, d)
			scatterAdd(dq, t, heads*d, h, dqh)
			MatMulNNAdd(dkT, Transpose(qh, t, d), dp, d, t, n)
			MatMulNNAdd(dvT, Transpose(doh, t, d), s, d, t, n)
		}
		scatterAdd(dkc, n, kvHeads*d, g, Transpose(dkT, d, n))
		scatterAdd(dvc, n, kvHeads*d, g, Transpose(dvT, d, n))
	}
}

// AttentionMatMul is Attention without a mask as matrix products per head
// (S = Q Kᵀ/√d, causal softmax, O = P V): the same result, faster for the
// long blocks of training where every query of a segment is known at once.
func AttentionMatMul(out, q, kc, vc []float32, t, start, heads, kvHeads, d int) {
	n := start + t
	group := heads / kvHeads
	scale := float32(1 / math.Sqrt(float64(d)))
	s, oh := make([]float32, t*n), make([]float32, t*d)
	for g := range kvHeads {
		kT := Transpose(headRows(kc, n, kvHeads*d, g, d), n, d)
		vT := Transpose(headRows(vc, n, kvHeads*d, g, d), n, d)
		for h := g * group; h < (g+1)*group; h++ {
			clear(s)
			MatMulNNAdd(s, headRows(q, t, heads*d, h, d), kT, t, d, n)
			parallelFor(t, n, func(lo, hi int) {
				for i := lo; i < hi; i++ {
					softmaxCausal(s[i*n:(i+1)*n], start+i, scale)
				}
			})
			MatMulT(oh, s, vT, nil, t, n, d)
			for r := range t {
				copy(out[r*heads*d+h*d:r*heads*d+(h+1)*d], oh[r*d:(r+1)*d])
			}
		}
	}
}

// softmaxCausal turns row[0..last] into softmax(scale·row) and zeroes the
// keys after last.
func softmaxCausal(row []float32, last int, scale float32) {
	r := row[:last+1]
	m := float32(math.Inf(-1))
	for j, v := range r {
		r[j] = v * scale
		m = max(m, r[j])
	}
	inv := 1 / vec.ExpSub(r, m)
	for j := range r {
		r[j] *= inv
	}
	clear(row[last+1:])
}

// headRows copies head h (width d) out of rows of the given stride.
func headRows(src []float32, rows, stride, h, d int) []float32 {
	out := make([]float32, rows*d)
	for r := range rows {
		copy(out[r*d:(r+1)*d], src[r*stride+h*d:r*stride+(h+1)*d])
	}
	return out
}

// Transpose returns the [c, r] transpose of a [r, c] matrix.
func Transpose(a []float32, r, c int) []float32 {
	out := make([]float32, len(a))
	const blk = 32
	// Blocks of rows in parallel: each writes its own columns of out.
	parallelFor((r+blk-1)/blk, blk*c, func(lo, hi int) {
		for i0 := lo * blk; i0 < min(hi*blk, r); i0 += blk {
			for j0 := 0; j0 < c; j0 += blk {
				for i := i0; i < min(i0+blk, r); i++ {
					for j := j0; j < min(j0+blk, c); j++ {
						out[j*r+i] = a[i*c+j]
					}
				}
			}
		}
	})
	return out
}
