package tape

import (
	"github.com/agemem/agemem/kernels"
	"github.com/agemem/agemem/kernels/cpu"
)

// f32 returns the float32 views of slices when T is float32: the ops then
// run the fast kernels; for float64 they run the reference ones.
func f32[T Float](s ...[]T) ([][]float32, bool) {
	if _, ok := any(s[0]).([]float32); !ok {
		return nil, false
	}
	out := make([][]float32, len(s))
	for i, v := range s {
		if v != nil {
			out[i] = any(v).([]float32)
		}
	}
	return out, true
}

// Embedding gathers table rows: y[i, :] = table[ids[i], :].
func (t *Tape[T]) Embedding(table *Var[T], ids []int) *Var[T] {
	d := table.Cols
	y := t.out(len(ids), d, table.Requires)
	for i, id := range ids {
		check(id >= 0 && id < table.Rows, "token id %d outside the vocabulary of %d", id, table.Rows)
		copy(y.Val[i*d:(i+1)*d], table.Val[id*d:(id+1)*d])
	}
	t.record(y, func() {
		if y.Grad != nil {
			cpu.EmbeddingBackward(t.grad(table), y.Grad, ids, d)
		}
	})
	return y
}

// Linear is y[m, n] = x[m, k]·w[n, k]ᵀ + b[n] (b may be nil), PyTorch's
// weight layout.
func (t *Tape[T]) Linear(x, w, b *Var[T]) *Var[T] {
	m, k, n := x.Rows, x.Cols, w.Rows
	check(w.Cols == k, "linear: input width %d, weight [%d, %d]", k, w.Rows, w.Cols)
	var bv []T
	req := x.Requires || w.Requires
	if b != nil {
		bv = b.Val
		req = req || b.Requires
	}
	y := t.out(m, n, req)
	if s, ok := f32(y.Val, x.Val, w.Val, bv); ok {
		cpu.MatMulT(s[0], s[1], s[2], s[3], m, k, n)
	} else {
		copy(y.Val, cpu.MatMulTRef(x.Val, w.Val, bv, m, k, n))
	}
	t.record(y, func() {
		if y.Grad == nil {
			return
		}
		dx, dw, db := t.gradIf(x), t.gradIf(w), t.gradIf(b)
		linearBackward(dx, dw, db, y.Grad, x.Val, w.Val, m, k, n)
	})
	return y
}

// linearBackward accumulates dx += dy·w, dw += dyᵀ·x, db += Σ dy (in
// float32 through the tiled matmul).
func linearBackward[T Float](dx, dw, db, dy, x, w []T, m, k, n int) {
	if s, ok := f32(dy, x, w); ok {
		d, _ := f32(dx, dw, db)
		cpu.LinearBackward(d[0], d[1], d[2], s[0], s[1], s[2], m, k, n)
		return
	}
	cpu.MatMulTBackward(dx, dw, db, dy, x, w, m, k, n)
}

// RMSNorm normalises each row of width len(w) (x may hold several such
// rows per matrix row: Qwen3's per-head q/k norms): y = x·rsqrt(mean(x²)+eps)·w.
func (t *Tape[T]) RMSNorm(x, w *Var[T], eps float64) *Var[T] {
	d := len(w.Val)
	check(x.Cols%d == 0, "rmsnorm: width %d is not a multiple of the weight's %d", x.Cols, d)
	y := t.out(x.Rows, x.Cols, x.Requires || w.Requires)
	if s, ok := f32(y.Val, x.Val, w.Val); ok {
		cpu.RMSNorm(s[0], s[1], s[2], d, float32(eps))
	} else {
		copy(y.Val, cpu.RMSNormRef(x.Val, w.Val, d, eps))
	}
	t.record(y, func() {
		if y.Grad == nil {
			return
		}
		dx, dw := t.gradIf(x), t.gradIf(w)
		cpu.RMSNormBackward(dx, dw, y.Grad, x.Val, w.Val, d, T(eps))
	})
	return y
}

