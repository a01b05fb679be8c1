package train

import (
	"fmt"

	"github.com/agemem/agemem/kernels"
	"github.com/agemem/agemem/kernels/half"
	"github.com/agemem/agemem/model/lora"
	"github.com/agemem/agemem/model/optim"
	"github.com/agemem/agemem/model/qwen"
	"github.com/agemem/agemem/model/tape"
)

// Replica trains the decoder where a kernels.TrainBackend backend keeps
// it: the parameters, their gradients and AdamW moments live on the
// device, and a step (forward, backward, clipping, update) launches
// kernels without reading anything back. The forward and backward are
// written out layer by layer, as llm.c does, over the same architecture
// as Weights.LogProbs on the tape, which the tests hold it to.
type Replica struct {
	*qwen.Decoder[*DeviceParam]
	be     kernels.TrainBackend
	Params []*DeviceParam // trainable ones, in Weights.Trainable order
	all    map[string]*DeviceParam
}

// DeviceParam is one parameter on the device; G, M and V are nil when it
// is frozen.
type DeviceParam struct {
	Name       string
	W, G, M, V kernels.Tensor
	Decay      bool
}

// NewReplica uploads w's parameters (and adapter) to be. Only
// float32 weights train.
//
// With baseBF16 the frozen weight matrices (the base under LoRA) are held in
// bfloat16, half the bytes of the largest item on the device; trainable
// parameters, norms and biases stay float32. Mixed-precision training
// (model.train_dtype: bf16) rounds every GEMM input to bf16 anyway, so it
// loses nothing there.
func NewReplica(be kernels.TrainBackend, w *Weights[float32], baseBF16 bool) *Replica {
	d := &Replica{be: be, all: map[string]*DeviceParam{}}
	for _, nv := range w.Named {
		p := &DeviceParam{Name: nv.Name}
		if v := nv.V; baseBF16 && !v.Requires && v.Rows > 1 && v.Cols > 1 {
			bits := make([]uint16, len(v.Val))
			for i, x := range v.Val {
				bits[i] = half.F32ToBF16(x)
			}
			p.W = be.Upload(kernels.Weight{Rows: v.Rows, Cols: v.Cols, BF16: bits})
		} else {
			p.W = be.FromHost(v.Val, v.Rows, v.Cols)
		}
		if nv.V.Requires {
			p.G = be.Zeros(nv.V.Rows, nv.V.Cols)
			p.Decay = optim.DecayFor(nv.Name)
			d.Params = append(d.Params, p)
		}
		d.all[nv.Name] = p
	}
	// The same declaration as w's, its parameters the uploaded ones; every
	// name was uploaded above, since w was bound by the same declaration.
	d.Decoder, _ = qwen.Bind(w.Config, func(p qwen.Param, dst **DeviceParam) error { *dst = d.all[p.Name]; return nil })
	src, dst := w.Linears(), d.Linears()
	for i, s := range src {
		if s.A != nil {
			dst[i].A, dst[i].LB = d.all[lora.TensorName(s.Module, "A")], d.all[lora.TensorName(s.Module, "B")]
			dst[i].Scale, dst[i].Dropout = s.Scale, s.Dropout
		}
	}
	return d
}

// Engine is a decoding model over the replica's own tensors on its device:
// the base and, under LoRA, the adapter are the ones the trainer updates,
// not a copy, so rollouts hold no second model on the device and always
// decode with the current weights (no dropout: it is inference).
func (d *Replica) Engine() *qwen.Model {
	dec, _ := qwen.Bind(d.Config, func(p qwen.Param, dst *kernels.Tensor) error { *dst = d.all[p.Name].W; return nil })
	src, dst := d.Linears(), dec.Linears()
	for i, s := range src {
		if s.A != nil {
			dst[i].A, dst[i].LB, dst[i].Scale = s.A.W, s.LB.W, s.Scale
		}
	}
	return qwen.Bound(d.be, dec)
}

// Backend is the device the trainer runs on.
func (d *Replica) Backend() kernels.TrainBackend { return d.be }

type devLinear = qwen.Linear[*DeviceParam]

// devLinAct is what one projection's backward needs from its forward.
type devLinAct struct {
	in, xa   kernels.Tensor // input; LoRA: dropout(input)'s A product
	dropped  bool           // LoRA dropout ran, seeded dropSeed
	dropSeed uint64
}

