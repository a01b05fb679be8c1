package qwen

import (
	"fmt"
	"io"

	"github.com/agemem/agemem/kernels"
	"github.com/agemem/agemem/kernels/cpu"
	"github.com/agemem/agemem/model/safetensors"
)

// Linear is y = x Wᵀ + b with W[out, in] as PyTorch stores it, plus a
// LoRA path s·(x Aᵀ) Bᵀ when an adapter is applied (s folded into LoraB).
type Linear struct {
	W kernels.Tensor
	B kernels.Tensor // nil without bias

	LoraA, LoraB kernels.Tensor // [r, in], [out, r]; nil without an adapter
}

// Forward maps x[t, in] to y[t, out].
func (l *Linear) Forward(be kernels.Backend, y, x kernels.Tensor) {
	be.MatMul(y, x, l.W, l.B)
	if l.LoraA != nil {
		t := x.Shape()[0]
		h := be.Zeros(t, l.LoraA.Shape()[0])
		be.MatMul(h, x, l.LoraA, nil)
		d := be.Zeros(y.Shape()...)
		be.MatMul(d, h, l.LoraB, nil)
		be.Add(y, d)
	}
}

// Attention is grouped-query self-attention with rotary positions.
type Attention struct {
	Q, K, V, O   Linear
	QNorm, KNorm kernels.Tensor // Qwen3 only
}

// MLP is the SwiGLU feed-forward block.
type MLP struct{ Gate, Up, Down Linear }

// Layer is one decoder block.
type Layer struct {
	AttnNorm kernels.Tensor
	Attn     Attention
	MLPNorm  kernels.Tensor
	MLP      MLP
}

// Model is a Qwen decoder on a compute backend.
type Model struct {
	Config
	B       kernels.Backend
	Embed   kernels.Tensor // [vocab, hidden]
	Layers  []Layer
	Norm    kernels.Tensor
	LMHead  kernels.Tensor // [vocab, hidden]; the embedding when tied
	weights int            // bytes of the weights as held
	closer  io.Closer      // the mapped checkpoint BF16 weights point into
}

// Close releases the memory-mapped checkpoint. The model must not be used
// afterwards.
func (m *Model) Close() error {
	if m.closer == nil {
		return nil
	}
	err := m.closer.Close()
	m.closer = nil
	return err
}

// WeightBytes is the size of the weights as held (bf16 counts 2 bytes per
// parameter): the bytes a decoding step reads.
func (m *Model) WeightBytes() int { return m.weights }

// Load builds the model on the CPU backend from a Hugging Face directory
// (config.json and safetensors, sharded or not). BF16 matrices stay in the
// memory-mapped file (pages load as they are first read); F32 and F16 ones
// are read into float32. Close releases the mapping.
func Load(dir string) (*Model, error) { return LoadOn(cpu.New(), dir) }

// LoadOn builds the model on the given backend.
func LoadOn(be kernels.Backend, dir string) (*Model, error) {
	cfg, err := LoadConfig(dir)
	if err != nil {
		return nil, err
	}
	st, err := safetensors.OpenDir(dir)
	if err != nil {
		return nil, err
	}
	m, err := FromTensors(be, cfg, st)
	if err != nil {
		st.Close()
		return nil, fmt.Errorf("%s: %w", dir, err)
	}
	m.closer = st
	return m, nil
}

// TensorSource is where weights come from (a safetensors.Dir).
type TensorSource interface {
	Tensor(name string) (safetensors.Tensor, bool)
}