// Rope rotates x[t, heads·hd], row i at position pos[i].
func (t *Tape[T]) Rope(x *Var[T], pos []int, heads, hd int, theta float64) *Var[T] {
	check(len(pos) == x.Rows && x.Cols == heads*hd, "rope: %d positions, x [%d, %d], %d heads of %d", len(pos), x.Rows, x.Cols, heads, hd)
	y := t.out(x.Rows, x.Cols, x.Requires)
	if s, ok := f32(y.Val, x.Val); ok {
		cos, sin := cpu.CachedRopeTables(pos, hd, theta)
		copy(s[0], s[1])
		cpu.Rope(s[0], pos, heads, hd, cos, sin)
	} else {
		copy(y.Val, cpu.RopeRef(x.Val, pos, heads, hd, theta))
	}
	t.record(y, func() {
		if y.Grad == nil {
			return
		}
		g := append([]T(nil), y.Grad...)
		cpu.RopeBackward(g, pos, heads, hd, theta)
		addTo(t.grad(x), g)
	})
	return y
}

// SiLUMul is the SwiGLU gate: y = silu(g)·u elementwise.
func (t *Tape[T]) SiLUMul(g, u *Var[T]) *Var[T] {
	check(len(g.Val) == len(u.Val), "silu-mul: %d and %d values", len(g.Val), len(u.Val))
	y := t.out(g.Rows, g.Cols, g.Requires || u.Requires)
	if s, ok := f32(y.Val, g.Val, u.Val); ok {
		cpu.SiLUMul(s[0], s[1], s[2])
	} else {
		copy(y.Val, cpu.SiLUMulRef(g.Val, u.Val))
	}
	t.record(y, func() {
		if y.Grad == nil {
			return
		}
		var dg, du []T
		if g.Requires {
			dg = t.grad(g)
		}
		if u.Requires {
			du = t.grad(u)
		}
		cpu.SiLUMulBackward(dg, du, y.Grad, g.Val, u.Val)
	})
	return y
}

// Add is y = a + b (same shapes): the residual connection.
func (t *Tape[T]) Add(a, b *Var[T]) *Var[T] {
	check(len(a.Val) == len(b.Val), "add: %d and %d values", len(a.Val), len(b.Val))
	y := t.out(a.Rows, a.Cols, a.Requires || b.Requires)
	for i := range y.Val {
		y.Val[i] = a.Val[i] + b.Val[i]
	}
	t.record(y, func() {
		if y.Grad == nil {
			return
		}
		for _, v := range []*Var[T]{a, b} {
			if v.Requires {
				addTo(t.grad(v), y.Grad)
			}
		}
	})
	return y
}

// Scale is y = s·x.
func (t *Tape[T]) Scale(x *Var[T], s float64) *Var[T] {
	y := t.out(x.Rows, x.Cols, x.Requires)
	for i, v := range x.Val {
		y.Val[i] = T(s) * v
	}
	t.record(y, func() {
		if y.Grad == nil {
			return
		}
		g := t.grad(x)
		for i, d := range y.Grad {
			g[i] += T(s) * d
		}
	})
	return y
}

// Dropout zeroes each element with probability p and scales the rest by
// 1/(1−p). The mask comes from seed alone, so a recomputed forward draws
// the same one.
func (t *Tape[T]) Dropout(x *Var[T], p float64, seed uint64) *Var[T] {
	if p <= 0 {
		return x
	}
	keep := DropoutKeep(len(x.Val), p, seed)
	y := t.out(x.Rows, x.Cols, x.Requires)
	scale := T(1 / (1 - p))
	for i, v := range x.Val {
		if keep[i] {
			y.Val[i] = v * scale
		}
	}
	t.record(y, func() {
		if y.Grad == nil {
			return
		}
		g := t.grad(x)
		for i, d := range y.Grad {
			if keep[i] {
				g[i] += d * scale
			}
		}
	})
	return y
}

// DropoutKeep draws which of n elements dropout with probability p keeps,
// from seed alone: the mask the tape and the backends' Dropout share.
func DropoutKeep(n int, p float64, seed uint64) []bool {
	thr := kernels.DropoutThreshold(p)
	keep := make([]bool, n)
	for i := range keep {
		keep[i] = kernels.DropoutBits(seed, uint64(i)) >= thr
	}
	return keep
}

