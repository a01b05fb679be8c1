package qwen

import (
	"fmt"
	"strconv"
	"strings"
)

// The Qwen2/Qwen3 decoder, declared once. A Decoder[P] is the model's
// parameters held as P: backend tensors for the engine, tape variables for
// training, device parameters for device replicas. Bind is the only place
// that spells a checkpoint tensor's name and shape; loading, random
// initialisation, training, adapters and the GGUF export all derive from
// it.
//
// Layer.Forward (with MLP.Forward) is the only place that spells the
// block's forward maths. Three Ops run it: the engine's (model.go:
// inference, KV caches), the tape's (model/train weights.go: the CPU
// trainer, whose backward the tape derives from the ops it recorded) and
// the device replica's (model/train block.go: the GPU trainer, whose ops
// keep what its backward needs, and which runs the block again through
// Layer.Forward when it recomputes). The device replica's backward is the
// one written by hand: layerBackward in model/train block.go walks the
// block in reverse, each op's backward beside that op's forward as llm.c
// keeps them, because its fixed sequence of kernels (gradients accumulated
// in place into shared buffers, the recomputed MLP's backward run chunk by
// chunk right after each chunk's forward) is what its step's speed and
// memory were measured with. Its tests hold it to the tape's gradients.

// Decoder is the whole model: token embedding, layers, final norm, LM head.
type Decoder[P any] struct {
	Config
	Embed  P // [vocab, hidden]
	Layers []Layer[P]
	Norm   P // [hidden]
	LMHead P // [vocab, hidden]; the embedding itself when tied
}

// Layer is one decoder block.
type Layer[P any] struct {
	AttnNorm P // [hidden]
	Attn     Attention[P]
	MLPNorm  P // [hidden]
	MLP      MLP[P]
}

// Attention is grouped-query self-attention with rotary positions.
type Attention[P any] struct {
	Q, K, V, O     Linear[P]
	QKNorm         bool // Qwen3 RMS-normalises each head of q and k
	QNorm, KNorm   P    // [head_dim]
	Heads, KVHeads int
}

// MLP is the SwiGLU feed-forward block.
type MLP[P any] struct{ Gate, Up, Down Linear[P] }

// Linear is a projection y = x·Wᵀ + b, W [out, in] as PyTorch stores it,
// plus, with a LoRA adapter, Scale·(dropout(x)·Aᵀ)·LBᵀ.
type Linear[P any] struct {
	W, B  P // B is P's zero value without a bias
	A, LB P // the adapter's A [r, in] and B [out, r]; zero without one
	// Scale is the adapter's α/r (engines fold it into LB and use 1);
	// Dropout the probability of dropping an adapter input in training.
	Scale, Dropout float64
	Module         string // PEFT's module name: model.layers.3.mlp.up_proj
	Target         string // the LoRA target it answers to: up_proj
	In, Out        int
	stream         uint64 // which dropout stream is this projection's
}

// DropoutSeed is the seed of this projection's LoRA dropout mask in a
// forward seeded with seed, so that the tape and a device replica drop the
// same inputs.
func (l *Linear[P]) DropoutSeed(seed uint64) uint64 { return seed ^ l.stream*0x9e3779b97f4a7c15 }

// Role is what a checkpoint tensor is.
type Role int

// The roles of Qwen's tensors.
const (
	Embedding Role = iota // token embedding [vocab, hidden]
	Head                  // untied LM head [vocab, hidden]
	Norm                  // an RMSNorm weight over the hidden size
	HeadNorm              // Qwen3's per-head RMSNorm of q or k [head_dim]
	Weight                // a projection's W [out, in]
	Bias                  // a projection's b [out]
)

// Param describes one checkpoint tensor.
type Param struct {
	Name   string // Hugging Face's name
	GGUF   string // llama.cpp's name
	Shape  []int  // as stored: [out, in] matrices, 1-D vectors
	Role   Role
	Layer  int    // the layer it belongs to; -1 for the embedding, final norm and head
	Module string // Weight and Bias: the projection's PEFT module name
	Target string // and the LoRA target it answers to (q_proj)
}

// LoRATargets are the projections a LoRA adapter may target, by PEFT's
// short names.
var LoRATargets = []string{"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"}

