package train

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/agemem/agemem/internal/par"
	"github.com/agemem/agemem/kernels"
	"github.com/agemem/agemem/model/lora"
	"github.com/agemem/agemem/model/qwen"
	"github.com/agemem/agemem/model/safetensors"
	"github.com/agemem/agemem/model/tape"
)

// Weights are the decoder's parameters as tape variables: the training
// side of the model, the same qwen.Decoder and qwen.Layer.Forward as the engine's,
// recorded on the tape so that backward comes from it.
type Weights[T tape.Float] struct {
	*qwen.Decoder[*tape.Var[T]]
	// Named lists every parameter with its Hugging Face name, in file order;
	// LoRA parameters carry PEFT's names.
	Named []NamedVar[T]
	LoRA  *lora.Config // set once an adapter is attached
}

// NamedVar is a parameter and its checkpoint name.
type NamedVar[T tape.Float] struct {
	Name  string
	Shape []int // as the checkpoint stores it (vectors are 1-D)
	V     *tape.Var[T]
}

// convert returns src as []T: the same slice for float32, a copy otherwise.
func convert[T tape.Float](src []float32) []T {
	if s, ok := any(src).([]T); ok {
		return s
	}
	out := make([]T, len(src))
	for i, v := range src {
		out[i] = T(v)
	}
	return out
}

// NewWeights reads every parameter from src (a checkpoint directory or
// in-memory tensors) into T, all trainable: full fine-tuning. bf16 and f16
// checkpoints get float32 master weights.
func NewWeights[T tape.Float](cfg qwen.Config, src qwen.TensorSource) (*Weights[T], error) {
	return newWeights[T](cfg, src, true)
}

// newWeights is NewWeights with every parameter trainable or, for an
// adapter to be attached (AttachLoRA freezes the base anyway), none: then
// no gradient buffer as large as the model is allocated and touched. The
// values are converted in parallel pieces: a 7B checkpoint is 7.6 billion
// of them, each on a page the process touches for the first time.
func newWeights[T tape.Float](cfg qwen.Config, src qwen.TensorSource, trainable bool) (*Weights[T], error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	w := &Weights[T]{}
	type job struct {
		t safetensors.Tensor
		v *tape.Var[T]
	}
	var jobs []job
	d, err := qwen.Bind(cfg, func(p qwen.Param, dst **tape.Var[T]) error {
		t, ok := src.Tensor(p.Name)
		if !ok {
			return fmt.Errorf("tensor %q is missing", p.Name)
		}
		if !slices.Equal(t.Shape, p.Shape) {
			return fmt.Errorf("tensor %q has shape %v, config.json implies %v", p.Name, t.Shape, p.Shape)
		}
		rows, cols := 1, p.Shape[0]
		if len(p.Shape) == 2 {
			rows, cols = p.Shape[0], p.Shape[1]
		}
		*dst = &tape.Var[T]{Rows: rows, Cols: cols, Requires: trainable}
		w.Named = append(w.Named, NamedVar[T]{p.Name, p.Shape, *dst})
		jobs = append(jobs, job{t, *dst})
		return nil
	})
	if err != nil {
		return nil, err
	}
	// Every tensor's pieces of 4M values at once: small tensors (norms,
	// biases) do not wait on one another.
	type piece struct{ job, lo, hi int }
	var pieces []piece
	vals := make([][]float32, len(jobs))
	for i, j := range jobs {
		vals[i] = make([]float32, j.t.Len())
		for lo := 0; lo < len(vals[i]); lo += 1 << 22 {
			pieces = append(pieces, piece{i, lo, min(lo+1<<22, len(vals[i]))})
		}
	}
	par.For(len(pieces), 1, func(k, _ int) {
		p := pieces[k]
		jobs[p.job].t.Float32Into(vals[p.job][p.lo:p.hi], p.lo)
	})
	for i, j := range jobs {
		j.v.Val = convert[T](vals[i])
		if trainable {
			j.v.Grad = make([]T, len(j.v.Val))
		}
	}
	w.Decoder = d
	return w, nil
}

