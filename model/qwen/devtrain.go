package qwen

import (
	"fmt"
	"math/rand/v2"

	"github.com/agemem/agemem/kernels"
	"github.com/agemem/agemem/model/optim"
	"github.com/agemem/agemem/model/tape"
)

// DeviceTrainer trains the decoder where a kernels.Trainer backend keeps
// it: the parameters, their gradients and AdamW moments live on the
// device, and a step (forward, backward, clipping, update) launches
// kernels without reading anything back. The forward and backward are
// written out layer by layer, as llm.c does, over the same architecture
// as Weights.LogProbs on the tape, which the tests hold it to.
type DeviceTrainer struct {
	Config
	be     kernels.Trainer
	Params []*DeviceParam // trainable ones, in Weights.Trainable order
	all    map[string]*DeviceParam
	embed  *DeviceParam
	norm   *DeviceParam
	lmHead *DeviceParam
	layers []devLayer
}

// DeviceParam is one parameter on the device; G, M and V are nil when it
// is frozen.
type DeviceParam struct {
	Name       string
	W, G, M, V kernels.Tensor
	Decay      bool
}

type devLinear struct {
	w, b, a, lb    *DeviceParam
	scale, dropout float64
}

type devLayer struct {
	attnNorm, mlpNorm, qNorm, kNorm *DeviceParam
	lin                             [7]devLinear // Q K V O Gate Up Down
}

// NewDeviceTrainer uploads w's parameters (and adapter) to be. Only
// float32 weights train.
func NewDeviceTrainer(be kernels.Trainer, w *Weights[float32]) *DeviceTrainer {
	d := &DeviceTrainer{Config: w.Config, be: be, all: map[string]*DeviceParam{}}
	for _, nv := range w.Named {
		p := &DeviceParam{Name: nv.Name, W: be.FromHost(nv.V.Val, nv.V.Rows, nv.V.Cols)}
		if nv.V.Requires {
			p.G = be.Zeros(nv.V.Rows, nv.V.Cols)
			p.Decay = optim.DecayFor(nv.Name)
			d.Params = append(d.Params, p)
		}
		d.all[nv.Name] = p
	}
	get := func(name string) *DeviceParam { return d.all[name] }
	d.embed, d.norm = get("model.embed_tokens.weight"), get("model.norm.weight")
	d.lmHead = d.embed
	if !w.TieEmbeddings {
		d.lmHead = get("lm_head.weight")
	}
	for i := range w.Layers {
		src := &w.Layers[i]
		p := fmt.Sprintf("model.layers.%d.", i)
		l := devLayer{attnNorm: get(p + "input_layernorm.weight"), mlpNorm: get(p + "post_attention_layernorm.weight")}
		if src.QNorm != nil {
			l.qNorm, l.kNorm = get(p+"self_attn.q_norm.weight"), get(p+"self_attn.k_norm.weight")
		}
		for j, s := range src.linears() {
			dl := devLinear{w: get(s.Module + ".weight"), scale: s.Scale, dropout: s.Dropout}
			if s.B != nil {
				dl.b = get(s.Module + ".bias")
			}
			if s.A != nil {
				dl.a = get("base_model.model." + s.Module + ".lora_A.weight")
				dl.lb = get("base_model.model." + s.Module + ".lora_B.weight")
			}
			l.lin[j] = dl
		}
		d.layers = append(d.layers, l)
	}
	return d
}

// Backend is the device the trainer runs on.
func (d *DeviceTrainer) Backend() kernels.Trainer { return d.be }

// devLinAct is what one projection's backward needs from its forward.
type devLinAct struct {
	in, xd, xa kernels.Tensor // input; LoRA: dropout(input) and its A product
	mask       kernels.Tensor // LoRA dropout mask (scaled), nil without
}

// devLayerAct holds one layer's forward activations for its backward.
type devLayerAct struct {
	x, xn1, qPre, kPre, q, k, v, att, xMid, xn2, gate, up, act kernels.Tensor
	lin                                                        [7]devLinAct
}

