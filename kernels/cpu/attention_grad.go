package cpu

import "math"

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
	dqh, dkh, dvh := make([]float32, t*d), make([]float32, n*d), make([]float32, n*d)
	for g := range kvHeads {
		k, v := head(kc, n, kvHeads*d, g), head(vc, n, kvHeads*d, g)
		kT := transposeF32(k, n, d)
		for h := g * group; h < (g+1)*group; h++ {
			qh, doh := head(q, t, heads*d, h), head(dout, t, heads*d, h)
			MatMulT(s, qh, k, nil, t, d, n)
			MatMulT(dp, doh, v, nil, t, d, n)
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
			// dp now holds dS and s holds P.
			MatMulT(dqh, dp, kT, nil, t, n, d)
			scatterAdd(dq, t, heads*d, h, dqh)
			dsT, pT := transposeF32(dp, t, n), transposeF32(s, t, n)
			MatMulT(dkh, dsT, transposeF32(qh, t, d), nil, n, t, d)
			MatMulT(dvh, pT, transposeF32(doh, t, d), nil, n, t, d)
			scatterAdd(dkc, n, kvHeads*d, g, dkh)
			scatterAdd(dvc, n, kvHeads*d, g, dvh)
		}
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
		k := headRows(kc, n, kvHeads*d, g, d)
		vT := transposeF32(headRows(vc, n, kvHeads*d, g, d), n, d)
		for h := g * group; h < (g+1)*group; h++ {
			MatMulT(s, headRows(q, t, heads*d, h, d), k, nil, t, d, n)
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
	m := float32(math.Inf(-1))
	for j := 0; j <= last; j++ {
		row[j] *= scale
		m = max(m, row[j])
	}
	var z float32
	for j := 0; j <= last; j++ {
		row[j] = Exp32(row[j] - m)
		z += row[j]
	}
	for j := 0; j <= last; j++ {
		row[j] /= z
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

// transposeF32 returns the [c, r] transpose of a [r, c] matrix.
func transposeF32(a []float32, r, c int) []float32 {
	out := make([]float32, len(a))
	const blk = 32
	for i0 := 0; i0 < r; i0 += blk {
		for j0 := 0; j0 < c; j0 += blk {
			for i := i0; i < min(i0+blk, r); i++ {
				for j := j0; j < min(j0+blk, c); j++ {
					out[j*r+i] = a[i*c+j]
				}
			}
		}
	}
	return out
}

// Exp32 is e^x in float32 to about 2 ulp for x <= 0 (softmax arguments
// after the max is subtracted), several times faster than math.Exp:
// x = k·ln2 + r with |r| <= ln2/2 (k rounded to nearest), e^r by its degree-6 Taylor polynomial,
// then 2^k by the exponent bits.
func Exp32(x float32) float32 {
	if x < -87 {
		return 0
	}
	if x > 88 {
		return float32(math.Inf(1))
	}
	const ln2hi, ln2lo, log2e = 0.693145751953125, 1.428606765330187e-06, 1.4426950408889634
	// Adding and subtracting 1.5·2²³ rounds to the nearest integer.
	const round = 12582912
	k := (x*log2e + round) - round
	r := x - k*ln2hi - k*ln2lo
	p := 1 + r*(1+r*(0.5+r*(1.0/6+r*(1.0/24+r*(1.0/120+r*(1.0/720))))))
	return p * math.Float32frombits(uint32(int32(k)+127)<<23)
}
