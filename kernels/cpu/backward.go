package cpu

import (
	"math"

	"github.com/agemem/agemem/kernels/vec"
)

// Backward kernels: for each forward op, the gradients of a scalar loss with
// respect to its inputs, given the gradient dy of its output. Gradients are
// accumulated (+=) into the d* slices, so one tensor used twice sums both
// contributions. They are generic over float32 (training) and float64 (the
// finite-difference checks in the tests).

// Float is the element type of the backward kernels.
type Float interface{ float32 | float64 }

// MatMulTBackward: for y[m,n] = x[m,k]·w[n,k]ᵀ + b[n],
// dx[m,k] += dy·w, dw[n,k] += dyᵀ·x, db[n] += Σ_m dy. Any of dx, dw, db
// may be nil.
func MatMulTBackward[T Float](dx, dw, db, dy, x, w []T, m, k, n int) {
	if dx != nil {
		parallelFor(m, n*k, func(lo, hi int) {
			for i := lo; i < hi; i++ {
				row := dx[i*k : (i+1)*k]
				for j := range n {
					g := dy[i*n+j]
					if g == 0 {
						continue
					}
					wr := w[j*k : (j+1)*k]
					for c := range row {
						row[c] += g * wr[c]
					}
				}
			}
		})
	}
	if dw != nil {
		parallelFor(n, m*k, func(lo, hi int) {
			for j := lo; j < hi; j++ {
				row := dw[j*k : (j+1)*k]
				for i := range m {
					g := dy[i*n+j]
					if g == 0 {
						continue
					}
					xr := x[i*k : (i+1)*k]
					for c := range row {
						row[c] += g * xr[c]
					}
				}
			}
		})
	}
	if db != nil {
		for i := range m {
			for j := range n {
				db[j] += dy[i*n+j]
			}
		}
	}
}

// RMSNormBackward: for y = x·r·w with r = (mean(x²)+eps)^(-1/2) per row of d,
// dx = r·(dy∘w) − x·r³/d·Σ(dy∘w∘x), dw += Σ_rows dy∘x·r.
func RMSNormBackward[T Float](dx, dw, dy, x, w []T, d int, eps T) {
	for r := 0; r < len(x)/d; r++ {
		xr, gr := x[r*d:(r+1)*d], dy[r*d:(r+1)*d]
		var ss, dot float64
		for i, v := range xr {
			ss += float64(v) * float64(v)
			dot += float64(gr[i]) * float64(w[i]) * float64(v)
		}
		inv := 1 / math.Sqrt(ss/float64(d)+float64(eps))
		c := dot * inv * inv * inv / float64(d)
		for i, v := range xr {
			if dx != nil {
				dx[r*d+i] += T(float64(gr[i])*float64(w[i])*inv - float64(v)*c)
			}
			if dw != nil {
				dw[i] += T(float64(gr[i]) * float64(v) * inv)
			}
		}
	}
}

// RopeBackward: rotation is orthogonal, so dx is dy rotated by the
// opposite angle. In place on dy (which becomes dx), shapes as Rope.
func RopeBackward[T Float](dy []T, pos []int, heads, headDim int, theta float64) {
	half := headDim / 2
	inv := make([]float64, half)
	for i := range inv {
		inv[i] = math.Pow(theta, -2*float64(i)/float64(headDim))
	}
	c, s := make([]T, half), make([]T, half)
	for t, p := range pos {
		for i, f := range inv {
			a := float64(p) * f
			c[i], s[i] = T(math.Cos(a)), T(math.Sin(a))
		}
		for h := range heads {
			v := dy[(t*heads+h)*headDim : (t*heads+h+1)*headDim]
			for i := range half {
				x0, x1 := v[i], v[i+half]
				v[i] = x0*c[i] + x1*s[i]
				v[i+half] = x1*c[i] - x0*s[i]
			}
		}
	}
}