// DeviceActs is a forward's saved state: pass it to Backward.
type DeviceActs struct {
	b             Batch
	o             TrainOptions
	layers        []devLayerAct
	x, xf, xfn    kernels.Tensor
	logits        kernels.Tensor
	LogProbs, Ent kernels.Tensor // [len(LossRows)], the learned tokens' log-probabilities and entropies
}

// Forward runs the batch and returns the learned tokens' log-probabilities
// (acts.LogProbs) and entropies, keeping what Backward needs.
func (d *DeviceTrainer) Forward(b Batch, o TrainOptions) *DeviceActs {
	be := d.be
	h := d.HiddenSize
	n := len(b.Tokens)
	for _, id := range b.Tokens {
		if id < 0 || id >= d.VocabSize {
			panic(fmt.Sprintf("token id %d outside the vocabulary of %d", id, d.VocabSize))
		}
	}
	acts := &DeviceActs{b: b, o: o}
	x := be.Zeros(n, h)
	be.Embedding(x, d.embed.W, b.Tokens)
	for li := range d.layers {
		var a devLayerAct
		x = d.layerForward(li, x, b, o, &a)
		acts.layers = append(acts.layers, a)
	}
	acts.x = x
	m := len(b.LossRows)
	acts.xf, acts.xfn = be.Zeros(m, h), be.Zeros(m, h)
	be.Embedding(acts.xf, x, b.LossRows)
	be.RMSNorm(acts.xfn, acts.xf, d.norm.W, float32(d.RMSNormEps))
	acts.logits = be.Zeros(m, d.VocabSize)
	be.MatMul(acts.logits, acts.xfn, d.lmHead.W, nil)
	acts.LogProbs, acts.Ent = be.Zeros(m), be.Zeros(m)
	be.LogProbs(acts.LogProbs, acts.Ent, acts.logits, b.Targets)
	return acts
}

func (d *DeviceTrainer) linear(p *devLinear, x kernels.Tensor, li, k int, o TrainOptions, act *devLinAct) kernels.Tensor {
	be := d.be
	rows := x.Shape()[0]
	y := be.Zeros(rows, p.w.W.Shape()[0])
	var bias kernels.Tensor
	if p.b != nil {
		bias = p.b.W
	}
	be.MatMul(y, x, p.w.W, bias)
	act.in = x
	if p.a == nil || o.NoAdapter {
		return y
	}
	xd := x
	if o.Dropout && p.dropout > 0 {
		// The tape's mask, from the same generator and seed, so that a run
		// on either side draws the same adapter noise.
		r := rand.New(rand.NewPCG(o.Seed^uint64(li*16+k+1)*0x9e3779b97f4a7c15, 0x64726f70))
		mask := make([]float32, x.Len())
		scale := float32(1 / (1 - p.dropout))
		for i := range mask {
			if r.Float64() >= p.dropout {
				mask[i] = scale
			}
		}
		act.mask = be.FromHost(mask, x.Shape()...)
		xd = be.Zeros(x.Shape()...)
		be.Mul(xd, x, act.mask)
	}
	act.xd = xd
	act.xa = be.Zeros(rows, p.a.W.Shape()[0])
	be.MatMul(act.xa, xd, p.a.W, nil)
	lo := be.Zeros(y.Shape()...)
	be.MatMul(lo, act.xa, p.lb.W, nil)
	be.AddScaled(y, lo, float32(p.scale))
	return y
}