// devLayerAct holds one layer's forward activations for its backward.
type devLayerAct struct {
	x, xn1, qPre, kPre, q, k, v, att, xMid, xn2, gate, up, act kernels.Tensor
	lin                                                        struct{ q, k, v, o, gate, up, down devLinAct }
}

// ReplicaActs is a forward's saved state: pass it to Backward.
type ReplicaActs struct {
	b             Batch
	o             TrainOptions
	layers        []devLayerAct
	x, xf, xfn    kernels.Tensor
	logits        kernels.Tensor // nil when Forward ran the LM head in chunks
	LogProbs, Ent kernels.Tensor // [len(LossRows)], the learned tokens' log-probabilities and entropies
}

// Forward runs the batch and returns the learned tokens' log-probabilities
// (acts.LogProbs) and entropies, keeping what Backward needs.
func (d *Replica) Forward(b Batch, o TrainOptions) *ReplicaActs {
	be := d.be
	h := d.HiddenSize
	n := len(b.Tokens)
	for _, id := range b.Tokens {
		if id < 0 || id >= d.VocabSize {
			panic(fmt.Sprintf("token id %d outside the vocabulary of %d", id, d.VocabSize))
		}
	}
	acts := &ReplicaActs{b: b, o: o}
	x := be.Zeros(n, h)
	be.Embedding(x, d.Embed.W, b.Tokens)
	for li := range d.Layers {
		var a devLayerAct
		y := d.layerForward(li, x, b, o, &a)
		if o.Recompute {
			// Keep the layer's input only; Backward runs the layer again
			// (same dropout masks: they are seeded) before its backward.
			a = devLayerAct{x: x}
		}
		acts.layers = append(acts.layers, a)
		x = y
	}
	acts.x = x
	m := len(b.LossRows)
	acts.xf, acts.xfn = be.Zeros(m, h), be.Zeros(m, h)
	be.Embedding(acts.xf, x, b.LossRows)
	be.RMSNorm(acts.xfn, acts.xf, d.Norm.W, float32(d.RMSNormEps))
	if s, ok := o.invTemperature(); ok { // the head reads x/T
		xt := be.Zeros(m, h)
		be.AddScaled(xt, acts.xfn, float32(s))
		acts.xfn = xt
	}
	acts.LogProbs, acts.Ent = be.Zeros(m), be.Zeros(m)
	chunk := o.logitChunk(d.VocabSize)
	if m <= chunk { // all the logits at once, kept for the backward
		acts.logits = be.Zeros(m, d.VocabSize)
		be.MatMul(acts.logits, acts.xfn, d.LMHead.W, nil)
		be.LogProbs(acts.LogProbs, acts.Ent, acts.logits, b.Targets)
		return acts
	}
	// Chunk by chunk (Tape.LinearLogProbs): the backward recomputes them.
	buf := be.Zeros(chunk, d.VocabSize)
	for lo := 0; lo < m; lo += chunk {
		hi := min(lo+chunk, m)
		l := be.Rows(buf, 0, hi-lo)
		be.MatMul(l, be.Rows(acts.xfn, lo, hi), d.LMHead.W, nil)
		be.LogProbs(be.Rows(acts.LogProbs, lo, hi), be.Rows(acts.Ent, lo, hi), l, b.Targets[lo:hi])
	}
	return acts
}

// headBackward accumulates the LM head's weight gradient and dxfn from
// dLogp, chunk by chunk when Forward did not keep the logits.
func (d *Replica) headBackward(acts *ReplicaActs, dxfn, dLogp kernels.Tensor) {
	be := d.be
	b := acts.b
	m := len(b.LossRows)
	if acts.logits != nil {
		dlogits := be.Zeros(m, d.VocabSize)
		be.LogProbsBackward(dlogits, dLogp, acts.logits, b.Targets)
		be.MatMulBackward(dxfn, d.LMHead.G, nil, dlogits, acts.xfn, d.LMHead.W)
		return
	}
	chunk := acts.o.logitChunk(d.VocabSize)
	buf, dbuf := be.Zeros(chunk, d.VocabSize), be.Zeros(chunk, d.VocabSize)
	for lo := 0; lo < m; lo += chunk {
		hi := min(lo+chunk, m)
		l, dl, xs := be.Rows(buf, 0, hi-lo), be.Rows(dbuf, 0, hi-lo), be.Rows(acts.xfn, lo, hi)
		be.MatMul(l, xs, d.LMHead.W, nil)
		be.Zero(dl)
		be.LogProbsBackward(dl, be.Rows(dLogp, lo, hi), l, b.Targets[lo:hi])
		be.MatMulBackward(be.Rows(dxfn, lo, hi), d.LMHead.G, nil, dl, xs, d.LMHead.W)
	}
}