// SiLUMulBackward: for out = silu(g)·u, dg += dy·u·σ(g)(1 + g(1−σ(g))),
// du += dy·silu(g).
func SiLUMulBackward[T Float](dg, du, dy, g, u []T) {
	if g32, ok := any(g).([]float32); ok {
		d32, _ := any(dg).([]float32)
		u32, _ := any(du).([]float32)
		siluMulBackward32(d32, u32, any(dy).([]float32), g32, any(u).([]float32))
		return
	}
	for i, gv := range g {
		s := 1 / (1 + math.Exp(-float64(gv)))
		if dg != nil {
			dg[i] += T(float64(dy[i]) * float64(u[i]) * s * (1 + float64(gv)*(1-s)))
		}
		if du != nil {
			du[i] += T(float64(dy[i]) * float64(gv) * s)
		}
	}
}

// siluMulBackward32 is SiLUMulBackward in float32 with the vector
// exponential, in parallel chunks.
func siluMulBackward32(dg, du, dy, g, u []float32) {
	parallelFor(len(g), 12, func(lo, hi int) {
		var sb [siluChunk]float32
		for c := lo; c < hi; c += siluChunk {
			gc := g[c:min(c+siluChunk, hi)]
			s := sb[:len(gc)]
			sigmoid(s, gc)
			for i, gv := range gc {
				j := c + i
				if dg != nil {
					dg[j] += dy[j] * u[j] * s[i] * (1 + gv*(1-s[i]))
				}
				if du != nil {
					du[j] += dy[j] * gv * s[i]
				}
			}
		}
	})
}

// EmbeddingBackward scatters dy[i, :] into dtable[ids[i], :].
func EmbeddingBackward[T Float](dtable, dy []T, ids []int, d int) {
	for i, id := range ids {
		row := dtable[id*d : (id+1)*d]
		for c, g := range dy[i*d : (i+1)*d] {
			row[c] += g
		}
	}
}

// LogProbGather returns, for logits[t, v] and targets[t], the log-softmax
// value of each target token: the token log-probabilities GRPO's ratio and
// the SFT loss use. targets[i] < 0 skips row i (its result is 0).
func LogProbGather[T Float](logits []T, targets []int, v int) []T {
	out := make([]T, len(targets))
	parallelFor(len(targets), 4*v, func(lo, hi int) {
		var buf []float32
		for i := lo; i < hi; i++ {
			tok := targets[i]
			if tok < 0 {
				continue
			}
			row := logits[i*v : (i+1)*v]
			lse, _, _ := rowLogSumExp(row, &buf)
			out[i] = row[tok] - lse
		}
	})
	return out
}

// LogProbGatherBackward: for out[i] = logits[i, tok] − logsumexp(logits[i]),
// dlogits[i, :] += dout[i]·(onehot(tok) − softmax(logits[i])).
func LogProbGatherBackward[T Float](dlogits, dout, logits []T, targets []int, v int) {
	parallelFor(len(targets), 6*v, func(lo, hi int) {
		var buf []float32
		for i := lo; i < hi; i++ {
			tok := targets[i]
			if tok < 0 || dout[i] == 0 {
				continue
			}
			row := logits[i*v : (i+1)*v]
			lse, e, sum := rowLogSumExp(row, &buf)
			g := dout[i]
			d := dlogits[i*v : (i+1)*v]
			if e != nil {
				// The softmax is e/Σe: a multiply a column, not an exponential.
				s := g / T(sum)
				for j, x := range e {
					d[j] -= s * T(x)
				}
			} else {
				for j, x := range row {
					d[j] -= g * T(math.Exp(float64(x-lse)))
				}
			}
			d[tok] += g
		}
	})
}

// rowLogSumExp is log Σ exp(row). A float32 row is exponentiated by the
// vector kernel into *buf, which it also returns with its sum (exp(x −
// max): the softmax is e/sum); a float64 row (the finite-difference
// checks) is summed in float64 and no e is returned.
func rowLogSumExp[T Float](row []T, buf *[]float32) (lse T, e []float32, sum float32) {
	m := maxOf(row)
	if r32, ok := any(row).([]float32); ok {
		if cap(*buf) < len(r32) {
			*buf = make([]float32, len(r32))
		}
		e = (*buf)[:len(r32)]
		copy(e, r32)
		sum = vec.ExpSub(e, float32(m))
		return T(float64(m) + math.Log(float64(sum))), e, sum
	}
	var s float64
	for _, x := range row {
		s += math.Exp(float64(x) - float64(m))
	}
	return T(float64(m) + math.Log(s)), nil, 0
}