// linearBackward accumulates into dx (and the parameters' gradients) the
// backward of linear given dy.
func (d *DeviceTrainer) linearBackward(p *devLinear, dx, dy kernels.Tensor, o TrainOptions, act *devLinAct) {
	be := d.be
	var db kernels.Tensor
	if p.b != nil {
		db = p.b.G
	}
	be.MatMulBackward(dx, p.w.G, db, dy, act.in, p.w.W)
	if p.a == nil || o.NoAdapter {
		return
	}
	dys := be.Zeros(dy.Shape()...)
	be.AddScaled(dys, dy, float32(p.scale))
	dxa := be.Zeros(act.xa.Shape()...)
	be.MatMulBackward(dxa, p.lb.G, nil, dys, act.xa, p.lb.W)
	if act.mask == nil {
		be.MatMulBackward(dx, p.a.G, nil, dxa, act.xd, p.a.W)
		return
	}
	dxd := be.Zeros(act.xd.Shape()...)
	be.MatMulBackward(dxd, p.a.G, nil, dxa, act.xd, p.a.W)
	be.Mul(dxd, dxd, act.mask)
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
func (d *DeviceTrainer) segmentKV(x kernels.Tensor, s tape.Segment) kernels.Tensor {
	if s.Prefix == 0 {
		return d.be.Rows(x, s.Lo, s.Hi)
	}
	c := d.be.Zeros(s.Prefix+s.Hi-s.Lo, x.Shape()[1])
	d.be.CopyRows(c, 0, x, 0, s.Prefix)
	d.be.CopyRows(c, s.Prefix, x, s.Lo, s.Hi-s.Lo)
	return c
}

func (d *DeviceTrainer) layerForward(li int, x kernels.Tensor, b Batch, o TrainOptions, a *devLayerAct) kernels.Tensor {
	be, l := d.be, &d.layers[li]
	n, h, eps := len(b.Tokens), d.HiddenSize, float32(d.RMSNormEps)
	a.x = x
	a.xn1 = be.Zeros(n, h)
	be.RMSNorm(a.xn1, x, l.attnNorm.W, eps)
	q := d.linear(&l.lin[0], a.xn1, li, 0, o, &a.lin[0])
	k := d.linear(&l.lin[1], a.xn1, li, 1, o, &a.lin[1])
	a.v = d.linear(&l.lin[2], a.xn1, li, 2, o, &a.lin[2])
	if l.qNorm != nil {
		a.qPre, a.kPre = q, k
		q, k = be.Zeros(q.Shape()...), be.Zeros(k.Shape()...)
		be.RMSNorm(q, a.qPre, l.qNorm.W, eps)
		be.RMSNorm(k, a.kPre, l.kNorm.W, eps)
	}
	be.Rope(q, b.Pos, d.Heads, d.HeadDim, d.RopeTheta)
	be.Rope(k, b.Pos, d.KVHeads, d.HeadDim, d.RopeTheta)
	a.q, a.k = q, k
	a.att = be.Zeros(n, d.Heads*d.HeadDim)
	for _, s := range b.Segs {
		be.Attention(be.Rows(a.att, s.Lo, s.Hi), be.Rows(q, s.Lo, s.Hi), d.segmentKV(k, s), d.segmentKV(a.v, s), nil, s.Prefix, d.Heads, d.KVHeads, d.HeadDim)
	}
	a.xMid = d.linear(&l.lin[3], a.att, li, 3, o, &a.lin[3])
	be.Add(a.xMid, x)
	a.xn2 = be.Zeros(n, h)
	be.RMSNorm(a.xn2, a.xMid, l.mlpNorm.W, eps)
	a.gate = d.linear(&l.lin[4], a.xn2, li, 4, o, &a.lin[4])
	a.up = d.linear(&l.lin[5], a.xn2, li, 5, o, &a.lin[5])
	a.act = be.Zeros(a.gate.Shape()...)
	be.SiLUMul(a.act, a.gate, a.up)
	y := d.linear(&l.lin[6], a.act, li, 6, o, &a.lin[6])
	be.Add(y, a.xMid)
	return y
}

// Backward accumulates into the parameters' gradients the gradient of
// Σ dLogp[i]·logp[i] (dLogp [len(LossRows)], on the device).
func (d *DeviceTrainer) Backward(acts *DeviceActs, dLogp kernels.Tensor) {
	be := d.be
	b, o := acts.b, acts.o
	eps := float32(d.RMSNormEps)
	m := len(b.LossRows)
	dlogits := be.Zeros(m, d.VocabSize)
	be.LogProbsBackward(dlogits, dLogp, acts.logits, b.Targets)
	dxfn, dxf := be.Zeros(m, d.HiddenSize), be.Zeros(m, d.HiddenSize)
	be.MatMulBackward(dxfn, d.lmHead.G, nil, dlogits, acts.xfn, d.lmHead.W)
	be.RMSNormBackward(dxf, d.norm.G, dxfn, acts.xf, d.norm.W, eps)
	dx := be.Zeros(len(b.Tokens), d.HiddenSize)
	be.EmbeddingBackward(dx, dxf, b.LossRows)
	for li := len(d.layers) - 1; li >= 0; li-- {
		l, a := &d.layers[li], &acts.layers[li]
		// y = xMid + Down(act): dxMid starts as dy (dx's buffer, reused).
		dact := be.Zeros(a.act.Shape()...)
		d.linearBackward(&l.lin[6], dact, dx, o, &a.lin[6])
		dgate, dup := be.Zeros(a.gate.Shape()...), be.Zeros(a.up.Shape()...)
		be.SiLUMulBackward(dgate, dup, dact, a.gate, a.up)
		dxn2 := be.Zeros(a.xn2.Shape()...)
		d.linearBackward(&l.lin[4], dxn2, dgate, o, &a.lin[4])
		d.linearBackward(&l.lin[5], dxn2, dup, o, &a.lin[5])
		be.RMSNormBackward(dx, grad(l.mlpNorm), dxn2, a.xMid, l.mlpNorm.W, eps)
		// xMid = x + O(att): dx carries on as d(x).
		datt := be.Zeros(a.att.Shape()...)
		d.linearBackward(&l.lin[3], datt, dx, o, &a.lin[3])
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
		if l.qNorm != nil {
			dqp, dkp := be.Zeros(dq.Shape()...), be.Zeros(dk.Shape()...)
			be.RMSNormBackward(dqp, grad(l.qNorm), dq, a.qPre, l.qNorm.W, eps)
			be.RMSNormBackward(dkp, grad(l.kNorm), dk, a.kPre, l.kNorm.W, eps)
			dq, dk = dqp, dkp
		}
		dxn1 := be.Zeros(a.xn1.Shape()...)
		d.linearBackward(&l.lin[0], dxn1, dq, o, &a.lin[0])
		d.linearBackward(&l.lin[1], dxn1, dk, o, &a.lin[1])
		d.linearBackward(&l.lin[2], dxn1, dv, o, &a.lin[2])
		be.RMSNormBackward(dx, grad(l.attnNorm), dxn1, a.x, l.attnNorm.W, eps)
	}
	if d.embed.G != nil {
		be.EmbeddingBackward(d.embed.G, dx, b.Tokens)
	}
}

// ZeroGrad clears the gradients.
func (d *DeviceTrainer) ZeroGrad() {
	for _, p := range d.Params {
		d.be.Zero(p.G)
	}
}

// Step clips the gradients to the global norm maxNorm (0: no clipping),
// takes AdamW step number stepN (1-based, for the bias corrections) at
// rate lr, and clears the gradients. The squared norm stays on the
// device; SumSq returns it for logging.
func (d *DeviceTrainer) Step(c optim.AdamWConfig, stepN int, lr, maxNorm float64) kernels.Tensor {
	be := d.be
	ss := be.Zeros(1)
	for _, p := range d.Params {
		be.SumSquares(ss, p.G)
	}
	for _, p := range d.Params {
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
func (d *DeviceTrainer) Download(w *Weights[float32], opt *optim.AdamW) {
	for _, nv := range w.Trainable() {
		p := d.all[nv.Name]
		copy(nv.V.Val, d.be.ToHost(p.W))
		if opt != nil && p.M != nil {
			opt.M[nv.Name], opt.V[nv.Name] = d.be.ToHost(p.M), d.be.ToHost(p.V)
		}
	}
}

// LoadMoments sets the AdamW moments the host optimiser holds (a resumed
// run's); parameters without any start from zero at the first step.
func (d *DeviceTrainer) LoadMoments(opt *optim.AdamW) {
	for _, p := range d.Params {
		if m, v := opt.M[p.Name], opt.V[p.Name]; m != nil {
			p.M, p.V = d.be.FromHost(m, p.W.Shape()...), d.be.FromHost(v, p.W.Shape()...)
		}
	}
}
