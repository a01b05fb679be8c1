package train

import (
	"fmt"

	"github.com/agemem/agemem/internal/par"
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
	// stashBF16 keeps recomputation's layer-input checkpoints in bf16
	// (with a bf16 base: mixed precision).
	stashBF16 bool
	// stages, when set (ZeRO-2, Parallel), is told where Backward stands.
	stages gradStages
	// working: the trainable matrices' W are bf16 working copies (ZeRO-2
	// under bf16), their float32 masters on the devices that own them.
	working bool
	// host, when set, holds the layers' (frozen) parameters in host
	// memory: an offloaded reference, a layer on the device at a time.
	host hostLayers
}

// hostLayers are a frozen model's layer parameters in host memory, as the
// devices would hold them, by layer; replicas on several devices share one.
type hostLayers [][]hostParam

type hostParam struct {
	name string
	w    kernels.Weight // a matrix (bf16 bits under a bf16 base)
	vec  []float32      // or a vector (a norm's weight, a bias) of w's shape
}

// newHostLayers keeps w's layer parameters for uploading as NewReplica
// would hold them: frozen matrices rounded to bf16 once when the base is
// held so, the rest as they are.
func newHostLayers(w *Weights[float32], base Base) hostLayers {
	h := make(hostLayers, w.Config.Layers)
	layerOf := map[string]int{}
	for _, p := range qwen.Params(w.Config) {
		layerOf[p.Name] = p.Layer
	}
	for _, nv := range w.Named {
		l, ok := layerOf[nv.Name]
		if !ok || l < 0 {
			continue
		}
		v := nv.V
		hp := hostParam{name: nv.Name}
		switch {
		case v.Rows <= 1 || v.Cols <= 1:
			hp.vec, hp.w = v.Val, kernels.Weight{Rows: v.Rows, Cols: v.Cols}
		case base == BaseF32 || v.Requires:
			hp.w = kernels.Weight{Rows: v.Rows, Cols: v.Cols, F32: v.Val}
		default:
			bits := make([]uint16, len(v.Val))
			for i, x := range v.Val {
				bits[i] = half.F32ToBF16(x)
			}
			hp.w = kernels.Weight{Rows: v.Rows, Cols: v.Cols, BF16: bits}
		}
		h[l] = append(h[l], hp)
	}
	return h
}

// load uploads layer li's parameters to d's device; drop lets them go.
func (h hostLayers) load(d *Replica, li int) {
	for _, hp := range h[li] {
		p := d.all[hp.name]
		if hp.vec != nil {
			p.W = d.be.FromHost(hp.vec, hp.w.Rows, hp.w.Cols)
		} else {
			p.W = d.be.Upload(hp.w)
		}
	}
}

func (h hostLayers) drop(d *Replica, li int) {
	for _, hp := range h[li] {
		d.all[hp.name].W = nil
	}
}

// DeviceParam is one parameter on the device; G, M and V are nil when it
// is frozen. Master is the float32 weight AdamW updates when W is a bf16
// working copy of it (ZeRO-2 under bf16, on the device that owns it; nil
// elsewhere and otherwise). Under ZeRO-2 a parameter another device owns
// has a G only while the backward makes its gradient.
type DeviceParam struct {
	Name               string
	W, Master, G, M, V kernels.Tensor
	Decay              bool
}

// master is the float32 weight that AdamW updates and checkpoints read.
func (p *DeviceParam) master() kernels.Tensor {
	if p.Master != nil {
		return p.Master
	}
	return p.W
}

// gradStages is told, around each stage of a backward pass, which stage
// it is: before(s) must give each gradient stage s writes a buffer,
// after(s) may take them (sum them onto their owner, ZeRO-2). The stages
// run in order: 0 the LM head and final norm, then 1+(L−1−li) for layer
// li from the last, then L+1 the embedding.
type gradStages interface {
	before(d *Replica, s int)
	after(d *Replica, s int)
}

