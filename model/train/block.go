package train

import (
	"github.com/agemem/agemem/kernels"
	"github.com/agemem/agemem/model/qwen"
	"github.com/agemem/agemem/model/tape"
)

// A device replica's decoder block. Its forward is qwen.Layer.Forward, run
// by blockOps over the layer's weights on the device; each op keeps what
// its backward needs. Its backward is layerBackward, written by hand in
// the reverse order of the block, each op's backward beside its forward
// (as llm.c keeps them): gradients accumulate in place into buffers the
// ops share, and under recomputation the MLP's backward runs a chunk of
// rows at a time right after that chunk's forward, a fixed sequence of
// kernels that a step's speed and memory rest on. TestReplicaMatchesTape
// holds both to the tape.

type devLinear = qwen.Linear[*DeviceParam]

// devLinAct is what one projection's backward needs from its forward.
type devLinAct struct {
	in, xa   kernels.Tensor // input; LoRA: dropout(input)'s A product
	dropped  bool           // LoRA dropout ran, seeded dropSeed
	dropSeed uint64
}

// devLayerAct holds one layer's forward activations for its backward.
// Under recomputation it holds only the layer's input: x, or with a bf16
// base xs, x rounded to bfloat16 (half the memory of the largest thing a
// recomputing step keeps; the GEMMs round their inputs to bf16 anyway).
type devLayerAct struct {
	x, xs, xn1, qPre, kPre, q, k, v, att, xMid, xn2 kernels.Tensor
	lse                                             kernels.Tensor // [tokens, heads], where the backend keeps it (kernels.LSEAttender)
	lin                                             struct{ q, k, v, o devLinAct }
	mlp                                             mlpAct
}

// mlpAct is the MLP's forward state over a run of rows.
type mlpAct struct {
	gate, up, act kernels.Tensor
	lin           struct{ gate, up, down devLinAct }
}

// mlpGrads are, while the backward recomputes a layer, the gradient of
// its MLP's output (dy) and where that of the MLP's input goes (dx).
type mlpGrads struct{ dx, dy kernels.Tensor }

// blockOps run qwen.Layer.Forward for decoder layer li on the replica's
// device: l is the layer as the tensors its GEMMs read, a keeps the
// activations, m the MLP's (&a.mlp, or a chunk's own).
type blockOps struct {
	d  *Replica
	li int
	l  *qwen.Layer[kernels.Tensor]
	b  Batch
	o  TrainOptions
	a  *devLayerAct
	m  *mlpAct
	// shared is the input that Q, K and V (or Gate and Up) read, as
	// their GEMMs read it: rounded once for all of them.
	shared struct{ in, operand kernels.Tensor }
	// grad is set when the backward recomputes the layer: then each
	// chunk of the MLP's rows runs its backward right after its forward,
	// and nothing computes the layer's output (Add gets nil).
	grad *mlpGrads
}

// endShared lets the shared operand go: every op but a projection ends
// the run of projections that read it, and a bf16 copy of a layer-wide
// input is not to outlive them.
func (op *blockOps) endShared() { op.shared.in, op.shared.operand = nil, nil }

// weight is the tensor a parameter's GEMMs read (nil for an absent one).
func weight(p *DeviceParam) kernels.Tensor {
	if p == nil {
		return nil
	}
	return p.W
}

// layer runs decoder layer li on x through qwen.Layer.Forward, keeping in
// a what its backward needs (all of it: Forward drops it under
// recomputation); with g, it is the backward's recomputation (blockOps).
func (d *Replica) layer(li int, x kernels.Tensor, b Batch, o TrainOptions, a *devLayerAct, g *mlpGrads) kernels.Tensor {
	l := qwen.MapLayer(&d.Layers[li], weight)
	return l.Forward(&blockOps{d: d, li: li, l: &l, b: b, o: o, a: a, m: &a.mlp, grad: g}, li, x)
}

// RMSNorm keeps a norm's input (and the attention's and MLP's normed
// inputs) by which norm it is.
func (op *blockOps) RMSNorm(x, w kernels.Tensor) kernels.Tensor {
	op.endShared()
	be := op.d.be
	y := be.Empty(x.Shape()...)
	be.RMSNorm(y, x, w, float32(op.d.RMSNormEps))
	switch a, l := op.a, op.l; w {
	case l.AttnNorm:
		a.x, a.xn1 = x, y
	case l.Attn.QNorm:
		a.qPre = x
	case l.Attn.KNorm:
		a.kPre = x
	case l.MLPNorm:
		a.xMid, a.xn2 = x, y
	}
	return y
}

