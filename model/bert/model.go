// Package bert is the BERT / RoBERTa family of bidirectional encoders,
// loaded from a Hugging Face directory (config.json, safetensors, a
// WordPiece vocab.txt or tokenizer.json): absolute position and token-type
// embeddings, post-LayerNorm blocks, GELU, bidirectional attention. The
// forward pass runs on the autodiff tape, so the same code embeds text
// (float32, no gradients), trains it (SimCSE) and is checked in float64
// against an independent reference.
package bert

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/agemem/agemem/internal/jsonerr"
	"github.com/agemem/agemem/model/safetensors"
	"github.com/agemem/agemem/model/tape"
)

// Config is the part of config.json the encoder reads.
type Config struct {
	ModelType     string   `json:"model_type"` // bert | roberta
	Architectures []string `json:"architectures,omitempty"`
	VocabSize     int      `json:"vocab_size"`
	HiddenSize    int      `json:"hidden_size"`
	Layers        int      `json:"num_hidden_layers"`
	Heads         int      `json:"num_attention_heads"`
	Intermediate  int      `json:"intermediate_size"`
	HiddenAct     string   `json:"hidden_act"`
	HiddenDropout float64  `json:"hidden_dropout_prob"`
	AttnDropout   float64  `json:"attention_probs_dropout_prob"`
	MaxPositions  int      `json:"max_position_embeddings"`
	TypeVocab     int      `json:"type_vocab_size"`
	LayerNormEps  float64  `json:"layer_norm_eps"`
	PadTokenID    int      `json:"pad_token_id"`
}

// PositionOffset is where position ids start: RoBERTa counts from
// pad_token_id+1, BERT from 0.
func (c Config) PositionOffset() int {
	if c.ModelType == "roberta" || c.ModelType == "xlm-roberta" {
		return c.PadTokenID + 1
	}
	return 0
}

// MaxTokens is the longest sequence the position table holds.
func (c Config) MaxTokens() int { return c.MaxPositions - c.PositionOffset() }

// Validate checks the shape.
func (c Config) Validate() error {
	switch {
	case c.ModelType != "bert" && c.ModelType != "roberta" && c.ModelType != "xlm-roberta":
		return fmt.Errorf("model_type %q: only bert and roberta encoders are supported", c.ModelType)
	case c.HiddenSize <= 0 || c.Layers <= 0 || c.Heads <= 0 || c.HiddenSize%c.Heads != 0:
		return fmt.Errorf("hidden_size %d must be a positive multiple of num_attention_heads %d (and num_hidden_layers %d positive)", c.HiddenSize, c.Heads, c.Layers)
	case c.Intermediate <= 0 || c.VocabSize <= 0 || c.MaxTokens() <= 2:
		return fmt.Errorf("intermediate_size %d, vocab_size %d and max_position_embeddings %d must be positive", c.Intermediate, c.VocabSize, c.MaxPositions)
	case c.HiddenAct != "gelu" && c.HiddenAct != "gelu_new" && c.HiddenAct != "gelu_pytorch_tanh":
		return fmt.Errorf("hidden_act %q: gelu, gelu_new or gelu_pytorch_tanh", c.HiddenAct)
	}
	return nil
}

// LoadConfig reads dir/config.json.
func LoadConfig(dir string) (Config, error) {
	path := filepath.Join(dir, "config.json")
	raw, err := os.ReadFile(path)
	if err != nil {
		return Config{}, err
	}
	c := Config{TypeVocab: 2, LayerNormEps: 1e-12, HiddenAct: "gelu"}
	if err := json.Unmarshal(raw, &c); err != nil {
		return Config{}, fmt.Errorf("%s: %w", path, jsonerr.Explain(err))
	}
	if err := c.Validate(); err != nil {
		return Config{}, fmt.Errorf("%s: %w", path, err)
	}
	return c, nil
}

// Linear is a dense layer: y = x·Wᵀ + b, W [out, in].
type Linear[T tape.Float] struct{ W, B *tape.Var[T] }

// Layer is one post-LayerNorm transformer block.
type Layer[T tape.Float] struct {
	Q, K, V, AttnOut Linear[T]
	AttnLNW, AttnLNB *tape.Var[T]
	Inter, Out       Linear[T]
	OutLNW, OutLNB   *tape.Var[T]
}

