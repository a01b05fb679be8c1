package train

import (
	"fmt"

	"github.com/agemem/agemem/kernels"
)

// A replica's forward and backward over the whole model: the embedding,
// the layers (block.go), the final norm and the LM head.

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
		y := d.layer(li, x, b, o, &a, nil)
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

// Backward accumulates into the parameters' gradients the gradient of
// Σ dLogp[i]·logp[i] (dLogp [len(LossRows)], on the device).
func (d *Replica) Backward(acts *ReplicaActs, dLogp kernels.Tensor) {
	if d.host != nil {
		panic("an offloaded (frozen reference) replica has no backward")
	}
	be := d.be
	b, o := acts.b, acts.o
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
	be.RMSNormBackward(dxf, d.Norm.G, dxfn, acts.xf, d.Norm.W, float32(d.RMSNormEps))
	d.stage(0, false)
	dx := be.Zeros(len(b.Tokens), d.HiddenSize)
	be.EmbeddingBackward(dx, dxf, b.LossRows)
	for li := L - 1; li >= 0; li-- {
		d.stage(L-li, true)
		d.layerBackward(li, acts, dx)
		d.stage(L-li, false)
	}
	d.stage(L+1, true)
	if d.Embed.G != nil {
		be.EmbeddingBackward(d.Embed.G, dx, b.Tokens)
	}
	d.stage(L+1, false)
}