// Gather picks rows: y[i, :] = x[rows[i], :]. Training projects onto the
// vocabulary only the rows that carry a loss.
func (t *Tape[T]) Gather(x *Var[T], rows []int) *Var[T] {
	d := x.Cols
	y := t.out(len(rows), d, x.Requires)
	for i, r := range rows {
		copy(y.Val[i*d:(i+1)*d], x.Val[r*d:(r+1)*d])
	}
	t.record(y, func() {
		if y.Grad == nil {
			return
		}
		g := t.grad(x)
		for i, r := range rows {
			addTo(g[r*d:(r+1)*d], y.Grad[i*d:(i+1)*d])
		}
	})
	return y
}

// LogProbs gives, for logits[t, vocab] and targets[t], each target's
// log-softmax value, as a [t, 1] column: the token log-probabilities that
// the SFT loss and GRPO's ratio are built from.
func (t *Tape[T]) LogProbs(logits *Var[T], targets []int) *Var[T] {
	check(len(targets) == logits.Rows, "log-probs: %d targets for %d rows", len(targets), logits.Rows)
	for _, tok := range targets {
		check(tok < logits.Cols, "log-probs: target %d outside the vocabulary of %d", tok, logits.Cols)
	}
	y := t.out(logits.Rows, 1, logits.Requires)
	copy(y.Val, cpu.LogProbGather(logits.Val, targets, logits.Cols))
	t.record(y, func() {
		if y.Grad != nil {
			cpu.LogProbGatherBackward(t.grad(logits), y.Grad, logits.Val, targets, logits.Cols)
		}
	})
	return y
}

// Entropy returns the entropy of each row's softmax (no gradient): a
// diagnostic of how peaked the policy is.
func Entropy[T Float](logits *Var[T]) []float64 { return cpu.Entropy(logits.Val, logits.Cols) }

// Segment is a run of rows [Lo, Hi) of a packed batch that attend causally
// among themselves after the first Prefix rows of the batch (a prompt they
// share, itself a segment with Prefix 0). Packing sequences that share a
// long system prompt this way computes the prompt once per batch, with the
// same loss as processing every sequence whole.
type Segment struct{ Lo, Hi, Prefix int }

// Attention is causal grouped-query attention over packed segments:
// q[t, heads·hd], k and v [t, kvHeads·hd]; y[t, heads·hd].
func (t *Tape[T]) Attention(q, k, v *Var[T], segs []Segment, heads, kvHeads, hd int) *Var[T] {
	check(q.Cols == heads*hd && k.Cols == kvHeads*hd && v.Cols == kvHeads*hd && k.Rows == q.Rows && v.Rows == q.Rows,
		"attention: q [%d, %d], k [%d, %d], v [%d, %d] for %d/%d heads of %d", q.Rows, q.Cols, k.Rows, k.Cols, v.Rows, v.Cols, heads, kvHeads, hd)
	covered := 0
	for _, s := range segs {
		check(s.Lo == covered && s.Hi > s.Lo && s.Prefix <= s.Lo, "attention: segments must tile the rows in order, got %+v after row %d", s, covered)
		covered = s.Hi
	}
	check(covered == q.Rows, "attention: segments cover %d of %d rows", covered, q.Rows)
	y := t.out(q.Rows, q.Cols, q.Requires || k.Requires || v.Requires)
	qw, kw := heads*hd, kvHeads*hd
	// keys returns the segment's keys (or values) as one contiguous cache:
	// its prefix rows, then its own.
	keys := func(x []T, s Segment) []T {
		if s.Prefix == 0 {
			return x[s.Lo*kw : s.Hi*kw]
		}
		c := make([]T, (s.Prefix+s.Hi-s.Lo)*kw)
		copy(c, x[:s.Prefix*kw])
		copy(c[s.Prefix*kw:], x[s.Lo*kw:s.Hi*kw])
		return c
	}
	for _, s := range segs {
		n := s.Hi - s.Lo
		qs, out := q.Val[s.Lo*qw:s.Hi*qw], y.Val[s.Lo*qw:s.Hi*qw]
		kc, vc := keys(k.Val, s), keys(v.Val, s)
		if f, ok := f32(out, qs, kc, vc); ok {
			cpu.AttentionMatMul(f[0], f[1], f[2], f[3], n, s.Prefix, heads, kvHeads, hd)
		} else {
			copy(out, cpu.AttentionRef(qs, kc, vc, nil, n, s.Prefix, heads, kvHeads, hd))
		}
	}
	t.record(y, func() {
		if y.Grad == nil {
			return
		}
		dq, dk, dv := t.grad(q), t.grad(k), t.grad(v)
		for _, s := range segs {
			n := s.Hi - s.Lo
			kc, vc := keys(k.Val, s), keys(v.Val, s)
			dkc, dvc := make([]T, len(kc)), make([]T, len(vc))
			dqs, dys, qs := dq[s.Lo*qw:s.Hi*qw], y.Grad[s.Lo*qw:s.Hi*qw], q.Val[s.Lo*qw:s.Hi*qw]
			if f, ok := f32(dqs, dkc, dvc, dys, qs, kc, vc); ok {
				cpu.AttentionBackwardMatMul(f[0], f[1], f[2], f[3], f[4], f[5], f[6], n, s.Prefix, heads, kvHeads, hd)
			} else {
				cpu.AttentionBackward(dqs, dkc, dvc, dys, qs, kc, vc, nil, n, s.Prefix, heads, kvHeads, hd)
			}
			// Scatter the cache gradients back to the prefix rows and the
			// segment's own rows.
			p := s.Prefix * kw
			addTo(dk[:p], dkc[:p])
			addTo(dv[:p], dvc[:p])
			addTo(dk[s.Lo*kw:s.Hi*kw], dkc[p:])
			addTo(dv[s.Lo*kw:s.Hi*kw], dvc[p:])
		}
	})
	return y
}