// stage tells d.stages that stage s begins (before) or ends.
func (d *Replica) stage(s int, before bool) {
	switch {
	case d.stages == nil:
	case before:
		d.stages.before(d, s)
	default:
		d.stages.after(d, s)
	}
}

// stageParams lists the trainable parameters (indices into Params) whose
// gradient each backward stage writes; the tied embedding is in the
// head's stage and the embedding's.
func (d *Replica) stageParams() [][]int {
	index := map[*DeviceParam]int{}
	for j, p := range d.Params {
		index[p] = j
	}
	L := len(d.Layers)
	out := make([][]int, L+2)
	add := func(s int, ps ...*DeviceParam) {
		for _, p := range ps {
			if j, ok := index[p]; ok {
				out[s] = append(out[s], j)
			}
		}
	}
	add(0, d.Norm, d.LMHead)
	for li := range d.Layers {
		l := &d.Layers[li]
		s := 1 + L - 1 - li
		add(s, l.AttnNorm, l.MLPNorm, l.Attn.QNorm, l.Attn.KNorm)
		for _, lin := range []*devLinear{&l.Attn.Q, &l.Attn.K, &l.Attn.V, &l.Attn.O, &l.MLP.Gate, &l.MLP.Up, &l.MLP.Down} {
			add(s, lin.W, lin.B, lin.A, lin.LB)
		}
	}
	add(L+1, d.Embed)
	return out
}

// Base is how a replica holds its frozen weight matrices (the base under
// LoRA); trainable parameters, norms and biases are float32 whatever it is.
type Base int

const (
	// BaseF32 holds them as float32.
	BaseF32 Base = iota
	// BaseBF16 holds them in bfloat16, half the bytes of the largest item
	// on the device. Mixed-precision training (model.train_dtype: bf16)
	// rounds every GEMM input to bf16 anyway, so it loses nothing there.
	BaseBF16
	// BaseQ8 holds the layers' projections (q, k, v, o, gate, up, down) as
	// Q8_0 blocks, GGUF's 8-bit type (model.train_dtype: q8_0): 32 int8
	// values and a float32 scale a block, 36 bytes where f32 takes 128.
	// Each GEMM reads them widened to bf16 (on a GPU) or, on the CPU, as
	// ggml's q8_0 matmul does. The embedding table and LM head stay bf16, as
	// QLoRA keeps them in 16 bits; a projection whose rows are not a
	// multiple of 32 values cannot be blocked and stays bf16 too.
	BaseQ8
)

// NewReplica uploads w's parameters (and adapter) to be, the frozen ones
// held as base says. Only float32 weights train. With a 16- or 8-bit base,
// recomputation keeps its layer-input checkpoints in bf16 too.
func NewReplica(be kernels.TrainBackend, w *Weights[float32], base Base) *Replica {
	return newReplica(be, w, base, nil)
}

