package bert

import (
	"fmt"
	"math"
	"strings"

	"github.com/agemem/agemem/kernels"
	"github.com/agemem/agemem/model/optim"
)

// Trainer trains the encoder where its weights live: the parameters, their
// gradients and AdamW moments stay on a kernels.EncoderTrainer (a GPU, or
// the CPU backend that stands in for one in tests), and a step moves only
// token ids in and pooled vectors and their gradients across. The forward
// is Weights.Forward and Pool's computation without the tape; each op's
// backward is the backend's.
type Trainer struct {
	be     kernels.EncoderTrainer
	w      *Weights[float32]
	params []*trainParam
	by     map[string]*trainParam
	m      *deviceModel // the parameters as the forward reads them
}

type trainParam struct {
	name       string
	val, grad  kernels.Tensor
	mom1, mom2 kernels.Tensor
	decay      bool
	host       []float32
	shape      []int
}

// NewTrainer uploads w's parameters (float32) to be, with zeroed gradients.
// decay says which parameters AdamW's weight decay applies to.
func NewTrainer(be kernels.EncoderTrainer, w *Weights[float32], decay func(name string) bool) *Trainer {
	t := &Trainer{be: be, w: w, by: map[string]*trainParam{}}
	for _, n := range w.Named {
		shape := []int{n.V.Rows, n.V.Cols}
		if strings.HasSuffix(n.Name, ".bias") || strings.Contains(n.Name, "LayerNorm") {
			shape = []int{len(n.V.Val)}
		}
		p := &trainParam{name: n.Name, val: be.FromHost(n.V.Val, shape...), grad: be.Zeros(shape...),
			decay: decay(n.Name), host: n.V.Val, shape: shape}
		t.params = append(t.params, p)
		t.by[n.Name] = p
	}
	t.m = t.layout(func(p *trainParam) kernels.Tensor { return p.val })
	return t
}

// layout is a deviceModel over one tensor of each parameter: the values
// (what the forward reads and AdamW updates in place) or the gradients
// (where the backward adds).
func (t *Trainer) layout(of func(*trainParam) kernels.Tensor) *deviceModel {
	c := t.w.Config
	v := func(name string) kernels.Tensor { return of(t.by[name]) }
	lin := func(p string) deviceLinear { return deviceLinear{v(p + ".weight"), v(p + ".bias")} }
	m := &deviceModel{be: t.be, cfg: c, word: v("embeddings.word_embeddings.weight"), pos: v("embeddings.position_embeddings.weight"),
		typ: v("embeddings.token_type_embeddings.weight"), embLNW: v("embeddings.LayerNorm.weight"), embLNB: v("embeddings.LayerNorm.bias")}
	for i := range c.Layers {
		p := fmt.Sprintf("encoder.layer.%d.", i)
		m.layers = append(m.layers, deviceLayer{q: lin(p + "attention.self.query"), k: lin(p + "attention.self.key"),
			v: lin(p + "attention.self.value"), attnOut: lin(p + "attention.output.dense"),
			attnLNW: v(p + "attention.output.LayerNorm.weight"), attnLNB: v(p + "attention.output.LayerNorm.bias"),
			inter: lin(p + "intermediate.dense"), out: lin(p + "output.dense"),
			outLNW: v(p + "output.LayerNorm.weight"), outLNB: v(p + "output.LayerNorm.bias")})
	}
	if _, ok := t.by["pooler.dense.weight"]; ok {
		pl := lin("pooler.dense")
		m.pooler = &pl
	}
	return m
}

// layerActs are what a layer's backward reads.
type layerActs struct {
	in, q, k, v, a, pre1, x1, pre, mid, pre2 kernels.Tensor
}

