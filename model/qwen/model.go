package qwen

import (
	"fmt"
	"io"
	"slices"

	"github.com/agemem/agemem/kernels"
	"github.com/agemem/agemem/kernels/cpu"
	"github.com/agemem/agemem/model/safetensors"
)

// Model is a Qwen decoder on a compute backend: the engine.
type Model struct {
	*Decoder[kernels.Tensor]
	B       kernels.Backend
	weights int       // bytes of the weights as held
	closer  io.Closer // the mapped checkpoint BF16 weights point into
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
// parameter, Q8_0 1.125): the bytes a decoding step reads.
func (m *Model) WeightBytes() int { return m.weights }

// Load builds the model on the CPU backend from a Hugging Face directory
// (config.json and safetensors, sharded or not). BF16 matrices stay in the
// memory-mapped file (pages load as they are first read); F32 and F16 ones
// are read into float32. Close releases the mapping.
func Load(dir string) (*Model, error) { return LoadOn(cpu.New(), dir) }

// LoadOn builds the model on the given backend.
func LoadOn(be kernels.Backend, dir string) (*Model, error) { return LoadWith(be, dir, Options{}) }

// Options change how a checkpoint is held for generation.
type Options struct {
	// Quantize "q8_0" holds every matrix whose rows are a multiple of 32
	// values as Q8_0 blocks, the values a q8_0 GGUF export holds (what
	// Ollama runs), so a CPU decode reads 1.125 bytes a weight instead of
	// bf16's 2. "" keeps the stored type. Generation only: training reads
	// its own weights.
	Quantize string
}

// LoadWith is LoadOn with options.
func LoadWith(be kernels.Backend, dir string, o Options) (*Model, error) {
	if o.Quantize != "" && o.Quantize != "q8_0" {
		return nil, fmt.Errorf("quantize %q: want q8_0 or nothing", o.Quantize)
	}
	cfg, err := LoadConfig(dir)
	if err != nil {
		return nil, err
	}
	st, err := safetensors.OpenDir(dir)
	if err != nil {
		return nil, err
	}
	m, err := fromTensors(be, cfg, st, o)
	if err != nil {
		st.Close()
		return nil, fmt.Errorf("%s: %w", dir, err)
	}
	m.closer = st
	return m, nil
}

// TensorSource is where weights come from (a safetensors.Dir, a TensorMap).
type TensorSource interface {
	Tensor(name string) (safetensors.Tensor, bool)
}

// TensorMap serves tensors from memory.
type TensorMap map[string]safetensors.Tensor

// Tensor implements TensorSource.
func (m TensorMap) Tensor(name string) (safetensors.Tensor, bool) {
	t, ok := m[name]
	return t, ok
}

// MapOf indexes tensors by name.
func MapOf(ts []safetensors.Tensor) TensorMap {
	m := TensorMap{}
	for _, t := range ts {
		m[t.Name] = t
	}
	return m
}

// FromTensors builds the model from named tensors, checking every shape.
// BF16 and F16 matrices stay views of their source; F32 ones are read as
// float32.
func FromTensors(be kernels.Backend, cfg Config, src TensorSource) (*Model, error) {
	return fromTensors(be, cfg, src, Options{})
}

func fromTensors(be kernels.Backend, cfg Config, src TensorSource, o Options) (*Model, error) {
	m := &Model{B: be}
	d, err := Bind(cfg, func(p Param, dst *kernels.Tensor) error {
		t, ok := src.Tensor(p.Name)
		if !ok {
			return fmt.Errorf("tensor %q is missing", p.Name)
		}
		if !slices.Equal(t.Shape, p.Shape) {
			return fmt.Errorf("tensor %q has shape %v, config.json implies %v", p.Name, t.Shape, p.Shape)
		}
		if want := t.Len() * t.DType.Size(); t.DType.Size() == 0 || len(t.Data) != want {
			return fmt.Errorf("tensor %q: %d bytes of dtype %q for shape %v (F32, F16 or BF16 expected, %d bytes)", p.Name, len(t.Data), t.DType, t.Shape, want)
		}
		if len(p.Shape) == 1 {
			m.weights += 4 * p.Shape[0]
			*dst = be.FromHost(t.Float32(), p.Shape[0])
			return nil
		}
		w := kernels.Weight{Rows: p.Shape[0], Cols: p.Shape[1]}
		switch t.DType {
		case safetensors.BF16:
			w.BF16 = t.Uint16()
		case safetensors.F16:
			w.F16 = t.Uint16()
		default:
			w.F32 = t.Float32()
		}
		if o.Quantize == "q8_0" && w.Cols%kernels.QK8 == 0 {
			var err error
			if w, err = kernels.QuantizeQ8(w); err != nil {
				return fmt.Errorf("tensor %q: %w", p.Name, err)
			}
		}
		m.weights += w.Bytes()
		*dst = be.Upload(w)
		return nil
	})
	if err != nil {
		return nil, err
	}
	m.Decoder = d
	return m, nil
}

// Cache is the key/value cache of one sequence: per layer [maxT,
// kvHeads·headDim] on the model's backend.
//
// A cache holds what its sequence uses, not its maximum: it starts with
// room for cacheStart positions and doubles as positions arrive, up to
// Max, so a rollout that stops early never held the full context (GRPO's
// K×B rollouts at an 8k context would otherwise reserve their upper bound
// at once).
//
// A paged cache (Model.NewPagedCache) keeps its positions in a Pool's
// blocks instead, and K and V are nil.
type Cache struct {
	K, V []kernels.Tensor // [Cap(), kvHeads·headDim] per layer; rows from Len on are free
	Len  int              // positions filled
	Max  int              // the most positions it may grow to
	be   kernels.Backend

	pool   *Pool // a paged cache's pool, and the blocks it holds
	blocks []int
}

// cacheStart is a new cache's room, in positions.
const cacheStart = 256

// NewCache makes a cache for up to maxT positions.
func (m *Model) NewCache(maxT int) *Cache {
	c := &Cache{Max: maxT, be: m.B, K: make([]kernels.Tensor, len(m.Layers)), V: make([]kernels.Tensor, len(m.Layers))}
	n := min(maxT, cacheStart)
	for i := range c.K {
		c.K[i], c.V[i] = m.B.Zeros(n, m.KVHeads*m.HeadDim), m.B.Zeros(n, m.KVHeads*m.HeadDim)
	}
	return c
}

// Cap is how many positions the cache has room for now.
func (c *Cache) Cap() int {
	if c.pool != nil {
		return len(c.blocks) * c.pool.BlockSize
	}
	if len(c.K) == 0 {
		return 0
	}
	return c.K[0].Shape()[0]
}

// Reserve makes room for n positions (at most Max), keeping the filled
// ones: a contiguous cache's room at least doubles, so filling it copies
// each position about once; a paged cache takes the blocks it lacks and
// fails with ErrPoolFull, taking none, when its pool cannot give them.
func (c *Cache) Reserve(n int) error {
	n = min(n, c.Max)
	if c.pool != nil {
		return c.reservePaged(n)
	}
	if n > c.Cap() {
		c.resize(max(n, min(c.Max, 2*c.Cap())))
	}
	return nil
}

func (c *Cache) resize(room int) {
	for i := range c.K {
		w := c.K[i].Shape()[1]
		k, v := c.be.Zeros(room, w), c.be.Zeros(room, w)
		c.be.CopyRows(k, 0, c.K[i], 0, c.Len)
		c.be.CopyRows(v, 0, c.V[i], 0, c.Len)
		c.K[i], c.V[i] = k, v
	}
}

// Clone copies the cache, for sequences that share a prompt prefix; the
// copy has room for what is filled (and at least cacheStart positions). A
// paged clone shares the blocks instead (each is copied when one of its
// holders writes into it).
func (c *Cache) Clone() *Cache {
	if c.pool != nil {
		for _, b := range c.blocks {
			c.pool.refs[b]++
		}
		return &Cache{Len: c.Len, Max: c.Max, be: c.be, pool: c.pool, blocks: slices.Clone(c.blocks)}
	}
	n := &Cache{Len: c.Len, Max: c.Max, be: c.be, K: slices.Clone(c.K), V: slices.Clone(c.V)}
	n.resize(max(c.Len, min(c.Max, cacheStart)))
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

// ForwardLast is ForwardBatch returning only each sequence's last logits
// [vocab] (generation needs no others, and the vocabulary projection of a
// whole prompt would cost more than the prompt itself).
func (m *Model) ForwardLast(tokens [][]int, caches []*Cache) ([][]float32, error) {
	return m.forward(tokens, caches, true)
}

// forward is ForwardBatch, or with lastOnly ForwardLast.
func (m *Model) forward(tokens [][]int, caches []*Cache, lastOnly bool) ([][]float32, error) {
	if len(tokens) != len(caches) {
		return nil, fmt.Errorf("%d token lists for %d caches", len(tokens), len(caches))
	}
	be, h := m.B, m.HiddenSize
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
	// Room only once every sequence is valid; a pool that runs out fails
	// here, before any position is written.
	var rows [][]int
	for s, toks := range tokens {
		if err := caches[s].Reserve(caches[s].Len + len(toks)); err != nil {
			return nil, fmt.Errorf("sequence %d: %w", s, err)
		}
		if caches[s].pool != nil {
			if rows == nil {
				rows = make([][]int, len(tokens))
			}
			rows[s] = caches[s].pagedRows(caches[s].Len + len(toks))
		}
	}
	t := total
	x := be.Zeros(t, h)
	be.Embedding(x, m.Embed, ids)
	op := engineOps{m: m, pos: pos, tokens: tokens, caches: caches, rows: rows}
	for li := range m.Layers {
		x = m.Layers[li].Forward(op, li, x)
	}
	xn := be.Zeros(t, h)
	be.RMSNorm(xn, x, m.Norm, float32(m.RMSNormEps))
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

// engineOps run a block for inference: the new tokens of several
// sequences stacked as rows, each sequence's keys and values appended to
// its cache, attention per sequence over its cache.
type engineOps struct {
	m      *Model
	pos    []int
	tokens [][]int
	caches []*Cache
	rows   [][]int // a paged cache's pool rows of its positions
}

func (o engineOps) RMSNorm(x, w kernels.Tensor) kernels.Tensor {
	y := o.m.B.Zeros(x.Shape()...)
	o.m.B.RMSNorm(y, x, w, float32(o.m.RMSNormEps))
	return y
}

// Linear adds the adapter's path unmerged, so removing it gives back the
// exact base; its scale is folded into LB.
func (o engineOps) Linear(l *Linear[kernels.Tensor], x kernels.Tensor) kernels.Tensor {
	be, t := o.m.B, x.Shape()[0]
	y := be.Zeros(t, l.Out)
	be.MatMul(y, x, l.W, l.B)
	if l.A != nil {
		h := be.Zeros(t, l.A.Shape()[0])
		be.MatMul(h, x, l.A, nil)
		d := be.Zeros(t, l.Out)
		be.MatMul(d, h, l.LB, nil)
		if s := l.Scale; s != 1 && s != 0 {
			// An adapter shared with a trainer (Bound) keeps its α/r;
			// trainers' backends scale.
			be.(interface {
				AddScaled(y, x kernels.Tensor, s float32)
			}).AddScaled(y, d, float32(s))
		} else {
			be.Add(y, d)
		}
	}
	return y
}

// Bound is a model over tensors already on be (a trainer's own weights,
// so rollouts share them instead of copying). A LoRA path with a Scale
// other than 1 needs a backend with AddScaled (every kernels.TrainBackend).
func Bound(be kernels.Backend, d *Decoder[kernels.Tensor]) *Model {
	return &Model{Decoder: d, B: be}
}

func (o engineOps) Rope(x kernels.Tensor, heads int) kernels.Tensor {
	o.m.B.Rope(x, o.pos, heads, o.m.HeadDim, o.m.RopeTheta)
	return x
}

func (o engineOps) Attention(li int, q, k, v kernels.Tensor) kernels.Tensor {
	be, m := o.m.B, o.m
	out := be.Zeros(q.Shape()...)
	if da, ok := be.(kernels.DecodeAttender); ok && o.decodeStep() {
		n := len(o.caches)
		kc, vc, rows, pos := make([]kernels.Tensor, n), make([]kernels.Tensor, n), make([][]int, n), make([]int, n)
		for s, c := range o.caches {
			pos[s] = c.Len
			if c.pool != nil {
				kc[s], vc[s], rows[s] = c.pool.K[li], c.pool.V[li], o.rows[s]
			} else {
				kc[s], vc[s] = c.K[li], c.V[li]
			}
		}
		da.DecodeAttention(out, q, k, v, kc, vc, rows, pos, m.Heads, m.KVHeads, m.HeadDim)
		return out
	}
	row := 0
	for s, toks := range o.tokens {
		c, n := o.caches[s], len(toks)
		var kc, vc kernels.Tensor
		if c.pool != nil {
			c.writePaged(li, k, v, row, n)
			if pa, ok := be.(kernels.PagedAttender); ok {
				pa.PagedAttention(be.Rows(out, row, row+n), be.Rows(q, row, row+n), c.pool.K[li], c.pool.V[li], o.rows[s], c.Len, m.Heads, m.KVHeads, m.HeadDim)
				row += n
				continue
			}
			kc, vc = c.gatherPaged(li, o.rows[s])
		} else {
			kc, vc = c.K[li], c.V[li]
			be.CopyRows(kc, c.Len, k, row, n)
			be.CopyRows(vc, c.Len, v, row, n)
		}
		be.Attention(be.Rows(out, row, row+n), be.Rows(q, row, row+n), kc, vc, nil, c.Len, m.Heads, m.KVHeads, m.HeadDim)
		row += n
	}
	return out
}

// decodeStep: every sequence adds one token, what a DecodeAttender runs
// in one call.
func (o engineOps) decodeStep() bool {
	for _, toks := range o.tokens {
		if len(toks) != 1 {
			return false
		}
	}
	return true
}

func (o engineOps) SiLUMul(gate, up kernels.Tensor) kernels.Tensor {
	o.m.B.SiLUMul(gate, gate, up)
	return gate
}

func (o engineOps) Add(a, b kernels.Tensor) kernels.Tensor {
	o.m.B.Add(a, b)
	return a
}

// RowWise runs f on every row at once: inference holds no activations for
// a backward, so there is nothing to bound.
func (o engineOps) RowWise(x kernels.Tensor, f func(Ops[kernels.Tensor], kernels.Tensor) kernels.Tensor) kernels.Tensor {
	return f(o, x)
}

// Score returns log pi(continuation[i] | prompt, continuation[:i]) for each
// continuation token: one forward pass over prompt and continuation (the
// old- and reference-policy log-probabilities of GRPO).
func (m *Model) Score(prompt, continuation []int) ([]float32, error) {
	if len(prompt) == 0 || len(continuation) == 0 {
		return nil, fmt.Errorf("score needs a non-empty prompt and continuation")
	}
	// The prompt but its last token goes through the cache without logits;
	// only the positions that predict the continuation are projected.
	cache := m.NewCache(len(prompt) + len(continuation))
	if len(prompt) > 1 {
		if _, err := m.forward([][]int{prompt[:len(prompt)-1]}, []*Cache{cache}, true); err != nil {
			return nil, err
		}
	}
	tail := append([]int{prompt[len(prompt)-1]}, continuation...)
	logits, err := m.Forward(tail, cache)
	if err != nil {
		return nil, err
	}
	out := make([]float32, len(continuation))
	logp := make([]float32, m.VocabSize)
	for i, tok := range continuation {
		row := logits[i*m.VocabSize : (i+1)*m.VocabSize]
		cpu.LogSoftmax(logp, row)
		out[i] = logp[tok]
	}
	return out, nil
}