// newReplica is NewReplica; with host, the layers' parameters stay in host
// memory (host holds them) and Forward uploads one layer at a time.
func newReplica(be kernels.TrainBackend, w *Weights[float32], base Base, host hostLayers) *Replica {
	d := &Replica{be: be, all: map[string]*DeviceParam{}, stashBF16: base != BaseF32, host: host}
	layerOf := map[string]int{}
	if host != nil {
		for _, p := range qwen.Params(w.Config) {
			layerOf[p.Name] = p.Layer
		}
	}
	q8 := map[string]bool{}
	if base == BaseQ8 {
		for _, l := range w.Linears() {
			q8[l.Module+".weight"] = true
		}
	}
	for _, nv := range w.Named {
		p := &DeviceParam{Name: nv.Name}
		v := nv.V
		frozen := !v.Requires && v.Rows > 1 && v.Cols > 1
		if l, ok := layerOf[nv.Name]; ok && l >= 0 {
			d.all[nv.Name] = p // uploaded by Forward, layer by layer
			continue
		}
		switch {
		case frozen && q8[nv.Name] && v.Cols%kernels.QK8 == 0:
			q, err := kernels.QuantizeQ8(kernels.Weight{Rows: v.Rows, Cols: v.Cols, F32: v.Val})
			if err != nil {
				panic(err) // the columns were checked above
			}
			p.W = be.Upload(q)
		case frozen && base != BaseF32:
			bits := make([]uint16, len(v.Val))
			par.For(len(bits), 1<<22, func(lo, hi int) {
				for i, x := range v.Val[lo:hi] {
					bits[lo+i] = half.F32ToBF16(x)
				}
			})
			p.W = be.Upload(kernels.Weight{Rows: v.Rows, Cols: v.Cols, BF16: bits})
		default:
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

// ReplicaActs is a forward's saved state: pass it to Backward.
type ReplicaActs struct {
	b             Batch
	ids           []int // 0, 1, ..., tokens-1: the rows a bf16 checkpoint widens
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
		if d.host != nil {
			d.host.load(d, li)
		}
		y := d.layerForward(li, x, b, o, &a)
		if d.host != nil {
			d.host.drop(d, li)
		}
		if o.Recompute {
			// Keep the layer's input only; Backward runs the layer again
			// (same dropout masks: they are seeded) before its backward.
			a = devLayerAct{x: x}
			if d.stashBF16 {
				a = devLayerAct{xs: be.NarrowBF16(x)}
			}
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

// rowIDs are 0..tokens-1, the rows Embedding widens a bf16 checkpoint by.
func (a *ReplicaActs) rowIDs() []int {
	if a.ids == nil {
		a.ids = make([]int, len(a.b.Tokens))
		for i := range a.ids {
			a.ids[i] = i
		}
	}
	return a.ids
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

// linear runs p on x; xo is x as the GEMMs read it (GEMMOperand(x), made
// once where several projections read x, or x).
func (d *Replica) linear(p *devLinear, x, xo kernels.Tensor, o TrainOptions, act *devLinAct) kernels.Tensor {
	be := d.be
	y := be.Empty(x.Shape()[0], p.Out)
	var bias kernels.Tensor
	if p.B != nil {
		bias = p.B.W
	}
	be.MatMul(y, xo, p.W.W, bias)
	if xa := d.linearIn(p, x, xo, o, act); xa != nil {
		be.MatMulAdd(y, xa, p.LB.W, float32(p.Scale))
	}
	return y
}

// linearIn records what linear's backward needs of its input x: x itself
// and, under LoRA, dropout(x)·A, which it returns (nil without an adapter).
func (d *Replica) linearIn(p *devLinear, x, xo kernels.Tensor, o TrainOptions, act *devLinAct) kernels.Tensor {
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
	act.xa = be.Empty(x.Shape()[0], p.A.W.Shape()[0])
	be.MatMul(act.xa, xd, p.A.W, nil)
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

// layerForward runs decoder layer li on x, keeping in a what its backward
// needs (all of it: Forward drops it under recomputation).
func (d *Replica) layerForward(li int, x kernels.Tensor, b Batch, o TrainOptions, a *devLayerAct) kernels.Tensor {
	be := d.be
	d.attnForward(li, x, b, o, a)
	n := len(b.Tokens)
	var y kernels.Tensor
	if chunk := d.mlpChunk(o, n); chunk < n {
		// Row by row the MLP is independent: a chunk's intermediates
		// (three of intermediate_size wide, the widest thing in a layer)
		// exist at a time.
		y = be.Zeros(n, d.HiddenSize)
		for lo := 0; lo < n; lo += chunk {
			hi := min(lo+chunk, n)
			var m mlpAct
			be.CopyRows(y, lo, d.mlpForward(li, be.Rows(a.xn2, lo, hi), chunkOptions(o, lo), &m, true), 0, hi-lo)
		}
	} else {
		y = d.mlpForward(li, a.xn2, o, &a.mlp, true)
	}
	be.Add(y, a.xMid)
	return y
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

// mlpForward runs layer li's MLP on xn2 (rows of the normed residual),
// keeping its state in m, and returns Down's output (without the
// residual), or with out false only what Down's backward needs (nil).
func (d *Replica) mlpForward(li int, xn2 kernels.Tensor, o TrainOptions, m *mlpAct, out bool) kernels.Tensor {
	mlp := &d.Layers[li].MLP
	xo := d.be.GEMMOperand(xn2) // Gate's and Up's
	m.gate = d.linear(&mlp.Gate, xn2, xo, o, &m.lin.gate)
	m.up = d.linear(&mlp.Up, xn2, xo, o, &m.lin.up)
	m.act = d.be.Empty(m.gate.Shape()...)
	d.be.SiLUMul(m.act, m.gate, m.up)
	if !out {
		d.linearIn(&mlp.Down, m.act, m.act, o, &m.lin.down)
		return nil
	}
	return d.linear(&mlp.Down, m.act, m.act, o, &m.lin.down)
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

// attnForward runs layer li's attention half on x: a holds it, up to xMid
// (x plus attention) and xn2 (the MLP's normed input).
func (d *Replica) attnForward(li int, x kernels.Tensor, b Batch, o TrainOptions, a *devLayerAct) {
	be, l := d.be, &d.Layers[li]
	n, h, eps := len(b.Tokens), d.HiddenSize, float32(d.RMSNormEps)
	at := &l.Attn
	a.x = x
	a.xn1 = be.Empty(n, h)
	be.RMSNorm(a.xn1, x, l.AttnNorm.W, eps)
	xo := be.GEMMOperand(a.xn1) // Q's, K's and V's
	q := d.linear(&at.Q, a.xn1, xo, o, &a.lin.q)
	k := d.linear(&at.K, a.xn1, xo, o, &a.lin.k)
	a.v = d.linear(&at.V, a.xn1, xo, o, &a.lin.v)
	if at.QKNorm {
		a.qPre, a.kPre = q, k
		q, k = be.Empty(q.Shape()...), be.Empty(k.Shape()...)
		be.RMSNorm(q, a.qPre, at.QNorm.W, eps)
		be.RMSNorm(k, a.kPre, at.KNorm.W, eps)
	}
	be.Rope(q, b.Pos, d.Heads, d.HeadDim, d.RopeTheta)
	be.Rope(k, b.Pos, d.KVHeads, d.HeadDim, d.RopeTheta)
	a.q, a.k = q, k
	a.att = be.Zeros(n, d.Heads*d.HeadDim)
	// A backend that keeps the rows' log-sum-exps hands them to the
	// backward, which then need not run the forward's scores again.
	lb, keep := be.(kernels.LSEAttender)
	a.lse = nil
	if keep {
		a.lse = be.Zeros(n, d.Heads)
	}
	for _, s := range b.Segs {
		out, qs, ks, vs := be.Rows(a.att, s.Lo, s.Hi), be.Rows(q, s.Lo, s.Hi), d.segmentKV(k, s), d.segmentKV(a.v, s)
		if keep {
			keep = lb.AttentionLSE(out, be.Rows(a.lse, s.Lo, s.Hi), qs, ks, vs, s.Prefix, d.Heads, d.KVHeads, d.HeadDim)
			continue
		}
		be.Attention(out, qs, ks, vs, nil, s.Prefix, d.Heads, d.KVHeads, d.HeadDim)
	}
	if !keep {
		a.lse = nil
	}
	a.xMid = d.linear(&at.O, a.att, a.att, o, &a.lin.o)
	be.Add(a.xMid, x)
	a.xn2 = be.Empty(n, h)
	be.RMSNorm(a.xn2, a.xMid, l.MLPNorm.W, eps)
}

// Backward accumulates into the parameters' gradients the gradient of
// Σ dLogp[i]·logp[i] (dLogp [len(LossRows)], on the device).
func (d *Replica) Backward(acts *ReplicaActs, dLogp kernels.Tensor) {
	if d.host != nil {
		panic("an offloaded (frozen reference) replica has no backward")
	}
	be := d.be
	b, o := acts.b, acts.o
	eps := float32(d.RMSNormEps)
	m := len(b.LossRows)
	L := len(d.Layers)
	d.stage(0, true)
	dxfn, dxf := be.Zeros(m, d.HiddenSize), be.Zeros(m, d.HiddenSize)
	d.headBackward(acts, dxfn, dLogp)
	if s, ok := o.invTemperature(); ok {
		dt := be.Zeros(m, d.HiddenSize)
		be.AddScaled(dt, dxfn, float32(s))
		dxfn = dt
	}
	be.RMSNormBackward(dxf, d.Norm.G, dxfn, acts.xf, d.Norm.W, eps)
	d.stage(0, false)
	dx := be.Zeros(len(b.Tokens), d.HiddenSize)
	be.EmbeddingBackward(dx, dxf, b.LossRows)
	n := len(b.Tokens)
	for li := L - 1; li >= 0; li-- {
		d.stage(L-li, true)
		l, a := &d.Layers[li], &acts.layers[li]
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
			// The attention half again, then the MLP chunk by chunk, each
			// chunk's forward (without Down's product, which nothing
			// reads) right before its backward.
			d.attnForward(li, x, b, o, a)
			chunk := d.mlpChunk(o, n)
			for lo := 0; lo < n; lo += chunk {
				hi := min(lo+chunk, n)
				oc := chunkOptions(o, lo)
				var m mlpAct
				d.mlpForward(li, be.Rows(a.xn2, lo, hi), oc, &m, false)
				d.mlpBackward(li, be.Rows(dxn2, lo, hi), be.Rows(dx, lo, hi), oc, &m)
			}
		} else {
			d.mlpBackward(li, dxn2, dx, o, &a.mlp)
		}
		at := &l.Attn
		be.RMSNormBackward(dx, grad(l.MLPNorm), dxn2, a.xMid, l.MLPNorm.W, eps)
		// xMid = x + O(att): dx carries on as d(x).
		datt := be.Zeros(a.att.Shape()...)
		d.linearBackward(&at.O, datt, dx, o, &a.lin.o)
		dq, dk, dv := be.Zeros(a.q.Shape()...), be.Zeros(a.k.Shape()...), be.Zeros(a.v.Shape()...)
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
		d.stage(L-li, false)
	}
	d.stage(L+1, true)
	if d.Embed.G != nil {
		be.EmbeddingBackward(d.Embed.G, dx, b.Tokens)
	}
	d.stage(L+1, false)
}

// ZeroGrad clears the gradients.
func (d *Replica) ZeroGrad() {
	for _, p := range d.Params {
		if p.G != nil {
			d.be.Zero(p.G)
		}
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
	ss := d.sumSquares(nil)
	d.apply(c, stepN, lr, maxNorm, owned, ss)
	return ss
}

// sumSquares is Σ g² over the gradients owned marks (nil: all), on the
// device.
func (d *Replica) sumSquares(owned []bool) kernels.Tensor {
	ss := d.be.Zeros(1)
	for j, p := range d.Params {
		if owned == nil || owned[j] {
			d.be.SumSquares(ss, p.G)
		}
	}
	return ss
}

// apply is Step's update given the squared global norm ss.
func (d *Replica) apply(c optim.AdamWConfig, stepN int, lr, maxNorm float64, owned []bool, ss kernels.Tensor) {
	be := d.be
	for j, p := range d.Params {
		if owned != nil && !owned[j] {
			if p.G != nil {
				be.Zero(p.G)
			}
			continue
		}
		w := p.master()
		if p.M == nil {
			p.M, p.V = be.Zeros(w.Shape()...), be.Zeros(w.Shape()...)
		}
		s := c.Step(stepN, lr, p.Decay)
		s.MaxNorm = maxNorm
		be.AdamW(w, p.G, p.M, p.V, ss, s)
		be.Zero(p.G)
	}
}

// Download copies the trainable parameters back into w (the host master
// copy that rollouts and checkpoints read) and, when opt is not nil, the
// moments into it.
func (d *Replica) Download(w *Weights[float32], opt *optim.AdamW) {
	for _, nv := range w.Trainable() {
		copy(nv.V.Val, d.be.ToHost(d.all[nv.Name].master()))
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
