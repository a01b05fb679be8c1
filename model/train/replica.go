package train

import (
	"github.com/agemem/agemem/internal/par"
	"github.com/agemem/agemem/kernels"
	"github.com/agemem/agemem/kernels/half"
	"github.com/agemem/agemem/model/lora"
	"github.com/agemem/agemem/model/optim"
	"github.com/agemem/agemem/model/qwen"
)

// Replica trains the decoder where a kernels.TrainBackend backend keeps
// it: the parameters, their gradients and AdamW moments live on the
// device, and a step (forward, backward, clipping, update) launches
// kernels without reading anything back. Each layer's forward is
// qwen.Layer.Forward, the engine's and the tape's, run by the replica's
// ops (block.go); its backward is written out by hand beside them, as
// llm.c does, and the tests hold it to the tape's (Weights.LogProbs).
// The replica's jobs, by file: holding the parameters (here), the block
// (block.go), the whole model's passes (pass.go), the update (adamw.go),
// an offloaded reference (offload.go), ZeRO-2's gradient stages (zero.go).
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
	return qwen.Bound(d.be, qwen.Map(d.Decoder, weight))
}

// Backend is the device the trainer runs on.
func (d *Replica) Backend() kernels.TrainBackend { return d.be }