func (d *Replica) linear(p *devLinear, x kernels.Tensor, o TrainOptions, act *devLinAct) kernels.Tensor {
	be := d.be
	rows := x.Shape()[0]
	y := be.Zeros(rows, p.Out)
	var bias kernels.Tensor
	if p.B != nil {
		bias = p.B.W
	}
	be.MatMul(y, x, p.W.W, bias)
	act.in = x
	if p.A == nil || o.NoAdapter {
		return y
	}
	xd := x
	if o.Dropout && p.Dropout > 0 {
		// The tape's mask (kernels.DropoutBits), drawn on the device; the
		// backward draws it again rather than keep it.
		act.dropped, act.dropSeed = true, p.DropoutSeed(o.Seed)
		xd = be.Zeros(x.Shape()...)
		be.Dropout(xd, x, p.Dropout, act.dropSeed)
	}
	act.xa = be.Zeros(rows, p.A.W.Shape()[0])
	be.MatMul(act.xa, xd, p.A.W, nil)
	lo := be.Zeros(y.Shape()...)
	be.MatMul(lo, act.xa, p.LB.W, nil)
	be.AddScaled(y, lo, float32(p.Scale))
	return y
}

// linearBackward accumulates into dx (and the parameters' gradients) the
// backward of linear given dy.
func (d *Replica) linearBackward(p *devLinear, dx, dy kernels.Tensor, o TrainOptions, act *devLinAct) {
	be := d.be
	var db kernels.Tensor
	if p.B != nil {
		db = p.B.G
	}
	be.MatMulBackward(dx, p.W.G, db, dy, act.in, p.W.W)
	if p.A == nil || o.NoAdapter {
		return
	}
	dys := be.Zeros(dy.Shape()...)
	be.AddScaled(dys, dy, float32(p.Scale))
	dxa := be.Zeros(act.xa.Shape()...)
	be.MatMulBackward(dxa, p.LB.G, nil, dys, act.xa, p.LB.W)
	if !act.dropped {
		be.MatMulBackward(dx, p.A.G, nil, dxa, act.in, p.A.W)
		return
	}
	xd := be.Zeros(act.in.Shape()...)
	be.Dropout(xd, act.in, p.Dropout, act.dropSeed)
	dxd := be.Zeros(act.in.Shape()...)
	be.MatMulBackward(dxd, p.A.G, nil, dxa, xd, p.A.W)
	be.Dropout(dxd, dxd, p.Dropout, act.dropSeed)
	be.AddScaled(dx, dxd, 1)
}