// Weights are the encoder's parameters.
type Weights[T tape.Float] struct {
	Config
	Word, Pos, Type *tape.Var[T]
	EmbLNW, EmbLNB  *tape.Var[T]
	Layers          []Layer[T]
	Pooler          *Linear[T] // nil if the checkpoint has none
	Named           []Named[T] // every parameter under its Hugging Face name
}

// Named is a parameter and its Hugging Face name.
type Named[T tape.Float] struct {
	Name string
	V    *tape.Var[T]
}

// hfNames lists the tensors of a BertModel checkpoint (no prefix) and
// their shapes.
func hfNames(c Config, pooler bool) []struct {
	name  string
	shape []int
} {
	type ns = struct {
		name  string
		shape []int
	}
	h, in := c.HiddenSize, c.Intermediate
	out := []ns{
		{"embeddings.word_embeddings.weight", []int{c.VocabSize, h}},
		{"embeddings.position_embeddings.weight", []int{c.MaxPositions, h}},
		{"embeddings.token_type_embeddings.weight", []int{c.TypeVocab, h}},
		{"embeddings.LayerNorm.weight", []int{h}},
		{"embeddings.LayerNorm.bias", []int{h}},
	}
	for i := range c.Layers {
		p := "encoder.layer." + strconv.Itoa(i) + "."
		for _, l := range []struct {
			n      string
			o, inn int
		}{{"attention.self.query", h, h}, {"attention.self.key", h, h}, {"attention.self.value", h, h},
			{"attention.output.dense", h, h}, {"intermediate.dense", in, h}, {"output.dense", h, in}} {
			out = append(out, ns{p + l.n + ".weight", []int{l.o, l.inn}}, ns{p + l.n + ".bias", []int{l.o}})
			if l.n == "attention.output.dense" {
				out = append(out, ns{p + "attention.output.LayerNorm.weight", []int{h}}, ns{p + "attention.output.LayerNorm.bias", []int{h}})
			}
		}
		out = append(out, ns{p + "output.LayerNorm.weight", []int{h}}, ns{p + "output.LayerNorm.bias", []int{h}})
	}
	if pooler {
		out = append(out, ns{"pooler.dense.weight", []int{h, h}}, ns{"pooler.dense.bias", []int{h}})
	}
	return out
}

// Load reads the encoder in dir. trainable marks every parameter for
// gradients (SimCSE); inference loads with false.
func Load[T tape.Float](dir string, trainable bool) (*Weights[T], error) {
	cfg, err := LoadConfig(dir)
	if err != nil {
		return nil, err
	}
	st, err := safetensors.OpenDir(dir)
	if err != nil {
		return nil, err
	}
	defer st.Close()
	// Checkpoints of BertForX / RobertaForX carry a prefix; old ones name
	// LayerNorm parameters gamma and beta.
	byName := map[string]safetensors.Tensor{}
	for _, n := range st.Names() {
		t, _ := st.Tensor(n)
		k := n
		for _, p := range []string{"bert.", "roberta.", "model."} {
			k = strings.TrimPrefix(k, p)
		}
		k = strings.Replace(strings.Replace(k, "LayerNorm.gamma", "LayerNorm.weight", 1), "LayerNorm.beta", "LayerNorm.bias", 1)
		byName[k] = t
	}
	_, pooler := byName["pooler.dense.weight"]
	w := &Weights[T]{Config: cfg}
	for _, n := range hfNames(cfg, pooler) {
		t, ok := byName[n.name]
		if !ok {
			return nil, fmt.Errorf("%s: the checkpoint has no %s", dir, n.name)
		}
		if !sameShape(t.Shape, n.shape) {
			return nil, fmt.Errorf("%s: %s has shape %v, config.json implies %v", dir, n.name, t.Shape, n.shape)
		}
		vals := t.Float32()
		conv := make([]T, len(vals))
		for i, v := range vals {
			conv[i] = T(v)
		}
		rows, cols := matrix(n.shape)
		w.Named = append(w.Named, Named[T]{n.name, tape.Param(conv, rows, cols, trainable)})
	}
	w.bind()
	return w, nil
}

// matrix is a tensor's shape as the tape's [rows, cols]: a vector is one row.
func matrix(shape []int) (rows, cols int) {
	if len(shape) == 2 {
		return shape[0], shape[1]
	}
	return 1, shape[0]
}