// FromTensors builds the model from named tensors, checking every shape.
func FromTensors(be kernels.Backend, cfg Config, src TensorSource) (*Model, error) {
	m := &Model{Config: cfg, B: be}
	h, hd := cfg.HiddenSize, cfg.HeadDim
	tensor := func(name string, shape ...int) (safetensors.Tensor, error) {
		t, ok := src.Tensor(name)
		if !ok {
			return t, fmt.Errorf("tensor %q is missing", name)
		}
		if fmt.Sprint(t.Shape) != fmt.Sprint(shape) {
			return t, fmt.Errorf("tensor %q has shape %v, config.json implies %v", name, t.Shape, shape)
		}
		return t, nil
	}
	vector := func(name string, n int) (kernels.Tensor, error) {
		t, err := tensor(name, n)
		if err != nil {
			return nil, err
		}
		m.weights += 4 * n
		return be.FromHost(t.Float32(), n), nil
	}
	matrix := func(name string, rows, cols int) (kernels.Tensor, error) {
		t, err := tensor(name, rows, cols)
		if err != nil {
			return nil, err
		}
		w := kernels.Weight{Rows: rows, Cols: cols}
		if t.DType == safetensors.BF16 {
			w.BF16 = t.Uint16()
			m.weights += 2 * rows * cols
		} else {
			w.F32 = t.Float32()
			m.weights += 4 * rows * cols
		}
		return be.Upload(w), nil
	}
	linear := func(name string, in, out int, bias bool) (Linear, error) {
		var l Linear
		var err error
		if l.W, err = matrix(name+".weight", out, in); err != nil {
			return l, err
		}
		if bias {
			l.B, err = vector(name+".bias", out)
		}
		return l, err
	}
	var err error
	if m.Embed, err = matrix("model.embed_tokens.weight", cfg.VocabSize, h); err != nil {
		return nil, err
	}
	if m.Norm, err = vector("model.norm.weight", h); err != nil {
		return nil, err
	}
	if cfg.TieEmbeddings {
		m.LMHead = m.Embed
	} else if m.LMHead, err = matrix("lm_head.weight", cfg.VocabSize, h); err != nil {
		return nil, err
	}
	bias := cfg.QKVBias()
	for i := range cfg.Layers {
		p := fmt.Sprintf("model.layers.%d.", i)
		var l Layer
		steps := []func() error{
			func() (e error) { l.AttnNorm, e = vector(p+"input_layernorm.weight", h); return },
			func() (e error) { l.MLPNorm, e = vector(p+"post_attention_layernorm.weight", h); return },
			func() (e error) { l.Attn.Q, e = linear(p+"self_attn.q_proj", h, cfg.Heads*hd, bias); return },
			func() (e error) { l.Attn.K, e = linear(p+"self_attn.k_proj", h, cfg.KVHeads*hd, bias); return },
			func() (e error) { l.Attn.V, e = linear(p+"self_attn.v_proj", h, cfg.KVHeads*hd, bias); return },
			func() (e error) { l.Attn.O, e = linear(p+"self_attn.o_proj", cfg.Heads*hd, h, false); return },
			func() (e error) { l.MLP.Gate, e = linear(p+"mlp.gate_proj", h, cfg.Intermediate, false); return },
			func() (e error) { l.MLP.Up, e = linear(p+"mlp.up_proj", h, cfg.Intermediate, false); return },
			func() (e error) { l.MLP.Down, e = linear(p+"mlp.down_proj", cfg.Intermediate, h, false); return },
		}
		if cfg.QKNorm() {
			steps = append(steps,
				func() (e error) { l.Attn.QNorm, e = vector(p+"self_attn.q_norm.weight", hd); return },
				func() (e error) { l.Attn.KNorm, e = vector(p+"self_attn.k_norm.weight", hd); return })
		}
		for _, s := range steps {
			if err := s(); err != nil {
				return nil, err
			}
		}
		m.Layers = append(m.Layers, l)
	}
	return m, nil
}

// Cache is the key/value cache of one sequence: per layer [maxT,
// kvHeads·headDim] on the model's backend.
type Cache struct {
	K, V []kernels.Tensor
	Len  int // positions filled
	Max  int
	be   kernels.Backend
}

// NewCache allocates a cache for up to maxT positions.
func (m *Model) NewCache(maxT int) *Cache {
	c := &Cache{Max: maxT, be: m.B}
	for range m.Layers {
		c.K = append(c.K, m.B.Zeros(maxT, m.KVHeads*m.HeadDim))
		c.V = append(c.V, m.B.Zeros(maxT, m.KVHeads*m.HeadDim))
	}
	return c
}

// Clone copies the cache, for sequences that share a prompt prefix.
func (c *Cache) Clone() *Cache {
	n := &Cache{Len: c.Len, Max: c.Max, be: c.be}
	for i := range c.K {
		k, v := c.be.Zeros(c.K[i].Shape()...), c.be.Zeros(c.V[i].Shape()...)
		c.be.CopyRows(k, 0, c.K[i], 0, c.Len)
		c.be.CopyRows(v, 0, c.V[i], 0, c.Len)
		n.K, n.V = append(n.K, k), append(n.V, v)
	}
	return n
}

// Forward runs tokens (positions cache.Len onwards) through the decoder,
// appends their keys and values to the cache and returns logits[t, vocab].
func (m *Model) Forward(tokens []int, cache *Cache) ([]float32, error) {
	out, err := m.ForwardBatch([][]int{tokens}, []*Cache{cache})
	if err != nil {
		return nil, err
	}
	return out[0], nil
}