// Linear runs p on x and keeps its input for the backward. The operand
// of an input several projections read (Q's, K's and V's; Gate's and
// Up's) is made once (GEMMOperand); O and Down each read theirs alone,
// which MatMul rounds as it reads. While the backward recomputes, Down
// keeps what its backward needs and computes nothing: nothing reads its
// product.
func (op *blockOps) Linear(p *qwen.Linear[kernels.Tensor], x kernels.Tensor) kernels.Tensor {
	l, a, m := op.l, op.a, op.m
	switch p {
	case &l.Attn.O:
		return op.d.linear(p, x, x, op.o, &a.lin.o)
	case &l.MLP.Down:
		if op.grad != nil {
			op.d.linearIn(p, x, x, op.o, &m.lin.down)
			return nil
		}
		return op.d.linear(p, x, x, op.o, &m.lin.down)
	}
	var act *devLinAct
	switch p {
	case &l.Attn.Q:
		act = &a.lin.q
	case &l.Attn.K:
		act = &a.lin.k
	case &l.Attn.V:
		act = &a.lin.v
	case &l.MLP.Gate:
		act = &m.lin.gate
	case &l.MLP.Up:
		act = &m.lin.up
	}
	if op.shared.in != x {
		op.shared.in, op.shared.operand = x, op.d.be.GEMMOperand(x)
	}
	return op.d.linear(p, x, op.shared.operand, op.o, act)
}

// linear runs p on x; xo is x as the GEMMs read it (GEMMOperand(x), made
// once where several projections read x, or x).
func (d *Replica) linear(p *qwen.Linear[kernels.Tensor], x, xo kernels.Tensor, o TrainOptions, act *devLinAct) kernels.Tensor {
	be := d.be
	y := be.Empty(x.Shape()[0], p.Out)
	be.MatMul(y, xo, p.W, p.B)
	if xa := d.linearIn(p, x, xo, o, act); xa != nil {
		be.MatMulAdd(y, xa, p.LB, float32(p.Scale))
	}
	return y
}

// linearIn records what linear's backward needs of its input x: x itself
// and, under LoRA, dropout(x)·A, which it returns (nil without an adapter).
func (d *Replica) linearIn(p *qwen.Linear[kernels.Tensor], x, xo kernels.Tensor, o TrainOptions, act *devLinAct) kernels.Tensor {
	act.in = x
	if p.A == nil || o.NoAdapter {
		return nil
	}
	be := d.be
	xd := xo
	if o.Dropout && p.Dropout > 0 {
		// The tape's mask (kernels.DropoutBits), drawn on the device; the
		// backward draws it again rather than keep it.
		act.dropped, act.dropSeed = true, p.DropoutSeed(o.Seed)
		xd = be.DropoutOperand(x, p.Dropout, act.dropSeed)
	}
	act.xa = be.Empty(x.Shape()[0], p.A.Shape()[0])
	be.MatMul(act.xa, xd, p.A, nil)
	return act.xa
}

// linearBackward accumulates into dx (and the parameters' gradients) the
// backward of linear given dy.
func (d *Replica) linearBackward(p *devLinear, dx, dy kernels.Tensor, o TrainOptions, act *devLinAct) {
	be := d.be
	var db kernels.Tensor
	if p.B != nil {
		db = p.B.G
	}
	if p.A == nil || o.NoAdapter {
		be.MatMulBackward(dx, p.W.G, db, dy, act.in, p.W.W)
		return
	}
	if db == nil {
		// The base's GEMMs and B's read dy: rounded once for both (a bias
		// gradient sums dy itself).
		dy = be.GEMMOperand(dy)
	}
	be.MatMulBackward(dx, p.W.G, db, dy, act.in, p.W.W)
	// The adapter sees scale·dy: B's gradient and dxa are taken from dy
	// and scaled where they are small (r wide), not dy where it is large.
	s := float32(p.Scale)
	gb, dxu := be.Zeros(p.LB.G.Shape()...), be.Zeros(act.xa.Shape()...)
	be.MatMulBackward(dxu, gb, nil, dy, act.xa, p.LB.W)
	be.AddScaled(p.LB.G, gb, s)
	dxa := be.Zeros(act.xa.Shape()...)
	be.AddScaled(dxa, dxu, s)
	if !act.dropped {
		be.MatMulBackward(dx, p.A.G, nil, dxa, act.in, p.A.W)
		return
	}
	xd := be.DropoutOperand(act.in, p.Dropout, act.dropSeed)
	dxd := be.Zeros(act.in.Shape()...)
	be.MatMulBackward(dxd, p.A.G, nil, dxa, xd, p.A.W)
	be.DropoutAdd(dx, dxd, p.Dropout, act.dropSeed)
}

