package tape

import (
	"math"
	"math/rand/v2"

	"github.com/agemem/agemem/kernels/cpu"
)

// The ops of bidirectional encoders (BERT, RoBERTa) and of contrastive
// sentence-embedding losses. Each is written once over T, so float64 runs
// check the float32 ones; the attention's matrix products use the fast
// kernels for float32.

// LayerNorm normalises each row of x[t, d] to zero mean and unit variance
// and applies w and b [d].
func (t *Tape[T]) LayerNorm(x, w, b *Var[T], eps float64) *Var[T] {
	d := x.Cols
	check(len(w.Val) == d && len(b.Val) == d, "layernorm: x [%d, %d], weight %d, bias %d", x.Rows, d, len(w.Val), len(b.Val))
	y := t.out(x.Rows, d, x.Requires || w.Requires || b.Requires)
	xhat := make([]T, len(x.Val)) // kept for backward
	rstd := make([]T, x.Rows)
	for r := range x.Rows {
		rstd[r] = cpu.LayerNormRow(y.Val[r*d:(r+1)*d], xhat[r*d:(r+1)*d], x.Val[r*d:(r+1)*d], w.Val, b.Val, eps)
	}
	t.record(y, func() {
		if y.Grad == nil {
			return
		}
		dx, dw, db := t.gradIf(x), t.gradIf(w), t.gradIf(b)
		for r := range x.Rows {
			dy, h := y.Grad[r*d:(r+1)*d], xhat[r*d:(r+1)*d]
			// dx = rstd·(g − mean(g) − x̂·mean(g∘x̂)) with g = dy∘w.
			var mg, mgh float64
			for i := range d {
				g := float64(dy[i] * w.Val[i])
				mg += g
				mgh += g * float64(h[i])
				if dw != nil {
					dw[i] += dy[i] * h[i]
				}
				if db != nil {
					db[i] += dy[i]
				}
			}
			if dx == nil {
				continue
			}
			mg /= float64(d)
			mgh /= float64(d)
			for i := range d {
				g := float64(dy[i] * w.Val[i])
				dx[r*d+i] += T(float64(rstd[r]) * (g - mg - float64(h[i])*mgh))
			}
		}
	})
	return y
}

// GELU applies the Gaussian error linear unit: exact (erf) or, with tanh,
// the tanh approximation (gelu_new, gelu_pytorch_tanh).
func (t *Tape[T]) GELU(x *Var[T], tanh bool) *Var[T] {
	y := t.out(x.Rows, x.Cols, x.Requires)
	f, df := cpu.GELUExact, cpu.GELUExactGrad
	if tanh {
		f, df = cpu.GELUTanh, cpu.GELUTanhGrad
	}
	for i, v := range x.Val {
		y.Val[i] = T(f(float64(v)))
	}
	t.record(y, func() {
		if y.Grad == nil {
			return
		}
		g := t.grad(x)
		for i, d := range y.Grad {
			g[i] += d * T(df(float64(x.Val[i])))
		}
	})
	return y
}

// Tanh is the elementwise hyperbolic tangent (BERT's pooler).
func (t *Tape[T]) Tanh(x *Var[T]) *Var[T] {
	y := t.out(x.Rows, x.Cols, x.Requires)
	for i, v := range x.Val {
		y.Val[i] = T(math.Tanh(float64(v)))
	}
	t.record(y, func() {
		if y.Grad == nil {
			return
		}
		g := t.grad(x)
		for i, d := range y.Grad {
			g[i] += d * (1 - y.Val[i]*y.Val[i])
		}
	})
	return y
}