func maxOf[T Float](row []T) T {
	m := row[0]
	for _, x := range row[1:] {
		m = max(m, x)
	}
	return m
}

// AttentionBackward is the gradient of Attention (causal GQA over a cache,
// optional mask). q, out [t, heads, d]; kc, vc [maxT, kvHeads, d] hold
// positions 0..start+t-1. It recomputes the attention probabilities and
// accumulates dq, dkc, dvc (cache-shaped, so gradients reach every key and
// value the queries saw).
func AttentionBackward[T Float](dq, dkc, dvc, dout, q, kc, vc []T, valid []bool, t, start, heads, kvHeads, d int) {
	group := heads / kvHeads
	scale := 1 / math.Sqrt(float64(d))
	total := start + t
	// Parallel over key/value heads: each writes its own columns of dkc
	// and dvc and its own query heads of dq.
	parallelFor(kvHeads, t*total*d*group, func(lo, hi int) {
		p := make([]float64, total)
		dp := make([]float64, total)
		for kvh := lo; kvh < hi; kvh++ {
			attentionBackwardHead(dq, dkc, dvc, dout, q, kc, vc, valid, p, dp, t, start, heads, kvHeads, d, kvh, scale)
		}
	})
}

func attentionBackwardHead[T Float](dq, dkc, dvc, dout, q, kc, vc []T, valid []bool, p, dp []float64, t, start, heads, kvHeads, d, kvh int, scale float64) {
	group := heads / kvHeads
	for i := range t {
		for h := kvh * group; h < (kvh+1)*group; h++ {
			qv := q[(i*heads+h)*d : (i*heads+h+1)*d]
			gv := dout[(i*heads+h)*d : (i*heads+h+1)*d]
			n := start + i + 1
			m := math.Inf(-1)
			for j := range n {
				p[j] = math.Inf(-1)
				if valid != nil && !valid[j] {
					continue
				}
				var s float64
				kv := kc[(j*kvHeads+kvh)*d : (j*kvHeads+kvh+1)*d]
				for x := range d {
					s += float64(qv[x]) * float64(kv[x])
				}
				p[j] = s * scale
				m = math.Max(m, p[j])
			}
			if math.IsInf(m, -1) {
				continue // every key masked: the output was constant zero
			}
			var z float64
			for j := range n {
				p[j] = math.Exp(p[j] - m)
				z += p[j]
			}
			// dp_j = dout·v_j; ds_j = p_j (dp_j − Σ p dp).
			var pdp float64
			for j := range n {
				p[j] /= z
				if p[j] == 0 {
					dp[j] = 0
					continue
				}
				vv := vc[(j*kvHeads+kvh)*d : (j*kvHeads+kvh+1)*d]
				var s float64
				for x := range d {
					s += float64(gv[x]) * float64(vv[x])
				}
				dp[j] = s
				pdp += p[j] * s
				dvv := dvc[(j*kvHeads+kvh)*d : (j*kvHeads+kvh+1)*d]
				for x := range d {
					dvv[x] += T(p[j] * float64(gv[x]))
				}
			}
			dqv := dq[(i*heads+h)*d : (i*heads+h+1)*d]
			for j := range n {
				if p[j] == 0 {
					continue
				}
				ds := p[j] * (dp[j] - pdp) * scale
				kv := kc[(j*kvHeads+kvh)*d : (j*kvHeads+kvh+1)*d]
				dkv := dkc[(j*kvHeads+kvh)*d : (j*kvHeads+kvh+1)*d]
				for x := range d {
					dqv[x] += T(ds * float64(kv[x]))
					dkv[x] += T(ds * float64(qv[x]))
				}
			}
		}
	}
}