// Rope rotates x in place; its backward (RopeBackward) rotates the
// gradient back in place.
func (op *blockOps) Rope(x kernels.Tensor, heads int) kernels.Tensor {
	op.endShared()
	d := op.d
	d.be.Rope(x, op.b.Pos, heads, d.HeadDim, d.RopeTheta)
	return x
}

// Attention runs each packed sequence's causal attention over its segment
// (and the prefix it continues), keeping q, k, v, the output and, where
// the backend keeps them, the rows' log-sum-exps.
func (op *blockOps) Attention(_ int, q, k, v kernels.Tensor) kernels.Tensor {
	op.endShared()
	d, a := op.d, op.a
	be := d.be
	n := q.Shape()[0]
	a.q, a.k, a.v = q, k, v
	a.att = be.Zeros(n, d.Heads*d.HeadDim)
	// A backend that keeps the rows' log-sum-exps hands them to the
	// backward, which then need not run the forward's scores again.
	lb, keep := be.(kernels.LSEAttender)
	a.lse = nil
	if keep {
		a.lse = be.Zeros(n, d.Heads)
	}
	for _, s := range op.b.Segs {
		out, qs, ks, vs := be.Rows(a.att, s.Lo, s.Hi), be.Rows(q, s.Lo, s.Hi), d.segmentKV(k, s), d.segmentKV(v, s)
		if keep {
			keep = lb.AttentionLSE(out, be.Rows(a.lse, s.Lo, s.Hi), qs, ks, vs, s.Prefix, d.Heads, d.KVHeads, d.HeadDim)
			continue
		}
		be.Attention(out, qs, ks, vs, nil, s.Prefix, d.Heads, d.KVHeads, d.HeadDim)
	}
	if !keep {
		a.lse = nil
	}
	return a.att
}

// attentionBackward accumulates into dq, dk and dv the backward of
// Attention given datt, segment by segment; a segment's prefix rows get
// the sum over every segment that continues it.
func (d *Replica) attentionBackward(a *devLayerAct, b Batch, dq, dk, dv, datt kernels.Tensor) {
	be := d.be
	for _, s := range b.Segs {
		n := s.Hi - s.Lo
		kk, vv := d.segmentKV(a.k, s), d.segmentKV(a.v, s)
		out := be.Rows(a.att, s.Lo, s.Hi)
		attBack := func(dq, dk, dv kernels.Tensor) {
			if a.lse != nil {
				be.(kernels.LSEAttender).AttentionBackwardLSE(dq, dk, dv, be.Rows(datt, s.Lo, s.Hi), out, be.Rows(a.lse, s.Lo, s.Hi),
					be.Rows(a.q, s.Lo, s.Hi), kk, vv, s.Prefix, d.Heads, d.KVHeads, d.HeadDim)
				return
			}
			be.AttentionBackward(dq, dk, dv, be.Rows(datt, s.Lo, s.Hi), out, be.Rows(a.q, s.Lo, s.Hi), kk, vv, s.Prefix, d.Heads, d.KVHeads, d.HeadDim)
		}
		if s.Prefix == 0 {
			attBack(be.Rows(dq, s.Lo, s.Hi), be.Rows(dk, s.Lo, s.Hi), be.Rows(dv, s.Lo, s.Hi))
			continue
		}
		dkk, dvv := be.Zeros(kk.Shape()...), be.Zeros(vv.Shape()...)
		attBack(be.Rows(dq, s.Lo, s.Hi), dkk, dvv)
		p := s.Prefix
		be.AddScaled(be.Rows(dk, 0, p), be.Rows(dkk, 0, p), 1)
		be.AddScaled(be.Rows(dv, 0, p), be.Rows(dvv, 0, p), 1)
		be.AddScaled(be.Rows(dk, s.Lo, s.Hi), be.Rows(dkk, p, p+n), 1)
		be.AddScaled(be.Rows(dv, s.Lo, s.Hi), be.Rows(dvv, p, p+n), 1)
	}
}

