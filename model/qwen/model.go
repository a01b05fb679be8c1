package qwen

import (
	"fmt"
	"io"

	"github.com/agemem/agemem/kernels/cpu"
	"github.com/agemem/agemem/model/safetensors"
)

// Linear is y = x W^T + b with W[out, in] as PyTorch stores it.
type Linear struct {
	W cpu.Matrix
	B []float32 // nil without bias
}

// Forward maps x[t, in] to y[t, out].
func (l *Linear) Forward(y, x []float32, t int) { cpu.MatMul(y, x, l.W, l.B, t) }

// Attention is grouped-query self-attention with rotary positions.
type Attention struct {
	Q, K, V, O   Linear
	QNorm, KNorm []float32 // Qwen3 only
}

// MLP is the SwiGLU feed-forward block.
type MLP struct{ Gate, Up, Down Linear }

// Layer is one decoder block.
type Layer struct {
	AttnNorm []float32
	Attn     Attention
	MLPNorm  []float32
	MLP      MLP
}

// Model is a Qwen decoder.
type Model struct {
	Config
	Embed  cpu.Matrix // [vocab, hidden]
	Layers []Layer
	Norm   []float32
	LMHead cpu.Matrix // [vocab, hidden]; the embedding when tied
	cos    []float32
	sin    []float32
	closer io.Closer // the mapped checkpoint BF16 weights point into
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

// WeightBytes is the size of the weights as held (bf16 views count 2 bytes
// per parameter): the bytes a decoding step reads.
func (m *Model) WeightBytes() int {
	n := m.Embed.Bytes() + 4*len(m.Norm)
	if !m.TieEmbeddings {
		n += m.LMHead.Bytes()
	}
	for _, l := range m.Layers {
		for _, lin := range []Linear{l.Attn.Q, l.Attn.K, l.Attn.V, l.Attn.O, l.MLP.Gate, l.MLP.Up, l.MLP.Down} {
			n += lin.W.Bytes() + 4*len(lin.B)
		}
		n += 4 * (len(l.AttnNorm) + len(l.MLPNorm) + len(l.Attn.QNorm) + len(l.Attn.KNorm))
	}
	return n
}

// Load builds the model from a Hugging Face directory (config.json and
// safetensors, sharded or not). BF16 matrices stay in the memory-mapped
// file (pages load as they are first read); F32 and F16 ones are read into
// float32. Close releases the mapping.
func Load(dir string) (*Model, error) {
	cfg, err := LoadConfig(dir)
	if err != nil {
		return nil, err
	}
	st, err := safetensors.OpenDir(dir)
	if err != nil {
		return nil, err
	}
	m, err := FromTensors(cfg, st)
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
func FromTensors(cfg Config, src TensorSource) (*Model, error) {
	m := &Model{Config: cfg}
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
	get := func(name string, shape ...int) ([]float32, error) {
		t, err := tensor(name, shape...)
		if err != nil {
			return nil, err
		}
		return t.Float32(), nil
	}
	matrix := func(name string, rows, cols int) (cpu.Matrix, error) {
		t, err := tensor(name, rows, cols)
		if err != nil {
			return cpu.Matrix{}, err
		}
		w := cpu.Matrix{Rows: rows, Cols: cols}
		if t.DType == safetensors.BF16 {
			w.BF16 = t.Uint16()
		} else {
			w.F32 = t.Float32()
		}
		return w, nil
	}
	linear := func(name string, in, out int, bias bool) (Linear, error) {
		var l Linear
		var err error
		if l.W, err = matrix(name+".weight", out, in); err != nil {
			return l, err
		}
		if bias {
			l.B, err = get(name+".bias", out)
		}
		return l, err
	}
	var err error
	if m.Embed, err = matrix("model.embed_tokens.weight", cfg.VocabSize, h); err != nil {
		return nil, err
	}
	if m.Norm, err = get("model.norm.weight", h); err != nil {
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
			func() (e error) { l.AttnNorm, e = get(p+"input_layernorm.weight", h); return },
			func() (e error) { l.MLPNorm, e = get(p+"post_attention_layernorm.weight", h); return },
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
				func() (e error) { l.Attn.QNorm, e = get(p+"self_attn.q_norm.weight", hd); return },
				func() (e error) { l.Attn.KNorm, e = get(p+"self_attn.k_norm.weight", hd); return })
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

// Cache is the key/value cache of one sequence: per layer [maxT, kvHeads,
// headDim].
type Cache struct {
	K, V [][]float32
	Len  int // positions filled
	Max  int
}

// NewCache allocates a cache for up to maxT positions.
func (m *Model) NewCache(maxT int) *Cache {
	c := &Cache{Max: maxT}
	n := maxT * m.KVHeads * m.HeadDim
	for range m.Layers {
		c.K = append(c.K, make([]float32, n))
		c.V = append(c.V, make([]float32, n))
	}
	return c
}

func (m *Model) rope(maxPos int) {
	if len(m.cos) < maxPos*m.HeadDim/2 {
		m.cos, m.sin = cpu.RopeTables(max(maxPos, 2*len(m.cos)/max(m.HeadDim, 1)), m.HeadDim, m.RopeTheta)
	}
}

// Clone copies the cache, for sequences that share a prompt prefix.
func (c *Cache) Clone() *Cache {
	n := &Cache{Len: c.Len, Max: c.Max}
	for i := range c.K {
		n.K = append(n.K, append([]float32(nil), c.K[i]...))
		n.V = append(n.V, append([]float32(nil), c.V[i]...))
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
	h, hd := m.HiddenSize, m.HeadDim
	total, maxPos := 0, 0
	for s, toks := range tokens {
		if caches[s].Len+len(toks) > caches[s].Max {
			return nil, fmt.Errorf("sequence %d: %d tokens exceed the cache of %d", s, caches[s].Len+len(toks), caches[s].Max)
		}
		total += len(toks)
		maxPos = max(maxPos, caches[s].Len+len(toks))
	}
	m.rope(maxPos)
	x := make([]float32, total*h)
	pos := make([]int, 0, total)
	row := 0
	for s, toks := range tokens {
		for i, id := range toks {
			if id < 0 || id >= m.VocabSize {
				return nil, fmt.Errorf("sequence %d: token id %d is outside the vocabulary of %d", s, id, m.VocabSize)
			}
			m.Embed.RowTo(x[row*h:(row+1)*h], id)
			pos = append(pos, caches[s].Len+i)
			row++
		}
	}
	t := total
	eps := float32(m.RMSNormEps)
	kvw := m.KVHeads * hd
	xn := make([]float32, t*h)
	q := make([]float32, t*m.Heads*hd)
	k := make([]float32, t*kvw)
	v := make([]float32, t*kvw)
	attn := make([]float32, t*m.Heads*hd)
	proj := make([]float32, t*h)
	gate := make([]float32, t*m.Intermediate)
	up := make([]float32, t*m.Intermediate)
	for li := range m.Layers {
		l := &m.Layers[li]
		// Attention block: x += O(attn(rope(norm(Q xn)), rope(norm(K xn)), V xn))
		cpu.RMSNorm(xn, x, l.AttnNorm, h, eps)
		l.Attn.Q.Forward(q, xn, t)
		l.Attn.K.Forward(k, xn, t)
		l.Attn.V.Forward(v, xn, t)
		if l.Attn.QNorm != nil {
			cpu.RMSNorm(q, q, l.Attn.QNorm, hd, eps)
			cpu.RMSNorm(k, k, l.Attn.KNorm, hd, eps)
		}
		cpu.Rope(q, pos, m.Heads, hd, m.cos, m.sin)
		cpu.Rope(k, pos, m.KVHeads, hd, m.cos, m.sin)
		row := 0
		for s, toks := range tokens {
			c, n := caches[s], len(toks)
			copy(c.K[li][c.Len*kvw:], k[row*kvw:(row+n)*kvw])
			copy(c.V[li][c.Len*kvw:], v[row*kvw:(row+n)*kvw])
			qs := m.Heads * hd
			cpu.Attention(attn[row*qs:(row+n)*qs], q[row*qs:(row+n)*qs], c.K[li], c.V[li], nil, n, c.Len, m.Heads, m.KVHeads, hd)
			row += n
		}
		l.Attn.O.Forward(proj, attn, t)
		cpu.Add(x, proj)
		// MLP block: x += Down(silu(Gate xn) * Up xn)
		cpu.RMSNorm(xn, x, l.MLPNorm, h, eps)
		l.MLP.Gate.Forward(gate, xn, t)
		l.MLP.Up.Forward(up, xn, t)
		cpu.SiLUMul(gate, gate, up)
		l.MLP.Down.Forward(proj, gate, t)
		cpu.Add(x, proj)
	}
	cpu.RMSNorm(xn, x, m.Norm, h, eps)
	for s, toks := range tokens {
		caches[s].Len += len(toks)
	}
	if lastOnly {
		// Gather each sequence's last row, then project only those.
		last := make([]float32, len(tokens)*h)
		row := 0
		for s, toks := range tokens {
			row += len(toks)
			copy(last[s*h:(s+1)*h], xn[(row-1)*h:row*h])
		}
		xn, t = last, len(tokens)
	}
	logits := make([]float32, t*m.VocabSize)
	cpu.MatMul(logits, xn, m.LMHead, nil, t)
	out := make([][]float32, len(tokens))
	row = 0
	for s, toks := range tokens {
		n := len(toks)
		if lastOnly {
			n = 1
		}
		out[s] = logits[row*m.VocabSize : (row+n)*m.VocabSize]
		row += n
	}
	return out, nil
}
