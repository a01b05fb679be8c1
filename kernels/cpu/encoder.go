package cpu

import (
	"fmt"
	"math"
	"slices"

	"github.com/agemem/agemem/kernels"
)

// The forward ops of bidirectional encoders (BERT, RoBERTa) on float32
// slices, and the Backend methods over them.

// LayerNorm: y[r, :] = (x[r, :] − mean)/sqrt(var + eps)·w + b over rows of
// d = len(w).
func LayerNorm(y, x, w, b []float32, eps float32) {
	d := len(w)
	parallelFor(len(x)/d, 4*d, func(lo, hi int) {
		for r := lo; r < hi; r++ {
			LayerNormRow(y[r*d:(r+1)*d], nil, x[r*d:(r+1)*d], w, b, float64(eps))
		}
	})
}

// LayerNormRow normalises one row, the statistics accumulated in float64:
// y = x̂·w + b with x̂ = (x − mean)·rstd. It keeps x̂ in xhat (unless nil)
// and returns rstd = 1/sqrt(var + eps), what the backward needs.
func LayerNormRow[T Float](y, xhat, x, w, b []T, eps float64) T {
	var mean, v float64
	for _, e := range x {
		mean += float64(e)
	}
	mean /= float64(len(x))
	for _, e := range x {
		v += (float64(e) - mean) * (float64(e) - mean)
	}
	rs := 1 / math.Sqrt(v/float64(len(x))+eps)
	for i, e := range x {
		h := T((float64(e) - mean) * rs)
		if xhat != nil {
			xhat[i] = h
		}
		y[i] = h*w[i] + b[i]
	}
	return T(rs)
}

// GELUExact is x·Φ(x), Φ the standard normal CDF (BERT's "gelu").
func GELUExact(x float64) float64 { return 0.5 * x * (1 + math.Erf(x/math.Sqrt2)) }

// GELUTanh is the tanh approximation ("gelu_new", "gelu_pytorch_tanh").
func GELUTanh(x float64) float64 { return 0.5 * x * (1 + math.Tanh(GELUC*(x+0.044715*x*x*x))) }

// GELUC is √(2/π).
const GELUC = 0.7978845608028654

// GELU applies the exact or (tanh) approximate GELU elementwise.
func GELU(y, x []float32, tanh bool) {
	f := GELUExact
	if tanh {
		f = GELUTanh
	}
	parallelFor(len(x), 32, func(lo, hi int) {
		for i := lo; i < hi; i++ {
			y[i] = float32(f(float64(x[i])))
		}
	})
}

// SegmentMean: out[s, :] = the mean of x's rows [bounds[s], bounds[s+1]),
// rows of d.
func SegmentMean(out, x []float32, bounds []int, d int) {
	for s := range len(bounds) - 1 {
		o := out[s*d : (s+1)*d]
		clear(o)
		for r := bounds[s]; r < bounds[s+1]; r++ {
			Add(o, x[r*d:(r+1)*d])
		}
		inv := 1 / float32(bounds[s+1]-bounds[s])
		for i := range o {
			o[i] *= inv
		}
	}
}

// LayerNorm implements kernels.Backend.
func (*Backend) LayerNorm(y, x, w, b kernels.Tensor, eps float32) {
	LayerNorm(data(y), data(x), data(w), data(b), eps)
}

// GELU implements kernels.Backend.
func (*Backend) GELU(y, x kernels.Tensor, tanh bool) { GELU(data(y), data(x), tanh) }

// Tanh implements kernels.Backend.
func (*Backend) Tanh(y, x kernels.Tensor) {
	yd := data(y)
	for i, v := range data(x) {
		yd[i] = float32(math.Tanh(float64(v)))
	}
}

// SegmentAttention implements kernels.Backend.
func (*Backend) SegmentAttention(out, q, k, v kernels.Tensor, bounds []int, heads, hd int) {
	SegmentAttention(data(out), data(q), data(k), data(v), bounds, heads, hd)
}

// SegmentMean implements kernels.Backend.
func (*Backend) SegmentMean(out, x kernels.Tensor, bounds []int) {
	xt := host(x)
	SegmentMean(data(out), xt.Data, bounds, xt.Dims[len(xt.Dims)-1])
}

// TopK implements kernels.TopKer: every score by one product, then a sort
// of each query's row (the readable reference of the GPU's selection).
func (b *Backend) TopK(index, queries kernels.Tensor, k int) ([][]int, [][]float32, error) {
	it := host(index)
	n, d := it.Dims[0], it.Dims[len(it.Dims)-1]
	id, qd := data(index), data(queries)
	if k < 1 || k > kernels.MaxTopK {
		return nil, nil, fmt.Errorf("top-k: k = %d is outside [1, %d]", k, kernels.MaxTopK)
	}
	if qt := host(queries); qt.Dims[len(qt.Dims)-1] != d {
		return nil, nil, fmt.Errorf("top-k: queries have dimension %d, the index %d", qt.Dims[len(qt.Dims)-1], d)
	}
	q := len(qd) / d
	scores := make([]float32, q*n)
	MatMulT(scores, qd, id, nil, q, d, n)
	rows, scs := make([][]int, q), make([][]float32, q)
	order := make([]int, n)
	for i := range q {
		s := scores[i*n : (i+1)*n]
		for j := range order {
			order[j] = j
		}
		slices.SortFunc(order, func(a, b int) int {
			switch {
			case s[a] > s[b]:
				return -1
			case s[a] < s[b]:
				return 1
			}
			return a - b
		})
		for _, j := range order[:min(k, n)] {
			rows[i] = append(rows[i], j)
			scs[i] = append(scs[i], s[j])
		}
	}
	return rows, scs, nil
}

var _ kernels.TopKer = (*Backend)(nil)