// segmentKV returns a segment's keys (or values) as one run of rows: its
// prefix rows, then its own (a copy only when there is a prefix).
func (d *Replica) segmentKV(x kernels.Tensor, s tape.Segment) kernels.Tensor {
	if s.Prefix == 0 {
		return d.be.Rows(x, s.Lo, s.Hi)
	}
	c := d.be.Zeros(s.Prefix+s.Hi-s.Lo, x.Shape()[1])
	d.be.CopyRows(c, 0, x, 0, s.Prefix)
	d.be.CopyRows(c, s.Prefix, x, s.Lo, s.Hi-s.Lo)
	return c
}

// SiLUMul keeps gate, up and their product for mlpBackward.
func (op *blockOps) SiLUMul(gate, up kernels.Tensor) kernels.Tensor {
	op.endShared()
	m := op.m
	m.gate, m.up = gate, up
	m.act = op.d.be.Empty(gate.Shape()...)
	op.d.be.SiLUMul(m.act, gate, up)
	return m.act
}

// Add adds a into b, the block's new output (x is kept for the backward):
// xMid = O(att) + x, y = Down(act) + xMid. While the backward recomputes,
// the MLP's b is nil and so is the layer's output.
func (op *blockOps) Add(a, b kernels.Tensor) kernels.Tensor {
	op.endShared()
	if b == nil {
		return nil
	}
	op.d.be.Add(b, a)
	return b
}

// MLPChunkFloats bounds, under recomputation, the floats of each MLP
// intermediate (gate, up, their product and gradients) a step holds at
// once: 2²⁴, 64 MiB each, where a 10,240-token rollout through Qwen2.5-7B's
// 18,944-wide MLP would be 0.72 GiB each. (2²⁵ halves the chunks, some 85
// kernel launches each a layer, but costs the 4B's full fine-tuning under
// ZeRO-2 its fit in 24 GiB.)
const MLPChunkFloats = 1 << 24

// mlpChunk is the rows of n the MLP runs at a time: all of them unless
// recomputing.
func (d *Replica) mlpChunk(o TrainOptions, n int) int {
	if !o.Recompute {
		return n
	}
	if o.MLPChunk > 0 {
		return o.MLPChunk
	}
	return max(1, MLPChunkFloats/d.Intermediate)
}

// chunkOptions are o for the MLP chunk starting at row lo: its own LoRA
// dropout masks (the first chunk's are the unchunked ones), drawn again
// alike when the backward recomputes it.
func chunkOptions(o TrainOptions, lo int) TrainOptions {
	if lo > 0 {
		o.Seed ^= uint64(lo) * 0xbf58476d1ce4e5b9
	}
	return o
}

// RowWise runs the MLP on x, the normed residual, keeping its state in
// op.m; under recomputation a chunk of rows at a time (mlpChunk), each
// chunk with its own state that the forward drops, and in the backward's
// recomputation each chunk's backward right after its forward.
func (op *blockOps) RowWise(x kernels.Tensor, f func(qwen.Ops[kernels.Tensor], kernels.Tensor) kernels.Tensor) kernels.Tensor {
	op.endShared()
	be := op.d.be
	n := x.Shape()[0]
	chunk := op.d.mlpChunk(op.o, n)
	if chunk >= n && op.grad == nil {
		return f(op, x)
	}
	// Row by row the MLP is independent: a chunk's intermediates (three
	// of intermediate_size wide, the widest thing in a layer) exist at a
	// time.
	var y kernels.Tensor
	if op.grad == nil {
		y = be.Zeros(x.Shape()...)
	}
	for lo := 0; lo < n; lo += chunk {
		hi := min(lo+chunk, n)
		c := &blockOps{d: op.d, li: op.li, l: op.l, b: op.b, o: chunkOptions(op.o, lo), a: op.a, m: &mlpAct{}, grad: op.grad}
		r := f(c, be.Rows(x, lo, hi))
		if op.grad != nil {
			op.d.mlpBackward(op.li, be.Rows(op.grad.dx, lo, hi), be.Rows(op.grad.dy, lo, hi), c.o, c.m)
			continue
		}
		be.CopyRows(y, lo, r, 0, hi-lo)
	}
	return y
}