func sameShape(a, b []int) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// bind points the struct fields at the named parameters (hfNames order).
func (w *Weights[T]) bind() {
	i := 0
	next := func() *tape.Var[T] { v := w.Named[i].V; i++; return v }
	w.Word, w.Pos, w.Type, w.EmbLNW, w.EmbLNB = next(), next(), next(), next(), next()
	w.Layers = make([]Layer[T], w.Config.Layers)
	for l := range w.Layers {
		L := &w.Layers[l]
		L.Q = Linear[T]{next(), next()}
		L.K = Linear[T]{next(), next()}
		L.V = Linear[T]{next(), next()}
		L.AttnOut = Linear[T]{next(), next()}
		L.AttnLNW, L.AttnLNB = next(), next()
		L.Inter = Linear[T]{next(), next()}
		L.Out = Linear[T]{next(), next()}
		L.OutLNW, L.OutLNB = next(), next()
	}
	if i < len(w.Named) {
		w.Pooler = &Linear[T]{next(), next()}
	}
}

// Forward encodes a batch of token-id sequences packed end to end and
// returns the last hidden states [Σ len, hidden] and each sequence's rows.
// Training applies dropout (seed picks the masks): hidden > 0 after the
// embeddings and each sublayer (hidden_dropout_prob), attn > 0 on the
// attention probabilities (attention_probs_dropout_prob).
func (w *Weights[T]) Forward(tp *tape.Tape[T], batch [][]int, hidden, attn float64, seed uint64) (*tape.Var[T], []tape.Segment, error) {
	var ids, pos, types []int
	var segs []tape.Segment
	off := w.PositionOffset()
	for b, seq := range batch {
		if len(seq) == 0 || len(seq) > w.MaxTokens() {
			return nil, nil, fmt.Errorf("sequence %d has %d tokens; the encoder takes 1 to %d", b, len(seq), w.MaxTokens())
		}
		segs = append(segs, tape.Segment{Lo: len(ids), Hi: len(ids) + len(seq)})
		for i, id := range seq {
			if id < 0 || id >= w.VocabSize {
				return nil, nil, fmt.Errorf("sequence %d: token id %d is outside the vocabulary of %d", b, id, w.VocabSize)
			}
			ids, pos, types = append(ids, id), append(pos, off+i), append(types, 0)
		}
	}
	eps := w.LayerNormEps
	tanh := w.HiddenAct != "gelu"
	drop := func(x *tape.Var[T], k uint64) *tape.Var[T] {
		if hidden <= 0 {
			return x
		}
		return tp.Dropout(x, hidden, seed*1000003+k)
	}
	x := tp.Add(tp.Add(tp.Embedding(w.Word, ids), tp.Embedding(w.Pos, pos)), tp.Embedding(w.Type, types))
	x = drop(tp.LayerNorm(x, w.EmbLNW, w.EmbLNB, eps), 0)
	hd := w.HiddenSize / w.Heads
	for l, L := range w.Layers {
		q, k, v := tp.Linear(x, L.Q.W, L.Q.B), tp.Linear(x, L.K.W, L.K.B), tp.Linear(x, L.V.W, L.V.B)
		a := tp.BiAttention(q, k, v, segs, w.Heads, hd, attn, seed*1000003+uint64(w.Config.Layers*2+1+l))
		x = tp.LayerNorm(tp.Add(drop(tp.Linear(a, L.AttnOut.W, L.AttnOut.B), uint64(2*l+1)), x), L.AttnLNW, L.AttnLNB, eps)
		h := tp.GELU(tp.Linear(x, L.Inter.W, L.Inter.B), tanh)
		x = tp.LayerNorm(tp.Add(drop(tp.Linear(h, L.Out.W, L.Out.B), uint64(2*l+2)), x), L.OutLNW, L.OutLNB, eps)
	}
	return x, segs, nil
}

// Poolings of a sentence embedding.
const (
	PoolCLS    = "cls"     // the [CLS] row (SimCSE at test time)
	PoolCLSMLP = "cls_mlp" // tanh(pooler(CLS)): SimCSE's MLP head, BERT's pooler
	PoolMean   = "mean"    // the mean of every row (sentence-transformers)
)