// BiAttention is bidirectional multi-head attention within each segment
// of packed rows (segments [Lo, Hi) tile the rows; Prefix must be 0):
// q, k, v, y [t, heads·hd]. Packing sequences end to end gives each the
// same result as a padded batch with a padding mask, with no work spent
// on padding. drop > 0 applies dropout to the attention probabilities
// (BERT's attention_probs_dropout_prob), masks drawn from seed.
func (t *Tape[T]) BiAttention(q, k, v *Var[T], segs []Segment, heads, hd int, drop float64, seed uint64) *Var[T] {
	w := heads * hd
	check(q.Cols == w && k.Cols == w && v.Cols == w && k.Rows == q.Rows && v.Rows == q.Rows,
		"biattention: q [%d, %d], k [%d, %d], v [%d, %d] for %d heads of %d", q.Rows, q.Cols, k.Rows, k.Cols, v.Rows, v.Cols, heads, hd)
	covered := 0
	for _, s := range segs {
		check(s.Lo == covered && s.Hi > s.Lo && s.Prefix == 0, "biattention: segments must tile the rows in order without prefixes, got %+v after row %d", s, covered)
		covered = s.Hi
	}
	check(covered == q.Rows, "biattention: segments cover %d of %d rows", covered, q.Rows)
	y := t.out(q.Rows, w, q.Requires || k.Requires || v.Requires)
	scale := 1 / math.Sqrt(float64(hd))
	// probs[s][h] keeps each segment's attention probabilities [n, n] and
	// dropped[s][h] them after dropout (the same slice without it).
	probs, dropped := make([][][]T, len(segs)), make([][][]T, len(segs))
	var r *rand.Rand
	if drop > 0 {
		r = rand.New(rand.NewPCG(seed, 0x61747464))
	}
	for si, s := range segs {
		n := s.Hi - s.Lo
		probs[si], dropped[si] = make([][]T, heads), make([][]T, heads)
		for h := range heads {
			qh, kh, vh := headOf(q.Val, s, h, w, hd), headOf(k.Val, s, h, w, hd), headOf(v.Val, s, h, w, hd)
			p := make([]T, n*n)
			matMulT(p, qh, kh, n, hd, n)
			for i := range n {
				softmaxRow(p[i*n:(i+1)*n], scale)
			}
			pd := p
			if r != nil {
				pd = make([]T, n*n)
				for i, e := range p {
					if r.Float64() >= drop {
						pd[i] = e / T(1-drop)
					}
				}
			}
			o := make([]T, n*hd)
			matMulNN(o, pd, vh, n, n, hd)
			putHead(y.Val, o, s, h, w, hd)
			probs[si][h], dropped[si][h] = p, pd
		}
	}
	t.record(y, func() {
		if y.Grad == nil {
			return
		}
		dq, dk, dv := t.gradIf(q), t.gradIf(k), t.gradIf(v)
		for si, s := range segs {
			n := s.Hi - s.Lo
			for h := range heads {
				p, pd := probs[si][h], dropped[si][h]
				qh, kh, vh := headOf(q.Val, s, h, w, hd), headOf(k.Val, s, h, w, hd), headOf(v.Val, s, h, w, hd)
				doh := headOf(y.Grad, s, h, w, hd)
				if dv != nil { // dV = P̃ᵀ dO, P̃ the probabilities after dropout
					g := make([]T, n*hd)
					matMulNN(g, transpose(pd, n, n), doh, n, n, hd)
					addHead(dv, g, s, h, w, hd)
				}
				if dq == nil && dk == nil {
					continue
				}
				// dP = (dO Vᵀ)∘mask/(1−drop); dS = P∘(dP − rowsum(P∘dP))·scale.
				ds := make([]T, n*n)
				matMulT(ds, doh, vh, n, hd, n)
				if r != nil {
					for i := range ds {
						if pd[i] == 0 && p[i] != 0 { // dropped
							ds[i] = 0
						} else {
							ds[i] /= T(1 - drop)
						}
					}
				}
				for i := range n {
					row, pr := ds[i*n:(i+1)*n], p[i*n:(i+1)*n]
					var dot T
					for j := range n {
						dot += pr[j] * row[j]
					}
					for j := range n {
						row[j] = pr[j] * (row[j] - dot) * T(scale)
					}
				}
				if dq != nil { // dQ = dS K
					g := make([]T, n*hd)
					matMulNN(g, ds, kh, n, n, hd)
					addHead(dq, g, s, h, w, hd)
				}
				if dk != nil { // dK = dSᵀ Q
					g := make([]T, n*hd)
					matMulNN(g, transpose(ds, n, n), qh, n, n, hd)
					addHead(dk, g, s, h, w, hd)
				}
			}
		}
	})
	return y
}

// headOf copies head h of the segment's rows into a contiguous [n, hd].
func headOf[T Float](x []T, s Segment, h, w, hd int) []T {
	n := s.Hi - s.Lo
	out := make([]T, n*hd)
	for r := range n {
		copy(out[r*hd:(r+1)*hd], x[(s.Lo+r)*w+h*hd:(s.Lo+r)*w+(h+1)*hd])
	}
	return out
}