// Pass is a forward pass whose backward has not run yet.
type Pass struct {
	t                    *Trainer
	ids, pos, types, cls []int
	bounds               []int
	emb                  kernels.Tensor // the embedding sum, LayerNorm's input
	layers               []layerActs
	last                 kernels.Tensor // the final hidden states
	pooledIn, pooledPre  kernels.Tensor // cls_mlp: the CLS rows and pooler(CLS)
	pooled               kernels.Tensor // [batch, hidden], not normalised
	pooling              string
	hidden, attn         float64
	seed                 uint64
}

// Forward runs batch (token ids, packed) with dropout hidden on the
// hidden states and attn on the attention probabilities, masks drawn from
// seed as the tape's Forward draws its hidden ones, and returns each
// sequence's pooled vector before L2 normalisation ([batch·hidden] on the
// host) and the pass whose Backward takes their gradient.
func (t *Trainer) Forward(batch [][]int, pooling string, hidden, attn float64, seed uint64) ([]float32, *Pass, error) {
	be, c, m := t.be, t.w.Config, t.m
	ps := &Pass{t: t, bounds: []int{0}, pooling: pooling, hidden: hidden, attn: attn, seed: seed}
	for b, seq := range batch {
		if len(seq) == 0 || len(seq) > c.MaxTokens() {
			return nil, nil, fmt.Errorf("sequence %d has %d tokens; the encoder takes 1 to %d", b, len(seq), c.MaxTokens())
		}
		ps.cls = append(ps.cls, len(ps.ids))
		for i, id := range seq {
			if id < 0 || id >= c.VocabSize {
				return nil, nil, fmt.Errorf("sequence %d: token id %d is outside the vocabulary of %d", b, id, c.VocabSize)
			}
			ps.ids, ps.pos, ps.types = append(ps.ids, id), append(ps.pos, c.PositionOffset()+i), append(ps.types, 0)
		}
		ps.bounds = append(ps.bounds, len(ps.ids))
	}
	switch pooling {
	case PoolMean, PoolCLS:
	case PoolCLSMLP:
		if m.pooler == nil {
			return nil, nil, fmt.Errorf("pooling cls_mlp needs the checkpoint's pooler.dense")
		}
	default:
		return nil, nil, fmt.Errorf("pooling %q is not one of cls, cls_mlp, mean", pooling)
	}
	n, h, hd := len(ps.ids), c.HiddenSize, c.HiddenSize/c.Heads
	eps := float32(c.LayerNormEps)
	tanh := c.HiddenAct != "gelu"
	ps.emb = be.Zeros(n, h)
	tmp := be.Zeros(n, h)
	be.Embedding(ps.emb, m.word, ps.ids)
	be.Embedding(tmp, m.pos, ps.pos)
	be.Add(ps.emb, tmp)
	be.Embedding(tmp, m.typ, ps.types)
	be.Add(ps.emb, tmp)
	x := be.Zeros(n, h)
	be.LayerNorm(x, ps.emb, m.embLNW, m.embLNB, eps)
	ps.drop(x, 0)
	for l, L := range m.layers {
		a := layerActs{in: x, q: be.Zeros(n, h), k: be.Zeros(n, h), v: be.Zeros(n, h), a: be.Zeros(n, h),
			pre1: be.Zeros(n, h), x1: be.Zeros(n, h), pre: be.Zeros(n, c.Intermediate), mid: be.Zeros(n, c.Intermediate),
			pre2: be.Zeros(n, h)}
		be.MatMul(a.q, x, L.q.w, L.q.b)
		be.MatMul(a.k, x, L.k.w, L.k.b)
		be.MatMul(a.v, x, L.v.w, L.v.b)
		be.SegmentAttentionDropout(a.a, a.q, a.k, a.v, ps.bounds, c.Heads, hd, attn, ps.attnSeed(l))
		be.MatMul(a.pre1, a.a, L.attnOut.w, L.attnOut.b)
		ps.drop(a.pre1, uint64(2*l+1))
		be.Add(a.pre1, x)
		be.LayerNorm(a.x1, a.pre1, L.attnLNW, L.attnLNB, eps)
		be.MatMul(a.pre, a.x1, L.inter.w, L.inter.b)
		be.GELU(a.mid, a.pre, tanh)
		be.MatMul(a.pre2, a.mid, L.out.w, L.out.b)
		ps.drop(a.pre2, uint64(2*l+2))
		be.Add(a.pre2, a.x1)
		x = be.Zeros(n, h)
		be.LayerNorm(x, a.pre2, L.outLNW, L.outLNB, eps)
		ps.layers = append(ps.layers, a)
	}
	ps.last = x
	ps.pooled = be.Zeros(len(batch), h)
	switch pooling {
	case PoolMean:
		be.SegmentMean(ps.pooled, x, ps.bounds)
	case PoolCLS:
		be.Embedding(ps.pooled, x, ps.cls)
	case PoolCLSMLP:
		ps.pooledIn, ps.pooledPre = be.Zeros(len(batch), h), be.Zeros(len(batch), h)
		be.Embedding(ps.pooledIn, x, ps.cls)
		be.MatMul(ps.pooledPre, ps.pooledIn, m.pooler.w, m.pooler.b)
		be.Tanh(ps.pooled, ps.pooledPre)
	}
	return be.ToHost(ps.pooled), ps, nil
}