// mlpBackward accumulates into dxn2 the MLP's backward given dy, the
// gradient of its output.
func (d *Replica) mlpBackward(li int, dxn2, dy kernels.Tensor, o TrainOptions, m *mlpAct) {
	be, mlp := d.be, &d.Layers[li].MLP
	dact := be.Zeros(m.act.Shape()...)
	d.linearBackward(&mlp.Down, dact, dy, o, &m.lin.down)
	dgate, dup := be.Zeros(m.gate.Shape()...), be.Zeros(m.up.Shape()...)
	be.SiLUMulBackward(dgate, dup, dact, m.gate, m.up)
	d.linearBackward(&mlp.Gate, dxn2, dgate, o, &m.lin.gate)
	d.linearBackward(&mlp.Up, dxn2, dup, o, &m.lin.up)
}

// layerBackward is layer li's backward, Layer.Forward in reverse: given
// dx, the gradient of the layer's output, it accumulates the layer's
// parameters' gradients and leaves in dx the gradient of its input.
// acts.layers[li] is what the forward kept, or under recomputation the
// layer's input alone: the block then runs again first (the MLP's
// backward inside it, a chunk at a time), and the layer above's
// activations, recomputed for its backward, go.
func (d *Replica) layerBackward(li int, acts *ReplicaActs, dx kernels.Tensor) {
	be, l, a := d.be, &d.Layers[li], &acts.layers[li]
	b, o := acts.b, acts.o
	eps := float32(d.RMSNormEps)
	n := len(b.Tokens)
	// y = xMid + Down(act): dxMid starts as dy (dx's buffer, reused).
	dxn2 := be.Zeros(n, d.HiddenSize)
	if o.Recompute {
		if li+1 < len(d.Layers) {
			acts.layers[li+1] = devLayerAct{} // done with: let it go
		}
		x := a.x
		if a.xs != nil {
			x = be.Zeros(n, d.HiddenSize)
			be.Embedding(x, a.xs, acts.rowIDs())
		}
		d.layer(li, x, b, o, a, &mlpGrads{dx: dxn2, dy: dx})
	} else {
		d.mlpBackward(li, dxn2, dx, o, &a.mlp)
	}
	at := &l.Attn
	be.RMSNormBackward(dx, grad(l.MLPNorm), dxn2, a.xMid, l.MLPNorm.W, eps)
	// xMid = x + O(att): dx carries on as d(x).
	datt := be.Zeros(a.att.Shape()...)
	d.linearBackward(&at.O, datt, dx, o, &a.lin.o)
	dq, dk, dv := be.Zeros(a.q.Shape()...), be.Zeros(a.k.Shape()...), be.Zeros(a.v.Shape()...)
	d.attentionBackward(a, b, dq, dk, dv, datt)
	be.RopeBackward(dq, b.Pos, d.Heads, d.HeadDim, d.RopeTheta)
	be.RopeBackward(dk, b.Pos, d.KVHeads, d.HeadDim, d.RopeTheta)
	if at.QKNorm {
		dqp, dkp := be.Zeros(dq.Shape()...), be.Zeros(dk.Shape()...)
		be.RMSNormBackward(dqp, grad(at.QNorm), dq, a.qPre, at.QNorm.W, eps)
		be.RMSNormBackward(dkp, grad(at.KNorm), dk, a.kPre, at.KNorm.W, eps)
		dq, dk = dqp, dkp
	}
	dxn1 := be.Zeros(a.xn1.Shape()...)
	d.linearBackward(&at.Q, dxn1, dq, o, &a.lin.q)
	d.linearBackward(&at.K, dxn1, dk, o, &a.lin.k)
	d.linearBackward(&at.V, dxn1, dv, o, &a.lin.v)
	be.RMSNormBackward(dx, grad(l.AttnNorm), dxn1, a.x, l.AttnNorm.W, eps)
}

func grad(p *DeviceParam) kernels.Tensor {
	if p == nil {
		return nil
	}
	return p.G
}
