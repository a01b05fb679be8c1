package cpu

import (
	"math"

	"github.com/agemem/agemem/kernels/vec"
)

// attnBlock is how many query rows the matmul forms of attention take at
// a time: rows r0..r1 see keys 0..start+r1 only, so the product skips the
// causal mask's upper triangle (half of a training sequence's scores)
// except within the block's own diagonal.
var attnBlock = 64 // a variable so the benchmark can run its anchor, whole products

// AttentionBackwardMatMul is AttentionBackward for float32 without a mask,
// written as matrix products per head so that the tiled matmul does the
// work (the plain version's per-key loops are three quarters of a training
// step otherwise), a block of attnBlock query rows at a time over the keys
// they see. Per head h over its kv head g, with Q [t, d], K and V [n, d]
// (n = start + t), dO [t, d]:
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
	bmax := min(attnBlock, t)
	s, dp := make([]float32, bmax*n), make([]float32, bmax*n)
	dqh, dkT, dvT := make([]float32, t*d), make([]float32, d*n), make([]float32, d*n)
	for g := range kvHeads {
		kT := Transpose(head(kc, n, kvHeads*d, g), n, d)
		vT := Transpose(head(vc, n, kvHeads*d, g), n, d)
		clear(dkT)
		clear(dvT)
		for h := g * group; h < (g+1)*group; h++ {
			qh, doh := head(q, t, heads*d, h), head(dout, t, heads*d, h)
			for r0 := 0; r0 < t; r0 += attnBlock {
				r1 := min(r0+attnBlock, t)
				bt, nb := r1-r0, start+r1
				sb, db := s[:bt*nb], dp[:bt*nb]
				clear(sb)
				clear(db)
				matMulNNAdd(sb, nb, qh[r0*d:r1*d], kT, n, bt, d, nb)
				matMulNNAdd(db, nb, doh[r0*d:r1*d], vT, n, bt, d, nb)
				parallelFor(bt, nb, func(lo, hi int) {
					for i := lo; i < hi; i++ {
						row, drow := sb[i*nb:(i+1)*nb], db[i*nb:(i+1)*nb]
						last := start + r0 + i // causal: keys 0..start+r0+i
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
				// db now holds dS and sb holds P. dQ = dS K; the key and
				// value gradients are formed transposed (dKᵀ = Qᵀ dS,
				// dVᵀ = dOᵀ P) so no bt×nb matrix is ever transposed.
				matMulRows(dqh[r0*d:r1*d], db, kT, n, bt, nb, d)
				matMulNNAdd(dkT, n, Transpose(qh[r0*d:r1*d], bt, d), db, nb, d, bt, nb)
				matMulNNAdd(dvT, n, Transpose(doh[r0*d:r1*d], bt, d), sb, nb, d, bt, nb)
			}
			scatterAdd(dq, t, heads*d, h, dqh)
		}
		scatterAdd(dkc, n, kvHeads*d, g, Transpose(dkT, d, n))
		scatterAdd(dvc, n, kvHeads*d, g, Transpose(dvT, d, n))
	}
}

// matMulRows is y[m,n] = x[m,k]·wᵀ where w's n rows are the first k
// values of rows ldw apart (MatMulT on the first k columns of a wider w).
func matMulRows(y, x, w []float32, ldw, m, k, n int) {
	matMulTiled(y, x, nil, m, k, n, func(j0, _, k0, _ int, _ []float32) ([]float32, int) {
		return w[j0*ldw+k0:], ldw
	})
}

// AttentionMatMul is Attention without a mask as matrix products per head
// (S = Q Kᵀ/√d, causal softmax, O = P V), a block of attnBlock query rows
// at a time over the keys they see: the same result, faster for the long
// blocks of training where every query of a segment is known at once.
func AttentionMatMul(out, q, kc, vc []float32, t, start, heads, kvHeads, d int) {
	n := start + t
	group := heads / kvHeads
	scale := float32(1 / math.Sqrt(float64(d)))
	s, oh := make([]float32, min(attnBlock, t)*n), make([]float32, t*d)
	for g := range kvHeads {
		kT := Transpose(headRows(kc, n, kvHeads*d, g, d), n, d)
		vT := Transpose(headRows(vc, n, kvHeads*d, g, d), n, d)
		for h := g * group; h < (g+1)*group; h++ {
			qh := headRows(q, t, heads*d, h, d)
			for r0 := 0; r0 < t; r0 += attnBlock {
				r1 := min(r0+attnBlock, t)
				bt, nb := r1-r0, start+r1
				sb := s[:bt*nb]
				clear(sb)
				matMulNNAdd(sb, nb, qh[r0*d:r1*d], kT, n, bt, d, nb)
				parallelFor(bt, nb, func(lo, hi int) {
					for i := lo; i < hi; i++ {
						softmaxCausal(sb[i*nb:(i+1)*nb], start+r0+i, scale)
					}
				})
				matMulRows(oh[r0*d:r1*d], sb, vT, n, bt, nb, d)
			}
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
	m := vec.ScaleMax(r, scale)
	vec.Scale(r, 1/vec.ExpSub(r, m))
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