// drop applies hidden dropout k in place (the tape's seeds: seed·1000003+k).
func (ps *Pass) drop(x kernels.Tensor, k uint64) {
	if ps.hidden > 0 {
		ps.t.be.Dropout(x, x, ps.hidden, ps.seed*1000003+k)
	}
}

func (ps *Pass) attnSeed(l int) uint64 {
	return ps.seed*1000003 + uint64(ps.t.w.Config.Layers*2+1+l)
}

// Backward adds the gradients of the parameters given dPooled, the
// gradient of the pooled vectors Forward returned ([batch·hidden]).
func (ps *Pass) Backward(dPooled []float32) error {
	be, c, m, t := ps.t.be, ps.t.w.Config, ps.t.m, ps.t
	g := t.layout(func(p *trainParam) kernels.Tensor { return p.grad })
	b, h, hd := len(ps.cls), c.HiddenSize, c.HiddenSize/c.Heads
	if len(dPooled) != b*h {
		return fmt.Errorf("bert trainer: %d pooled gradients for %d vectors of %d", len(dPooled), b, h)
	}
	n := len(ps.ids)
	eps := float32(c.LayerNormEps)
	tanh := c.HiddenAct != "gelu"
	dp := be.FromHost(dPooled, b, h)
	dx := be.Zeros(n, h)
	switch ps.pooling {
	case PoolMean:
		be.SegmentMeanBackward(dx, dp, ps.bounds)
	case PoolCLS:
		be.EmbeddingBackward(dx, dp, ps.cls)
	case PoolCLSMLP:
		dpre, dcls := be.Zeros(b, h), be.Zeros(b, h)
		be.TanhBackward(dpre, dp, ps.pooled)
		be.MatMulBackward(dcls, g.pooler.w, g.pooler.b, dpre, ps.pooledIn, m.pooler.w)
		be.EmbeddingBackward(dx, dcls, ps.cls)
	}
	for l := len(ps.layers) - 1; l >= 0; l-- {
		L, G, a := m.layers[l], g.layers[l], ps.layers[l]
		// x = LN2(drop(out(mid)) + x1)
		dpre2 := be.Zeros(n, h)
		be.LayerNormBackward(dpre2, G.outLNW, G.outLNB, dx, a.pre2, L.outLNW, eps)
		dx1 := be.Zeros(n, h)
		be.Add(dx1, dpre2)
		ps.drop(dpre2, uint64(2*l+2))
		dmid, dpre := be.Zeros(n, c.Intermediate), be.Zeros(n, c.Intermediate)
		be.MatMulBackward(dmid, G.out.w, G.out.b, dpre2, a.mid, L.out.w)
		be.GELUBackward(dpre, dmid, a.pre, tanh)
		be.MatMulBackward(dx1, G.inter.w, G.inter.b, dpre, a.x1, L.inter.w)
		// x1 = LN1(drop(attnOut(a)) + in)
		dpre1 := be.Zeros(n, h)
		be.LayerNormBackward(dpre1, G.attnLNW, G.attnLNB, dx1, a.pre1, L.attnLNW, eps)
		dx = be.Zeros(n, h)
		be.Add(dx, dpre1)
		ps.drop(dpre1, uint64(2*l+1))
		da := be.Zeros(n, h)
		be.MatMulBackward(da, G.attnOut.w, G.attnOut.b, dpre1, a.a, L.attnOut.w)
		dq, dk, dv := be.Zeros(n, h), be.Zeros(n, h), be.Zeros(n, h)
		be.SegmentAttentionBackward(dq, dk, dv, da, a.q, a.k, a.v, ps.bounds, c.Heads, hd, ps.attn, ps.attnSeed(l))
		be.MatMulBackward(dx, G.q.w, G.q.b, dq, a.in, L.q.w)
		be.MatMulBackward(dx, G.k.w, G.k.b, dk, a.in, L.k.w)
		be.MatMulBackward(dx, G.v.w, G.v.b, dv, a.in, L.v.w)
	}
	// x0 = drop(LN(word + pos + type))
	ps.drop(dx, 0)
	de := be.Zeros(n, h)
	be.LayerNormBackward(de, g.embLNW, g.embLNB, dx, ps.emb, m.embLNW, eps)
	be.EmbeddingBackward(g.word, de, ps.ids)
	be.EmbeddingBackward(g.pos, de, ps.pos)
	be.EmbeddingBackward(g.typ, de, ps.types)
	return nil
}