// Bind builds a Decoder for cfg, calling f for every tensor of the
// checkpoint, in checkpoint order, with where its value goes. A tied LM
// head is not visited: it is the embedding.
func Bind[P any](cfg Config, f func(Param, *P) error) (*Decoder[P], error) {
	d := &Decoder[P]{Config: cfg, Layers: make([]Layer[P], cfg.Layers)}
	h, hd := cfg.HiddenSize, cfg.HeadDim
	if err := f(Param{Name: "model.embed_tokens.weight", GGUF: "token_embd.weight", Shape: []int{cfg.VocabSize, h}, Role: Embedding, Layer: -1}, &d.Embed); err != nil {
		return nil, err
	}
	for i := range d.Layers {
		l := &d.Layers[i]
		hf, gg := "model.layers."+strconv.Itoa(i)+".", "blk."+strconv.Itoa(i)+"."
		norm := func(name, gguf string, n int, r Role, p *P) error {
			return f(Param{Name: hf + name + ".weight", GGUF: gg + gguf + ".weight", Shape: []int{n}, Role: r, Layer: i}, p)
		}
		linear := func(lin *Linear[P], k int, module, gguf string, out, in int, bias bool) error {
			*lin = Linear[P]{Module: hf + module, Target: module[strings.IndexByte(module, '.')+1:], In: in, Out: out, stream: uint64(i*16 + k + 1)}
			if err := f(Param{Name: lin.Module + ".weight", GGUF: gg + gguf + ".weight", Shape: []int{out, in}, Role: Weight, Layer: i, Module: lin.Module, Target: lin.Target}, &lin.W); err != nil || !bias {
				return err
			}
			return f(Param{Name: lin.Module + ".bias", GGUF: gg + gguf + ".bias", Shape: []int{out}, Role: Bias, Layer: i, Module: lin.Module, Target: lin.Target}, &lin.B)
		}
		a := &l.Attn
		a.QKNorm, a.Heads, a.KVHeads = cfg.QKNorm(), cfg.Heads, cfg.KVHeads
		qkv := cfg.QKVBias()
		steps := []func() error{
			func() error { return norm("input_layernorm", "attn_norm", h, Norm, &l.AttnNorm) },
			func() error { return norm("post_attention_layernorm", "ffn_norm", h, Norm, &l.MLPNorm) },
			func() error { return linear(&a.Q, 0, "self_attn.q_proj", "attn_q", cfg.Heads*hd, h, qkv) },
			func() error { return linear(&a.K, 1, "self_attn.k_proj", "attn_k", cfg.KVHeads*hd, h, qkv) },
			func() error { return linear(&a.V, 2, "self_attn.v_proj", "attn_v", cfg.KVHeads*hd, h, qkv) },
			func() error { return linear(&a.O, 3, "self_attn.o_proj", "attn_output", h, cfg.Heads*hd, false) },
			func() error { return linear(&l.MLP.Gate, 4, "mlp.gate_proj", "ffn_gate", cfg.Intermediate, h, false) },
			func() error { return linear(&l.MLP.Up, 5, "mlp.up_proj", "ffn_up", cfg.Intermediate, h, false) },
			func() error { return linear(&l.MLP.Down, 6, "mlp.down_proj", "ffn_down", h, cfg.Intermediate, false) },
		}
		if a.QKNorm {
			steps = append(steps,
				func() error { return norm("self_attn.q_norm", "attn_q_norm", hd, HeadNorm, &a.QNorm) },
				func() error { return norm("self_attn.k_norm", "attn_k_norm", hd, HeadNorm, &a.KNorm) })
		}
		for _, s := range steps {
			if err := s(); err != nil {
				return nil, err
			}
		}
	}
	if err := f(Param{Name: "model.norm.weight", GGUF: "output_norm.weight", Shape: []int{h}, Role: Norm, Layer: -1}, &d.Norm); err != nil {
		return nil, err
	}
	if cfg.TieEmbeddings {
		d.LMHead = d.Embed
	} else if err := f(Param{Name: "lm_head.weight", GGUF: "output.weight", Shape: []int{cfg.VocabSize, h}, Role: Head, Layer: -1}, &d.LMHead); err != nil {
		return nil, err
	}
	return d, nil
}

// Params lists cfg's checkpoint tensors in checkpoint order.
func Params(cfg Config) []Param {
	var ps []Param
	Bind(cfg, func(p Param, _ *struct{}) error { ps = append(ps, p); return nil })
	return ps
}

// Linears lists the projections in checkpoint order.
func (d *Decoder[P]) Linears() []*Linear[P] {
	var out []*Linear[P]
	for i := range d.Layers {
		l := &d.Layers[i]
		out = append(out, &l.Attn.Q, &l.Attn.K, &l.Attn.V, &l.Attn.O, &l.MLP.Gate, &l.MLP.Up, &l.MLP.Down)
	}
	return out
}

// Linear finds a projection by its PEFT module name.
func (d *Decoder[P]) Linear(module string) (*Linear[P], error) {
	for _, l := range d.Linears() {
		if l.Module == module {
			return l, nil
		}
	}
	return nil, fmt.Errorf("module %s is not a layer of this %d-layer %s model (its projections: model.layers.N.self_attn.{q,k,v,o}_proj, model.layers.N.mlp.{gate,up,down}_proj)", module, len(d.Layers), d.ModelType)
}