// AttachLoRA adds an adapter's A and B as the trainable parameters and
// freezes every base weight (their gradients are neither computed nor
// kept). With T = float32 the adapter's matrices are shared, so training
// updates a.Modules in place and a.Save writes the trained adapter.
func (w *Weights[T]) AttachLoRA(a *lora.Adapter) error {
	for _, m := range a.Modules {
		if _, err := w.Linear(m.Name); err != nil {
			return fmt.Errorf("adapter: %w", err)
		}
	}
	for _, nv := range w.Named {
		nv.V.Requires, nv.V.Grad = false, nil
	}
	for _, m := range a.Modules {
		l, _ := w.Linear(m.Name)
		if m.A.Cols != l.W.Cols || m.B.Rows != l.W.Rows || m.A.Rows != m.B.Cols {
			return fmt.Errorf("adapter module %s is [%d, %d] through rank %d, the layer is [%d, %d]", m.Name, m.B.Rows, m.A.Cols, m.A.Rows, l.W.Rows, l.W.Cols)
		}
		l.A = tape.Param(convert[T](m.A.Data), m.A.Rows, m.A.Cols, true)
		l.LB = tape.Param(convert[T](m.B.Data), m.B.Rows, m.B.Cols, true)
		l.Scale, l.Dropout = a.Config.Scale(), a.Config.Dropout
		w.Named = append(w.Named,
			NamedVar[T]{lora.TensorName(m.Name, "A"), []int{l.A.Rows, l.A.Cols}, l.A},
			NamedVar[T]{lora.TensorName(m.Name, "B"), []int{l.LB.Rows, l.LB.Cols}, l.LB})
	}
	cfg := a.Config
	w.LoRA = &cfg
	return nil
}

// Trainable lists the parameters that receive gradients.
func (w *Weights[T]) Trainable() []NamedVar[T] {
	var out []NamedVar[T]
	for _, nv := range w.Named {
		if nv.V.Requires {
			out = append(out, nv)
		}
	}
	return out
}

// BaseTensors returns the base weights (no LoRA) as float32 safetensors
// tensors in dtype, for a Hugging Face model directory.
func (w *Weights[T]) BaseTensors(dtype safetensors.DType) []safetensors.Tensor {
	var ts []safetensors.Tensor
	for _, nv := range w.Named {
		if strings.HasPrefix(nv.Name, "base_model.") {
			continue
		}
		v := make([]float32, len(nv.V.Val))
		for i, x := range nv.V.Val {
			v[i] = float32(x)
		}
		ts = append(ts, safetensors.FromFloat32(nv.Name, dtype, nv.Shape, v))
	}
	return ts
}

// SaveHF writes the base weights as a Hugging Face directory (config.json
// and model.safetensors) that transformers and this engine load.
func (w *Weights[T]) SaveHF(dir string, dtype safetensors.DType) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	if err := safetensors.Write(filepath.Join(dir, "model.safetensors"), w.BaseTensors(dtype), map[string]string{"format": "pt"}); err != nil {
		return err
	}
	return qwen.WriteConfig(dir, w.Config, dtype)
}

// Adapter returns the attached LoRA adapter's current values in PEFT's
// layout (nil without one).
func (w *Weights[T]) Adapter() *lora.Adapter {
	if w.LoRA == nil {
		return nil
	}
	a := &lora.Adapter{Config: *w.LoRA}
	f := func(v *tape.Var[T]) lora.Matrix {
		d := make([]float32, len(v.Val))
		for i, x := range v.Val {
			d[i] = float32(x)
		}
		return lora.Matrix{Rows: v.Rows, Cols: v.Cols, Data: d}
	}
	for _, l := range w.Linears() {
		if l.A != nil {
			a.Modules = append(a.Modules, lora.Module{Name: l.Module, A: f(l.A), B: f(l.LB)})
		}
	}
	return a
}

// Engine builds an inference qwen.Model with the current weights (and adapter)
// on a backend: rollouts generate with the policy being trained.
func (w *Weights[T]) Engine(be kernels.Backend) (*qwen.Model, error) {
	src := qwen.TensorMap{}
	for _, t := range w.BaseTensors(safetensors.F32) {
		src[t.Name] = t
	}
	m, err := qwen.FromTensors(be, w.Config, src)
	if err != nil {
		return nil, err
	}
	if a := w.Adapter(); a != nil {
		if err := m.ApplyAdapter(a); err != nil {
			return nil, err
		}
	}
	return m, nil
}

// Batch is packed training sequences: their tokens stacked as rows, each
// sequence a segment of attention, and the rows whose next token is learned.
type Batch struct {
	Tokens []int
	Pos    []int
	Segs   []tape.Segment
	// LossRows are the rows whose prediction of Targets[i] is scored.
	LossRows []int
	Targets  []int
	// Seq[i] is the sequence LossRows[i] belongs to.
	Seq []int
	// Weights[i] weighs LossRows[i] in the loss; nil when every sequence
	// left its weights at 1.
	Weights []float32
}

