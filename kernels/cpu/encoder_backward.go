package cpu

import (
	"math"

	"github.com/agemem/agemem/kernels"
	"github.com/agemem/agemem/kernels/vec"
)

// The backward ops of bidirectional encoders (kernels.EncoderTrainer):
// what SimCSE's training step runs where the weights live. The tape's
// encoder ops (model/tape) are the reference they are held to.

// GELUExactGrad is the derivative of GELUExact.
func GELUExactGrad(x float64) float64 {
	return 0.5*(1+math.Erf(x/math.Sqrt2)) + x*math.Exp(-x*x/2)/math.Sqrt(2*math.Pi)
}

// GELUTanhGrad is the derivative of GELUTanh.
func GELUTanhGrad(x float64) float64 {
	u := GELUC * (x + 0.044715*x*x*x)
	th := math.Tanh(u)
	return 0.5*(1+th) + 0.5*x*(1-th*th)*GELUC*(1+3*0.044715*x*x)
}

// LayerNormBackward implements kernels.EncoderTrainer:
// dx = rstd·(g − mean(g) − x̂·mean(g∘x̂)) with g = dy∘w, dw += Σ dy∘x̂,
// db += Σ dy. dw and db are summed row by row in order (the same bits on
// any number of cores).
func (*Backend) LayerNormBackward(dx, dw, db, dy, x, w kernels.Tensor, eps float32) {
	wd, xd, gd := data(w), data(x), data(dy)
	d := len(wd)
	rows := len(xd) / d
	xhat := make([]float32, len(xd))
	rstd := make([]float32, rows)
	parallelFor(rows, 4*d, func(lo, hi int) {
		y := make([]float32, d)
		zero := make([]float32, d)
		for r := lo; r < hi; r++ {
			rstd[r] = LayerNormRow(y, xhat[r*d:(r+1)*d], xd[r*d:(r+1)*d], wd, zero, float64(eps))
		}
	})
	if dx != nil {
		dxd := data(dx)
		parallelFor(rows, 4*d, func(lo, hi int) {
			for r := lo; r < hi; r++ {
				g, h := gd[r*d:(r+1)*d], xhat[r*d:(r+1)*d]
				var mg, mgh float64
				for i := range d {
					gi := float64(g[i] * wd[i])
					mg += gi
					mgh += gi * float64(h[i])
				}
				mg /= float64(d)
				mgh /= float64(d)
				for i := range d {
					gi := float64(g[i] * wd[i])
					dxd[r*d+i] += float32(float64(rstd[r]) * (gi - mg - float64(h[i])*mgh))
				}
			}
		})
	}
	if dw != nil || db != nil {
		var dwd, dbd []float32
		if dw != nil {
			dwd = data(dw)
		}
		if db != nil {
			dbd = data(db)
		}
		for r := range rows {
			g, h := gd[r*d:(r+1)*d], xhat[r*d:(r+1)*d]
			for i := range d {
				if dwd != nil {
					dwd[i] += g[i] * h[i]
				}
				if dbd != nil {
					dbd[i] += g[i]
				}
			}
		}
	}
}

// GELUBackward implements kernels.EncoderTrainer.
func (*Backend) GELUBackward(dx, dy, x kernels.Tensor, tanh bool) {
	df := GELUExactGrad
	if tanh {
		df = GELUTanhGrad
	}
	dxd, gd, xd := data(dx), data(dy), data(x)
	parallelFor(len(xd), 32, func(lo, hi int) {
		for i := lo; i < hi; i++ {
			dxd[i] += gd[i] * float32(df(float64(xd[i])))
		}
	})
}

// TanhBackward implements kernels.EncoderTrainer.
func (*Backend) TanhBackward(dx, dy, y kernels.Tensor) {
	dxd, gd, yd := data(dx), data(dy), data(y)
	for i, v := range yd {
		dxd[i] += gd[i] * (1 - v*v)
	}
}

// SegmentMeanBackward implements kernels.EncoderTrainer.
func (*Backend) SegmentMeanBackward(dx, dy kernels.Tensor, bounds []int) {
	xt := host(dx)
	d := xt.Dims[len(xt.Dims)-1]
	gd := data(dy)
	for s := range len(bounds) - 1 {
		inv := 1 / float32(bounds[s+1]-bounds[s])
		g := gd[s*d : (s+1)*d]
		for r := bounds[s]; r < bounds[s+1]; r++ {
			row := xt.Data[r*d : (r+1)*d]
			for i, v := range g {
				row[i] += v * inv
			}
		}
	}
}

// SegmentAttentionDropout implements kernels.EncoderTrainer.
func (b *Backend) SegmentAttentionDropout(out, q, k, v kernels.Tensor, bounds []int, heads, hd int, p float64, seed uint64) {
	if p <= 0 {
		b.SegmentAttention(out, q, k, v, bounds, heads, hd)
		return
	}
	od := data(out)
	segmentHeads(data(q), data(k), data(v), bounds, heads, hd, p, seed, func(i, h int, probs []float32, lo int, vd []float32) {
		o := od[(i*heads+h)*hd : (i*heads+h+1)*hd]
		clear(o)
		for jj, pr := range probs {
			if pr != 0 {
				vec.Axpy(o, vd[((lo+jj)*heads+h)*hd:((lo+jj)*heads+h+1)*hd], pr)
			}
		}
	})
}