// Ops are the operations a block is written in. The engine (caches,
// inference), the autodiff tape and device replicas implement them, so
// Layer.Forward is the model's one forward. An op may reuse the storage of
// an input the block never reads again (the engine does, for x in Add and
// gate in SiLUMul; a device replica for b in Add).
type Ops[V any] interface {
	// RMSNorm normalises each row of len(w) of x and scales it by w.
	RMSNorm(x, w V) V
	// Linear applies a projection (and its adapter).
	Linear(l *Linear[V], x V) V
	// Rope rotates x [t, heads·head_dim] to each token's position.
	Rope(x V, heads int) V
	// Attention is causal attention of layer li's q over k and v (and,
	// for the engine, the cache of earlier positions).
	Attention(li int, q, k, v V) V
	// SiLUMul is silu(gate) ∘ up.
	SiLUMul(gate, up V) V
	// Add is a + b.
	Add(a, b V) V
	// RowWise is f(x) for an f whose every output row depends on its own
	// input row alone and is as wide (the MLP): an implementation may run
	// it over chunks of rows, so that only a chunk's intermediates exist
	// at a time.
	RowWise(x V, f func(Ops[V], V) V) V
}

// Forward is one pre-norm decoder block:
//
//	x ← x + O · attn(rope(qnorm(Q·n₁(x))), rope(knorm(K·n₁(x))), V·n₁(x))
//	x ← x + Down · (silu(Gate·n₂(x)) ∘ Up·n₂(x))
//
// (qnorm and knorm are Qwen3's per-head norms; Qwen2 has none.)
func (l *Layer[V]) Forward(op Ops[V], li int, x V) V {
	a := &l.Attn
	xn := op.RMSNorm(x, l.AttnNorm)
	q, k, v := op.Linear(&a.Q, xn), op.Linear(&a.K, xn), op.Linear(&a.V, xn)
	if a.QKNorm {
		q, k = op.RMSNorm(q, a.QNorm), op.RMSNorm(k, a.KNorm)
	}
	q, k = op.Rope(q, a.Heads), op.Rope(k, a.KVHeads)
	x = op.Add(x, op.Linear(&a.O, op.Attention(li, q, k, v)))
	return op.Add(x, op.RowWise(op.RMSNorm(x, l.MLPNorm), l.MLP.Forward))
}

// Forward is the SwiGLU MLP of normed rows x: Down · (silu(Gate·x) ∘ Up·x).
func (m *MLP[V]) Forward(op Ops[V], x V) V {
	return op.Linear(&m.Down, op.SiLUMul(op.Linear(&m.Gate, x), op.Linear(&m.Up, x)))
}

// Map is d with every parameter p held as f(p) (f is called on absent
// ones too, P's zero value, and should give Q's): a device replica's
// decoder as the tensors an engine reads.
func Map[P, Q any](d *Decoder[P], f func(P) Q) *Decoder[Q] {
	out := &Decoder[Q]{Config: d.Config, Embed: f(d.Embed), Norm: f(d.Norm), LMHead: f(d.LMHead), Layers: make([]Layer[Q], len(d.Layers))}
	for i := range d.Layers {
		out.Layers[i] = MapLayer(&d.Layers[i], f)
	}
	return out
}

// MapLayer is Map for one layer: its projections keep their adapters'
// scale, dropout and dropout streams, so ops over the mapped layer drop
// what ops over l would.
func MapLayer[P, Q any](l *Layer[P], f func(P) Q) Layer[Q] {
	lin := func(x *Linear[P]) Linear[Q] {
		return Linear[Q]{W: f(x.W), B: f(x.B), A: f(x.A), LB: f(x.LB), Scale: x.Scale, Dropout: x.Dropout,
			Module: x.Module, Target: x.Target, In: x.In, Out: x.Out, stream: x.stream}
	}
	a := &l.Attn
	return Layer[Q]{
		AttnNorm: f(l.AttnNorm),
		Attn: Attention[Q]{Q: lin(&a.Q), K: lin(&a.K), V: lin(&a.V), O: lin(&a.O),
			QKNorm: a.QKNorm, QNorm: f(a.QNorm), KNorm: f(a.KNorm), Heads: a.Heads, KVHeads: a.KVHeads},
		MLPNorm: f(l.MLPNorm),
		MLP:     MLP[Q]{Gate: lin(&l.MLP.Gate), Up: lin(&l.MLP.Up), Down: lin(&l.MLP.Down)},
	}
}