// LinearLogProbs is LogProbs(Linear(x, w, nil), targets), with the
// entropies of the rows' softmax when asked, computed chunk rows at a time:
// the [rows, vocabulary] logits are never held whole, only [chunk,
// vocabulary] of them, and the backward recomputes each chunk's logits
// (one more matmul over the vocabulary) instead of keeping them. For a
// 152k vocabulary and thousands of learned tokens that is gigabytes (the
// largest item of a paper-scale step) traded for one extra LM-head
// matmul, as Liger's fused linear cross-entropy does.
func (t *Tape[T]) LinearLogProbs(x, w *Var[T], targets []int, chunk int, entropy bool) (*Var[T], []float64) {
	m, k, n := x.Rows, x.Cols, w.Rows
	check(w.Cols == k, "linear log-probs: input width %d, weight [%d, %d]", k, w.Rows, w.Cols)
	check(len(targets) == m, "linear log-probs: %d targets for %d rows", len(targets), m)
	for _, tok := range targets {
		check(tok < n, "linear log-probs: target %d outside the vocabulary of %d", tok, n)
	}
	chunk = max(1, min(chunk, m))
	y := t.out(m, 1, x.Requires || w.Requires)
	var ent []float64
	buf := make([]T, chunk*n)
	logits := func(lo, hi int) []T {
		l := buf[:(hi-lo)*n]
		xs := x.Val[lo*k : hi*k]
		if s, ok := f32(l, xs, w.Val); ok {
			cpu.MatMulT(s[0], s[1], s[2], nil, hi-lo, k, n)
		} else {
			copy(l, cpu.MatMulTRef(xs, w.Val, nil, hi-lo, k, n))
		}
		return l
	}
	for lo := 0; lo < m; lo += chunk {
		hi := min(lo+chunk, m)
		l := logits(lo, hi)
		copy(y.Val[lo:hi], cpu.LogProbGather(l, targets[lo:hi], n))
		if entropy {
			ent = append(ent, cpu.Entropy(l, n)...)
		}
	}
	t.record(y, func() {
		if y.Grad == nil {
			return
		}
		dx, dw := t.gradIf(x), t.gradIf(w)
		dl := make([]T, chunk*n)
		for lo := 0; lo < m; lo += chunk {
			hi := min(lo+chunk, m)
			l := logits(lo, hi)
			d := dl[:(hi-lo)*n]
			clear(d)
			cpu.LogProbGatherBackward(d, y.Grad[lo:hi], l, targets[lo:hi], n)
			var dxs []T
			if dx != nil {
				dxs = dx[lo*k : hi*k]
			}
			linearBackward(dxs, dw, nil, d, x.Val[lo*k:hi*k], w.Val, hi-lo, k, n)
		}
	})
	return y, ent
}