// ForwardBatch runs several sequences at once: their new tokens are stacked
// into one matrix so every projection reads its weights once per step (what
// makes batched decoding cheaper than one sequence at a time); attention
// runs per sequence against its own cache. It returns logits[t_i, vocab]
// for each sequence.
func (m *Model) ForwardBatch(tokens [][]int, caches []*Cache) ([][]float32, error) {
	return m.forward(tokens, caches, false)
}

// forward is ForwardBatch; with lastOnly it computes the logits of each
// sequence's last token only (generation needs no others, and the vocabulary
// projection of a whole prompt would cost more than the prompt itself).
func (m *Model) forward(tokens [][]int, caches []*Cache, lastOnly bool) ([][]float32, error) {
	if len(tokens) != len(caches) {
		return nil, fmt.Errorf("%d token lists for %d caches", len(tokens), len(caches))
	}
	be, h, hd := m.B, m.HiddenSize, m.HeadDim
	total := 0
	var ids, pos []int
	for s, toks := range tokens {
		if caches[s].Len+len(toks) > caches[s].Max {
			return nil, fmt.Errorf("sequence %d: %d tokens exceed the cache of %d", s, caches[s].Len+len(toks), caches[s].Max)
		}
		for i, id := range toks {
			if id < 0 || id >= m.VocabSize {
				return nil, fmt.Errorf("sequence %d: token id %d is outside the vocabulary of %d", s, id, m.VocabSize)
			}
			ids = append(ids, id)
			pos = append(pos, caches[s].Len+i)
		}
		total += len(toks)
	}
	t := total
	eps := float32(m.RMSNormEps)
	qw, kvw := m.Heads*hd, m.KVHeads*hd
	x := be.Zeros(t, h)
	be.Embedding(x, m.Embed, ids)
	xn, proj := be.Zeros(t, h), be.Zeros(t, h)
	q, attn := be.Zeros(t, qw), be.Zeros(t, qw)
	k, v := be.Zeros(t, kvw), be.Zeros(t, kvw)
	gate, up := be.Zeros(t, m.Intermediate), be.Zeros(t, m.Intermediate)
	for li := range m.Layers {
		l := &m.Layers[li]
		// Attention block: x += O(attn(rope(norm(Q xn)), rope(norm(K xn)), V xn))
		be.RMSNorm(xn, x, l.AttnNorm, eps)
		l.Attn.Q.Forward(be, q, xn)
		l.Attn.K.Forward(be, k, xn)
		l.Attn.V.Forward(be, v, xn)
		if l.Attn.QNorm != nil {
			be.RMSNorm(q, q, l.Attn.QNorm, eps)
			be.RMSNorm(k, k, l.Attn.KNorm, eps)
		}
		be.Rope(q, pos, m.Heads, hd, m.RopeTheta)
		be.Rope(k, pos, m.KVHeads, hd, m.RopeTheta)
		row := 0
		for s, toks := range tokens {
			c, n := caches[s], len(toks)
			be.CopyRows(c.K[li], c.Len, k, row, n)
			be.CopyRows(c.V[li], c.Len, v, row, n)
			be.Attention(be.Rows(attn, row, row+n), be.Rows(q, row, row+n), c.K[li], c.V[li], nil, c.Len, m.Heads, m.KVHeads, hd)
			row += n
		}
		l.Attn.O.Forward(be, proj, attn)
		be.Add(x, proj)
		// MLP block: x += Down(silu(Gate xn) * Up xn)
		be.RMSNorm(xn, x, l.MLPNorm, eps)
		l.MLP.Gate.Forward(be, gate, xn)
		l.MLP.Up.Forward(be, up, xn)
		be.SiLUMul(gate, gate, up)
		l.MLP.Down.Forward(be, proj, gate)
		be.Add(x, proj)
	}
	be.RMSNorm(xn, x, m.Norm, eps)
	for s, toks := range tokens {
		caches[s].Len += len(toks)
	}
	if lastOnly {
		// Gather each sequence's last row, then project only those: the
		// vocabulary projection of a whole prompt would cost more than the
		// prompt itself.
		last := be.Zeros(len(tokens), h)
		row := 0
		for s, toks := range tokens {
			row += len(toks)
			be.CopyRows(last, s, xn, row-1, 1)
		}
		xn, t = last, len(tokens)
	}
	logits := be.Zeros(t, m.VocabSize)
	be.MatMul(logits, xn, m.LMHead, nil)
	flat := be.ToHost(logits)
	out := make([][]float32, len(tokens))
	row := 0
	for s, toks := range tokens {
		n := len(toks)
		if lastOnly {
			n = 1
		}
		out[s] = flat[row*m.VocabSize : (row+n)*m.VocabSize]
		row += n
	}
	return out, nil
}