func grad(p *DeviceParam) kernels.Tensor {
	if p == nil {
		return nil
	}
	return p.G
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

func (d *Replica) layerForward(li int, x kernels.Tensor, b Batch, o TrainOptions, a *devLayerAct) kernels.Tensor {
	be, l := d.be, &d.Layers[li]
	n, h, eps := len(b.Tokens), d.HiddenSize, float32(d.RMSNormEps)
	at, mlp := &l.Attn, &l.MLP
	a.x = x
	a.xn1 = be.Zeros(n, h)
	be.RMSNorm(a.xn1, x, l.AttnNorm.W, eps)
	q := d.linear(&at.Q, a.xn1, o, &a.lin.q)
	k := d.linear(&at.K, a.xn1, o, &a.lin.k)
	a.v = d.linear(&at.V, a.xn1, o, &a.lin.v)
	if at.QKNorm {
		a.qPre, a.kPre = q, k
		q, k = be.Zeros(q.Shape()...), be.Zeros(k.Shape()...)
		be.RMSNorm(q, a.qPre, at.QNorm.W, eps)
		be.RMSNorm(k, a.kPre, at.KNorm.W, eps)
	}
	be.Rope(q, b.Pos, d.Heads, d.HeadDim, d.RopeTheta)
	be.Rope(k, b.Pos, d.KVHeads, d.HeadDim, d.RopeTheta)
	a.q, a.k = q, k
	a.att = be.Zeros(n, d.Heads*d.HeadDim)
	for _, s := range b.Segs {
		be.Attention(be.Rows(a.att, s.Lo, s.Hi), be.Rows(q, s.Lo, s.Hi), d.segmentKV(k, s), d.segmentKV(a.v, s), nil, s.Prefix, d.Heads, d.KVHeads, d.HeadDim)
	}
	a.xMid = d.linear(&at.O, a.att, o, &a.lin.o)
	be.Add(a.xMid, x)
	a.xn2 = be.Zeros(n, h)
	be.RMSNorm(a.xn2, a.xMid, l.MLPNorm.W, eps)
	a.gate = d.linear(&mlp.Gate, a.xn2, o, &a.lin.gate)
	a.up = d.linear(&mlp.Up, a.xn2, o, &a.lin.up)
	a.act = be.Zeros(a.gate.Shape()...)
	be.SiLUMul(a.act, a.gate, a.up)
	y := d.linear(&mlp.Down, a.act, o, &a.lin.down)
	be.Add(y, a.xMid)
	return y
}

// Backward accumulates into the parameters' gradients the gradient of
// Σ dLogp[i]·logp[i] (dLogp [len(LossRows)], on the device).
func (d *Replica) Backward(acts *ReplicaActs, dLogp kernels.Tensor) {
	be := d.be
	b, o := acts.b, acts.o
	eps := float32(d.RMSNormEps)
	m := len(b.LossRows)
	dxfn, dxf := be.Zeros(m, d.HiddenSize), be.Zeros(m, d.HiddenSize)
	d.headBackward(acts, dxfn, dLogp)
	if s, ok := o.invTemperature(); ok {
		dt := be.Zeros(m, d.HiddenSize)
		be.AddScaled(dt, dxfn, float32(s))
		dxfn = dt
	}
	be.RMSNormBackward(dxf, d.Norm.G, dxfn, acts.xf, d.Norm.W, eps)
	dx := be.Zeros(len(b.Tokens), d.HiddenSize)
	be.EmbeddingBackward(dx, dxf, b.LossRows)
	for li := len(d.Layers) - 1; li >= 0; li-- {
		l, a := &d.Layers[li], &acts.layers[li]
		if o.Recompute {
			if li+1 < len(d.Layers) {
				acts.layers[li+1] = devLayerAct{} // done with: let it go
			}
			d.layerForward(li, a.x, b, o, a)
		}
		at, mlp := &l.Attn, &l.MLP
		// y = xMid + Down(act): dxMid starts as dy (dx's buffer, reused).
		dact := be.Zeros(a.act.Shape()...)
		d.linearBackward(&mlp.Down, dact, dx, o, &a.lin.down)
		dgate, dup := be.Zeros(a.gate.Shape()...), be.Zeros(a.up.Shape()...)
		be.SiLUMulBackward(dgate, dup, dact, a.gate, a.up)
		dxn2 := be.Zeros(a.xn2.Shape()...)
		d.linearBackward(&mlp.Gate, dxn2, dgate, o, &a.lin.gate)
		d.linearBackward(&mlp.Up, dxn2, dup, o, &a.lin.up)
		be.RMSNormBackward(dx, grad(l.MLPNorm), dxn2, a.xMid, l.MLPNorm.W, eps)
		// xMid = x + O(att): dx carries on as d(x).
		datt := be.Zeros(a.att.Shape()...)
		d.linearBackward(&at.O, datt, dx, o, &a.lin.o)
		dq, dk, dv := be.Zeros(a.q.Shape()...), be.Zeros(a.k.Shape()...), be.Zeros(a.v.Shape()...)
		for _, s := range b.Segs {
			n := s.Hi - s.Lo
			kk, vv := d.segmentKV(a.k, s), d.segmentKV(a.v, s)
			out := be.Rows(a.att, s.Lo, s.Hi)
			if s.Prefix == 0 {
				be.AttentionBackward(be.Rows(dq, s.Lo, s.Hi), be.Rows(dk, s.Lo, s.Hi), be.Rows(dv, s.Lo, s.Hi),
					be.Rows(datt, s.Lo, s.Hi), out, be.Rows(a.q, s.Lo, s.Hi), kk, vv, 0, d.Heads, d.KVHeads, d.HeadDim)
				continue
			}
			dkk, dvv := be.Zeros(kk.Shape()...), be.Zeros(vv.Shape()...)
			be.AttentionBackward(be.Rows(dq, s.Lo, s.Hi), dkk, dvv, be.Rows(datt, s.Lo, s.Hi), out,
				be.Rows(a.q, s.Lo, s.Hi), kk, vv, s.Prefix, d.Heads, d.KVHeads, d.HeadDim)
			p := s.Prefix
			be.AddScaled(be.Rows(dk, 0, p), be.Rows(dkk, 0, p), 1)
			be.AddScaled(be.Rows(dv, 0, p), be.Rows(dvv, 0, p), 1)
			be.AddScaled(be.Rows(dk, s.Lo, s.Hi), be.Rows(dkk, p, p+n), 1)
			be.AddScaled(be.Rows(dv, s.Lo, s.Hi), be.Rows(dvv, p, p+n), 1)
		}
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
	if d.Embed.G != nil {
		be.EmbeddingBackward(d.Embed.G, dx, b.Tokens)
	}
}

// ZeroGrad clears the gradients.
func (d *Replica) ZeroGrad() {
	for _, p := range d.Params {
		d.be.Zero(p.G)
	}
}

// Step clips the gradients to the global norm maxNorm (0: no clipping),
// takes AdamW step number stepN (1-based, for the bias corrections) at
// rate lr, and clears the gradients. The squared norm stays on the
// device; SumSq returns it for logging.
//
// owned, if not nil, limits the update to the parameters it marks (the
// replica's share under a sharded optimiser); the others' gradients are only
// cleared. The clipping norm is over every gradient either way.
func (d *Replica) Step(c optim.AdamWConfig, stepN int, lr, maxNorm float64, owned []bool) kernels.Tensor {
	be := d.be
	ss := be.Zeros(1)
	for _, p := range d.Params {
		be.SumSquares(ss, p.G)
	}
	for j, p := range d.Params {
		if owned != nil && !owned[j] {
			be.Zero(p.G)
			continue
		}
		if p.M == nil {
			p.M, p.V = be.Zeros(p.W.Shape()...), be.Zeros(p.W.Shape()...)
		}
		s := c.Step(stepN, lr, p.Decay)
		s.MaxNorm = maxNorm
		be.AdamW(p.W, p.G, p.M, p.V, ss, s)
		be.Zero(p.G)
	}
	return ss
}

// Download copies the trainable parameters back into w (the host master
// copy that rollouts and checkpoints read) and, when opt is not nil, the
// moments into it.
func (d *Replica) Download(w *Weights[float32], opt *optim.AdamW) {
	for _, nv := range w.Trainable() {
		copy(nv.V.Val, d.be.ToHost(d.all[nv.Name].W))
	}
	if opt != nil {
		d.DownloadMoments(opt)
	}
}

// DownloadMoments copies into opt the moments this replica holds (all of
// them, or its share under a sharded optimiser).
func (d *Replica) DownloadMoments(opt *optim.AdamW) {
	for _, p := range d.Params {
		if p.M != nil {
			opt.M[p.Name], opt.V[p.Name] = d.be.ToHost(p.M), d.be.ToHost(p.V)
		}
	}
}

// LoadMoments sets the AdamW moments the host optimiser holds (a resumed
// run's) for the parameters owned marks (nil: all); parameters without
// any start from zero at the first step.
func (d *Replica) LoadMoments(opt *optim.AdamW, owned []bool) {
	for j, p := range d.Params {
		if owned != nil && !owned[j] {
			continue
		}
		if m, v := opt.M[p.Name], opt.V[p.Name]; m != nil {
			p.M, p.V = d.be.FromHost(m, p.W.Shape()...), d.be.FromHost(v, p.W.Shape()...)
		}
	}
}