// Step clips the gradients to the global norm maxNorm (0: none), takes
// AdamW step number stepN at rate lr and clears the gradients; it returns
// the norm before clipping.
func (t *Trainer) Step(c optim.AdamWConfig, stepN int, lr, maxNorm float64) float64 {
	be := t.be
	ss := be.Zeros(1)
	for _, p := range t.params {
		be.SumSquares(ss, p.grad)
	}
	norm := be.ToHost(ss)[0]
	for _, p := range t.params {
		if p.mom1 == nil {
			p.mom1, p.mom2 = be.Zeros(p.shape...), be.Zeros(p.shape...)
		}
		s := c.Step(stepN, lr, p.decay)
		s.MaxNorm = maxNorm
		be.AdamW(p.val, p.grad, p.mom1, p.mom2, ss, s)
		be.Zero(p.grad)
	}
	return math.Sqrt(float64(norm))
}

// Gradients copies the accumulated gradients to the host, by name.
func (t *Trainer) Gradients() map[string][]float32 {
	out := map[string][]float32{}
	for _, p := range t.params {
		out[p.name] = t.be.ToHost(p.grad)
	}
	return out
}

// Download copies the parameters into the host weights (what Save and the
// evaluation encoder read) and, when opt is not nil, the moments into it.
func (t *Trainer) Download(opt *optim.AdamW, stepN int) {
	for _, p := range t.params {
		copy(p.host, t.be.ToHost(p.val))
		if opt != nil && p.mom1 != nil {
			opt.M[p.name], opt.V[p.name] = t.be.ToHost(p.mom1), t.be.ToHost(p.mom2)
		}
	}
	if opt != nil {
		opt.StepN = stepN
	}
}

// LoadMoments puts a resumed optimiser's moments on the device.
func (t *Trainer) LoadMoments(opt *optim.AdamW) {
	for _, p := range t.params {
		if m, ok := opt.M[p.name]; ok {
			p.mom1, p.mom2 = t.be.FromHost(m, p.shape...), t.be.FromHost(opt.V[p.name], p.shape...)
		}
	}
}