// Sequence is one training sequence: token ids, and for each token whether
// it is learned (predicted with a loss), e.g. the assistant's reply.
type Sequence struct {
	IDs  []int
	Loss []bool
	// Weights, if set, weigh each learned token in the loss (1 otherwise):
	// e.g. SFT's copy_weight on tokens the reply copies from its context.
	Weights []float32
}

// Pack stacks sequences into one batch. The longest prefix they all share
// and that carries no loss (a system prompt) is computed once, and every
// sequence continues from it: the same loss as running each sequence whole.
func Pack(seqs []Sequence) Batch {
	shared := 0
	if len(seqs) > 1 {
		shared = len(seqs[0].IDs)
		for _, s := range seqs[1:] {
			n := 0
			for n < min(shared, len(s.IDs)) && s.IDs[n] == seqs[0].IDs[n] {
				n++
			}
			shared = n
		}
		// Row r predicts token r+1, so the prefix rows [0, P) need tokens
		// up to P shared and no learned token among 1..P.
		shared--
		for _, s := range seqs {
			for i := 1; i <= shared; i++ {
				if s.Loss[i] {
					shared = i - 1
					break
				}
			}
		}
		shared = max(shared, 0)
	}
	var b Batch
	weighted := false
	for _, s := range seqs {
		weighted = weighted || s.Weights != nil
	}
	add := func(ids []int, loss []bool, from, seq int) {
		for i := from; i < len(ids); i++ {
			row := len(b.Tokens)
			b.Tokens = append(b.Tokens, ids[i])
			b.Pos = append(b.Pos, i)
			if i+1 < len(ids) && loss[i+1] {
				b.LossRows = append(b.LossRows, row)
				b.Targets = append(b.Targets, ids[i+1])
				b.Seq = append(b.Seq, seq)
				if weighted {
					w := float32(1)
					if seq >= 0 && seqs[seq].Weights != nil {
						w = seqs[seq].Weights[i+1]
					}
					b.Weights = append(b.Weights, w)
				}
			}
		}
	}
	if shared > 0 {
		add(seqs[0].IDs[:shared], seqs[0].Loss[:shared], 0, -1)
		b.Segs = append(b.Segs, tape.Segment{Lo: 0, Hi: shared})
	}
	for s, seq := range seqs {
		lo := len(b.Tokens)
		add(seq.IDs, seq.Loss, shared, s)
		if len(b.Tokens) > lo {
			b.Segs = append(b.Segs, tape.Segment{Lo: lo, Hi: len(b.Tokens), Prefix: shared})
		}
	}
	return b
}

// TrainOptions switch the training forward's memory and noise.
type TrainOptions struct {
	Recompute bool   // recompute each layer's activations in backward
	Seed      uint64 // LoRA dropout masks
	Dropout   bool   // apply LoRA dropout (training), not in evaluation
	// NoAdapter runs the base alone, as if no adapter were attached: GRPO's
	// reference policy under LoRA, without a second copy of the weights.
	NoAdapter bool
	// LogitChunk is how many learned tokens' vocabulary logits exist at
	// once (0: as many as fit LogitChunkFloats). With more learned tokens
	// than that, the LM head and log-softmax run chunk by chunk and the
	// backward recomputes each chunk's logits.
	LogitChunk int
	// MLPChunk is how many rows the device path's MLP runs at a time
	// under Recompute (0: as many as fit MLPChunkFloats).
	MLPChunk int
	// Temperature divides the logits before the log-softmax (0 or 1: none):
	// GRPO scores the policy it sampled from, π(·)/T, as TRL's GRPOTrainer
	// and verl do, so the ratio and the KL compare like with like.
	Temperature float64
}

// invTemperature is the factor on the final hidden state (logits/T =
// W·(x/T)); ok is false when there is none.
func (o TrainOptions) invTemperature() (s float64, ok bool) {
	if o.Temperature <= 0 || o.Temperature == 1 {
		return 1, false
	}
	return 1 / o.Temperature, true
}

// LogitChunkFloats bounds the logits (and their gradient) a step holds at
// once: 2²⁴ floats, 64 MiB, where a 152k vocabulary times 16k learned
// tokens would be 9 GiB.
const LogitChunkFloats = 1 << 24