func putHead[T Float](x, src []T, s Segment, h, w, hd int) {
	for r := range s.Hi - s.Lo {
		copy(x[(s.Lo+r)*w+h*hd:(s.Lo+r)*w+(h+1)*hd], src[r*hd:(r+1)*hd])
	}
}

func addHead[T Float](x, src []T, s Segment, h, w, hd int) {
	for r := range s.Hi - s.Lo {
		addTo(x[(s.Lo+r)*w+h*hd:(s.Lo+r)*w+(h+1)*hd], src[r*hd:(r+1)*hd])
	}
}

func softmaxRow[T Float](row []T, scale float64) {
	m := math.Inf(-1)
	for _, v := range row {
		m = math.Max(m, float64(v)*scale)
	}
	var sum float64
	for j, v := range row {
		e := math.Exp(float64(v)*scale - m)
		row[j] = T(e)
		sum += e
	}
	for j := range row {
		row[j] = T(float64(row[j]) / sum)
	}
}

// matMulT sets y[m, n] = x[m, k]·w[n, k]ᵀ.
func matMulT[T Float](y, x, w []T, m, k, n int) {
	if f, ok := f32(y, x, w); ok {
		cpu.MatMulT(f[0], f[1], f[2], nil, m, k, n)
		return
	}
	copy(y, cpu.MatMulTRef(x, w, nil, m, k, n))
}

// matMulNN sets y[m, n] = x[m, k]·b[k, n].
func matMulNN[T Float](y, x, b []T, m, k, n int) {
	if f, ok := f32(y, x, b); ok {
		clear(f[0])
		cpu.MatMulNNAdd(f[0], f[1], f[2], m, k, n)
		return
	}
	copy(y, cpu.MatMulTRef(x, transpose(b, k, n), nil, m, k, n))
}

func transpose[T Float](a []T, r, c int) []T {
	out := make([]T, len(a))
	for i := range r {
		for j := range c {
			out[j*r+i] = a[i*c+j]
		}
	}
	return out
}

// MeanPool averages the rows of each segment: y[len(segs), cols].
func (t *Tape[T]) MeanPool(x *Var[T], segs []Segment) *Var[T] {
	y := t.out(len(segs), x.Cols, x.Requires)
	c := x.Cols
	for i, s := range segs {
		check(s.Hi > s.Lo && s.Hi <= x.Rows, "meanpool: segment %+v outside %d rows", s, x.Rows)
		inv := 1 / T(s.Hi-s.Lo)
		for r := s.Lo; r < s.Hi; r++ {
			for j := range c {
				y.Val[i*c+j] += x.Val[r*c+j] * inv
			}
		}
	}
	t.record(y, func() {
		if y.Grad == nil {
			return
		}
		g := t.grad(x)
		for i, s := range segs {
			inv := 1 / T(s.Hi-s.Lo)
			for r := s.Lo; r < s.Hi; r++ {
				for j := range c {
					g[r*c+j] += y.Grad[i*c+j] * inv
				}
			}
		}
	})
	return y
}

// L2Normalize scales each row to unit length.
func (t *Tape[T]) L2Normalize(x *Var[T]) *Var[T] {
	y := t.out(x.Rows, x.Cols, x.Requires)
	c := x.Cols
	norms := make([]T, x.Rows)
	for r := range x.Rows {
		var s float64
		for _, v := range x.Val[r*c : (r+1)*c] {
			s += float64(v) * float64(v)
		}
		n := math.Max(math.Sqrt(s), 1e-12)
		norms[r] = T(n)
		for j, v := range x.Val[r*c : (r+1)*c] {
			y.Val[r*c+j] = T(float64(v) / n)
		}
	}
	t.record(y, func() {
		if y.Grad == nil {
			return
		}
		g := t.grad(x)
		// dx = (dy − y·(y·dy)) / ‖x‖
		for r := range x.Rows {
			yr, dy := y.Val[r*c:(r+1)*c], y.Grad[r*c:(r+1)*c]
			var dot T
			for j := range c {
				dot += yr[j] * dy[j]
			}
			for j := range c {
				g[r*c+j] += (dy[j] - yr[j]*dot) / norms[r]
			}
		}
	})
	return y
}