// SegmentAttentionBackward implements kernels.EncoderTrainer. With P the
// probabilities and c_j the dropout factor (keep/(1−p), or 1):
// dP_j = c_j·dout·v_j, dS_j = P_j·(dP_j − Σ_k P_k·dP_k),
// dq += scale·Σ_j dS_j·k_j, dk_j += scale·dS_j·q, dv_j += P_j·c_j·dout.
// Work is split by (segment, head), so each worker owns the dk and dv rows
// it adds to.
func (*Backend) SegmentAttentionBackward(dq, dk, dv, dout, q, k, v kernels.Tensor, bounds []int, heads, hd int, p float64, seed uint64) {
	qd, kd, vd, gd := data(q), data(k), data(v), data(dout)
	var dqd, dkd, dvd []float32
	if dq != nil {
		dqd = data(dq)
	}
	if dk != nil {
		dkd = data(dk)
	}
	if dv != nil {
		dvd = data(dv)
	}
	t := bounds[len(bounds)-1]
	scale := float32(1 / math.Sqrt(float64(hd)))
	thr, inv := kernels.DropoutThreshold(p), float32(1/(1-p))
	segs := len(bounds) - 1
	parallelFor(segs*heads, 64*hd, func(lo, hi int) {
		var probs, dp []float32
		for sh := lo; sh < hi; sh++ {
			s, h := sh/heads, sh%heads
			j0, j1 := bounds[s], bounds[s+1]
			n := j1 - j0
			probs, dp = growTo(probs, n), growTo(dp, n)
			for i := j0; i < j1; i++ {
				row := func(x []float32, r int) []float32 { return x[(r*heads+h)*hd : (r*heads+h+1)*hd] }
				qi, gi := row(qd, i), row(gd, i)
				softmaxScores(probs, qi, kd, j0, heads, h, hd, scale)
				var dsum float32
				for jj := range n {
					c := float32(1)
					if p > 0 {
						c = 0
						if kernels.DropoutBits(seed, kernels.AttentionDropoutCounter(i, h, j0+jj, heads, t)) >= thr {
							c = inv
						}
					}
					dp[jj] = c * vec.Dot(gi, row(vd, j0+jj))
					dsum += probs[jj] * dp[jj]
					if dvd != nil && c != 0 {
						vec.Axpy(row(dvd, j0+jj), gi, probs[jj]*c)
					}
				}
				for jj := range n {
					ds := probs[jj] * (dp[jj] - dsum) * scale
					if ds == 0 {
						continue
					}
					if dqd != nil {
						vec.Axpy(row(dqd, i), row(kd, j0+jj), ds)
					}
					if dkd != nil {
						vec.Axpy(row(dkd, j0+jj), qi, ds)
					}
				}
			}
		}
	})
}

// segmentHeads calls f for every query row and head with the row's
// attention probabilities over its segment (after dropout, scaled), lo
// being the segment's first row.
func segmentHeads(qd, kd, vd []float32, bounds []int, heads, hd int, p float64, seed uint64, f func(i, h int, probs []float32, lo int, vd []float32)) {
	t := bounds[len(bounds)-1]
	scale := float32(1 / math.Sqrt(float64(hd)))
	thr, inv := kernels.DropoutThreshold(p), float32(1/(1-p))
	segs := len(bounds) - 1
	parallelFor(segs*heads, 64*hd, func(lo, hi int) {
		var probs []float32
		for sh := lo; sh < hi; sh++ {
			s, h := sh/heads, sh%heads
			j0, j1 := bounds[s], bounds[s+1]
			probs = growTo(probs, j1-j0)
			for i := j0; i < j1; i++ {
				softmaxScores(probs, qd[(i*heads+h)*hd:(i*heads+h+1)*hd], kd, j0, heads, h, hd, scale)
				for jj := range probs {
					if kernels.DropoutBits(seed, kernels.AttentionDropoutCounter(i, h, j0+jj, heads, t)) >= thr {
						probs[jj] *= inv
					} else {
						probs[jj] = 0
					}
				}
				f(i, h, probs, j0, vd)
			}
		}
	})
}

// softmaxScores sets probs to softmax(scale·q·k_j) over key rows
// j0 … j0+len(probs)−1, head h.
func softmaxScores(probs, qi, kd []float32, j0, heads, h, hd int, scale float32) {
	for jj := range probs {
		r := j0 + jj
		probs[jj] = vec.Dot(qi, kd[(r*heads+h)*hd:(r*heads+h+1)*hd]) * scale
	}
	Softmax(probs)
}

// growTo returns s resized to n, reallocated only when it must grow.
func growTo(s []float32, n int) []float32 {
	if cap(s) < n {
		return make([]float32, n)
	}
	return s[:n]
}

var _ kernels.EncoderTrainer = (*Backend)(nil)