// Pool turns the hidden states of each sequence into one vector, L2-
// normalised.
func (w *Weights[T]) Pool(tp *tape.Tape[T], hidden *tape.Var[T], segs []tape.Segment, pooling string) (*tape.Var[T], error) {
	var p *tape.Var[T]
	switch pooling {
	case PoolMean:
		p = tp.MeanPool(hidden, segs)
	case PoolCLS, PoolCLSMLP:
		rows := make([]int, len(segs))
		for i, s := range segs {
			rows[i] = s.Lo
		}
		p = tp.Gather(hidden, rows)
		if pooling == PoolCLSMLP {
			if w.Pooler == nil {
				return nil, fmt.Errorf("pooling cls_mlp needs the checkpoint's pooler.dense")
			}
			p = tp.Tanh(tp.Linear(p, w.Pooler.W, w.Pooler.B))
		}
	default:
		return nil, fmt.Errorf("pooling %q is not one of cls, cls_mlp, mean", pooling)
	}
	return tp.L2Normalize(p), nil
}

// Save writes the weights as a BertModel safetensors file with config.json.
func (w *Weights[T]) Save(dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	shapes := map[string][]int{}
	for _, n := range hfNames(w.Config, w.Pooler != nil) {
		shapes[n.name] = n.shape
	}
	var ts []safetensors.Tensor
	for _, n := range w.Named {
		vals := make([]float32, len(n.V.Val))
		for i, v := range n.V.Val {
			vals[i] = float32(v)
		}
		ts = append(ts, safetensors.FromFloat32(n.Name, safetensors.F32, shapes[n.Name], vals))
	}
	if err := safetensors.Write(filepath.Join(dir, "model.safetensors"), ts, map[string]string{"format": "pt"}); err != nil {
		return err
	}
	cfg := w.Config
	if len(cfg.Architectures) == 0 {
		cfg.Architectures = []string{"BertModel"}
	}
	raw, _ := json.MarshalIndent(cfg, "", "  ")
	return os.WriteFile(filepath.Join(dir, "config.json"), append(raw, '\n'), 0o644)
}

// InitRandom writes a random encoder with a pooler in the Hugging Face
// layout: weights ~ N(0, 0.02²) (BERT's initializer_range), LayerNorm 1/0,
// the vocabulary as vocab.txt.
func InitRandom(dir string, cfg Config, vocab []string, lower bool, seed uint64) error {
	cfg.VocabSize = len(vocab)
	if cfg.HiddenAct == "" {
		cfg.HiddenAct = "gelu"
	}
	if cfg.TypeVocab == 0 {
		cfg.TypeVocab = 2
	}
	if cfg.LayerNormEps == 0 {
		cfg.LayerNormEps = 1e-12
	}
	if err := cfg.Validate(); err != nil {
		return err
	}
	if _, err := NewWordPiece(vocab, lower); err != nil {
		return err
	}
	r := rand.New(rand.NewPCG(seed, 0x62657274))
	w := &Weights[float32]{Config: cfg}
	for _, n := range hfNames(cfg, true) {
		size := 1
		for _, d := range n.shape {
			size *= d
		}
		vals := make([]float32, size)
		switch {
		case strings.HasSuffix(n.name, "LayerNorm.weight"):
			for i := range vals {
				vals[i] = 1
			}
		case strings.HasSuffix(n.name, ".bias"):
		default:
			for i := range vals {
				vals[i] = float32(r.NormFloat64() * 0.02)
			}
		}
		rows, cols := matrix(n.shape)
		w.Named = append(w.Named, Named[float32]{n.name, tape.Param(vals, rows, cols, false)})
	}
	w.bind()
	if err := w.Save(dir); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "vocab.txt"), []byte(strings.Join(vocab, "\n")+"\n"), 0o644); err != nil {
		return err
	}
	tc, _ := json.Marshal(map[string]any{"do_lower_case": lower, "model_max_length": cfg.MaxTokens(), "tokenizer_class": "BertTokenizer"})
	return os.WriteFile(filepath.Join(dir, "tokenizer_config.json"), tc, 0o644)
}

// NumParams counts the parameters.
func (w *Weights[T]) NumParams() int {
	n := 0
	for _, p := range w.Named {
		n += len(p.V.Val)
	}
	return n
}