// logitChunk is the rows of logits held at once for a vocabulary of v.
func (o TrainOptions) logitChunk(v int) int {
	if o.LogitChunk > 0 {
		return o.LogitChunk
	}
	return max(1, LogitChunkFloats/v)
}

// LogProbs runs the batch through the decoder on the tape and returns the
// log-probability of each learned token ([len(LossRows), 1]), the quantity
// SFT's loss and GRPO's ratio are built from.
func (w *Weights[T]) LogProbs(tp *tape.Tape[T], b Batch, o TrainOptions) *tape.Var[T] {
	lp, _ := w.logProbs(tp, b, o, false)
	return lp
}

// LogProbsEntropy is LogProbs plus the entropy of the policy at each learned
// token's position (no gradient): GRPO logs it.
func (w *Weights[T]) LogProbsEntropy(tp *tape.Tape[T], b Batch, o TrainOptions) (*tape.Var[T], []float64) {
	return w.logProbs(tp, b, o, true)
}

func (w *Weights[T]) logProbs(tp *tape.Tape[T], b Batch, o TrainOptions, entropy bool) (*tape.Var[T], []float64) {
	x := tp.Embedding(w.Embed, b.Tokens)
	for li := range w.Layers {
		l := &w.Layers[li]
		block := func(tp *tape.Tape[T], x *tape.Var[T]) *tape.Var[T] {
			return l.Forward(tapeOps[T]{tp, &w.Config, b, o}, li, x)
		}
		if o.Recompute {
			x = tp.Recompute(x, block)
		} else {
			x = block(tp, x)
		}
	}
	x = tp.RMSNorm(tp.Gather(x, b.LossRows), w.Norm, w.RMSNormEps)
	if s, ok := o.invTemperature(); ok {
		x = tp.Scale(x, s)
	}
	if chunk := o.logitChunk(w.LMHead.Rows); len(b.LossRows) > chunk {
		return tp.LinearLogProbs(x, w.LMHead, b.Targets, chunk, entropy)
	}
	logits := tp.Linear(x, w.LMHead, nil)
	var ent []float64
	if entropy {
		ent = tape.Entropy(logits)
	}
	return tp.LogProbs(logits, b.Targets), ent
}

// tapeOps record a block on the tape: packed sequences, each attending
// within its segment.
type tapeOps[T tape.Float] struct {
	tp  *tape.Tape[T]
	cfg *qwen.Config
	b   Batch
	o   TrainOptions
}

func (o tapeOps[T]) RMSNorm(x, w *tape.Var[T]) *tape.Var[T] {
	return o.tp.RMSNorm(x, w, o.cfg.RMSNormEps)
}

func (o tapeOps[T]) Linear(l *qwen.Linear[*tape.Var[T]], x *tape.Var[T]) *tape.Var[T] {
	tp := o.tp
	y := tp.Linear(x, l.W, l.B)
	if l.A == nil || o.o.NoAdapter {
		return y
	}
	in := x
	if o.o.Dropout {
		in = tp.Dropout(x, l.Dropout, l.DropoutSeed(o.o.Seed))
	}
	return tp.Add(y, tp.Scale(tp.Linear(tp.Linear(in, l.A, nil), l.LB, nil), l.Scale))
}

func (o tapeOps[T]) Rope(x *tape.Var[T], heads int) *tape.Var[T] {
	return o.tp.Rope(x, o.b.Pos, heads, o.cfg.HeadDim, o.cfg.RopeTheta)
}

func (o tapeOps[T]) Attention(_ int, q, k, v *tape.Var[T]) *tape.Var[T] {
	return o.tp.Attention(q, k, v, o.b.Segs, o.cfg.Heads, o.cfg.KVHeads, o.cfg.HeadDim)
}

func (o tapeOps[T]) SiLUMul(g, u *tape.Var[T]) *tape.Var[T] { return o.tp.SiLUMul(g, u) }

func (o tapeOps[T]) Add(a, b *tape.Var[T]) *tape.Var[T] { return o.tp.Add(a, b) }

// RowWise runs f on every row at once: the tape bounds its memory by
// recomputing whole layers (TrainOptions.Recompute) instead.
func (o tapeOps[T]) RowWise(x *tape.Var[T], f func(qwen.Ops[*tape.Var[T]], *tape.Var[T]) *tape.Var[T]) *tape.Var[T] {
	return f(o, x)
}
