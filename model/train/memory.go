package train

import (
	"slices"

	"github.com/agemem/agemem/kernels"
	"github.com/agemem/agemem/model/lora"
	"github.com/agemem/agemem/model/qwen"
)

// State is what a replica holds between steps: Weights (the frozen ones
// as the base is held, NewReplica; trainable ones, norms and biases in
// float32, or under ZeRO-2 with a bf16 base as bf16 working copies and a
// share of the float32 masters) and Optimizer (the gradients, and the two
// AdamW moments of each trainable parameter on one of the shards devices,
// model.zero_stage), in bytes, of Params base parameters and Trainable ones
// (the adapters under LoRA, else all of them).
type State struct {
	Params, Trainable  float64
	Weights, Optimizer float64
}

// StateBytes is State for the model c. l.Enabled trains an adapter of rank
// l.R on l.TargetModules over a frozen base held as base says; else every
// weight trains. zeroStage (model.zero_stage) over shards devices: 1
// splits the moments; 2 also the gradients (a device holds its share and,
// while the backward makes them, one stage's of the others: the largest
// of a layer, the head, the embedding) and, with a bf16 base, the float32
// masters of the trainable matrices under bf16 working copies.
// agemem-train train --dry-run prints it; TestStepBytesMeasured holds it
// to a metered step.
func StateBytes(c qwen.Config, l lora.Options, base Base, shards, zeroStage int) State {
	var s State
	shards = max(shards, 1)
	if zeroStage < 1 {
		shards = 1
	}
	z2 := zeroStage >= 2 && shards > 1
	working := z2 && base != BaseF32
	trainable := func(n float64) float64 { // the bytes of a trainable matrix's weights
		if working {
			return 2*n + 4*n/float64(shards)
		}
		return 4 * n
	}
	stage := map[int]float64{} // trainable floats by backward stage (layer; -1 the rest)
	for _, p := range qwen.Params(c) {
		n := 1.0
		for _, d := range p.Shape {
			n *= float64(d)
		}
		s.Params += n
		matrix := len(p.Shape) == 2 && p.Shape[0] > 1 && p.Shape[1] > 1
		switch {
		case !l.Enabled && matrix:
			s.Weights += trainable(n)
		case !l.Enabled || !matrix || base == BaseF32:
			s.Weights += 4 * n
		case base == BaseQ8 && p.Role == qwen.Weight && p.Shape[1]%kernels.QK8 == 0:
			s.Weights += n / kernels.QK8 * (kernels.QK8 + 4) // int8 values, a float32 scale
		default:
			s.Weights += 2 * n
		}
		switch {
		case !l.Enabled && p.Layer >= 0:
			stage[p.Layer] += n
		case !l.Enabled: // the embedding, final norm or head: the largest alone
			stage[-1] = max(stage[-1], n)
		case p.Role == qwen.Weight && slices.Contains(l.TargetModules, p.Target):
			a := float64(l.R) * float64(p.Shape[0]+p.Shape[1])
			s.Trainable += a
			s.Weights += trainable(a) // the adapter
			stage[p.Layer] += a
		}
	}
	if !l.Enabled {
		s.Trainable = s.Params
	}
	grads := 4 * s.Trainable
	if z2 {
		bucket := 0.0
		for _, n := range stage {
			bucket = max(bucket, n)
		}
		grads = 4*s.Trainable/float64(shards) + 4*bucket
	}
	s.Optimizer = grads + 8*s.Trainable/float64(shards)
	return s
}

// ActivationBytes estimates what one micro-batch's forward and backward
// holds beyond the weights, their gradients and the optimiser state:
// activations (and their gradients) of tokens positions, and the LM head's
// logits and their gradient for learned tokens, in bytes. device is the
// explicit path (Replica) rather than the CPU tape; ckptBF16 is a replica
// with a bf16 base, whose recomputation keeps layer inputs in bf16.
// agemem-train train --dry-run prints these; TestActivationBytesMeasured
// holds them to a metered run.
func ActivationBytes(c qwen.Config, tokens, learned int, o TrainOptions, device, ckptBF16 bool) (act, logits float64) {
	h, L, inter := float64(c.HiddenSize), float64(c.Layers), float64(c.Intermediate)
	qw, kvw := float64(c.Heads*c.HeadDim), float64(c.KVHeads*c.HeadDim)
	n := float64(tokens)
	// The LM head runs at most logitChunk learned tokens' logits at a time,
	// and their gradient.
	logits = float64(min(learned, o.logitChunk(c.VocabSize))) * float64(c.VocabSize) * 4 * 2
	if !device {
		// The tape: each op's inputs and, in the backward, their gradients,
		// per token and layer (measured at 63 KiB/token on the tiny
		// default); recomputing, each layer's input and one layer's worth.
		layer := 12*h + 4*qw + 4*kvw + 5*inter
		if o.Recompute {
			return n * 4 * (L*h + layer), logits
		}
		return n * 4 * L * layer, logits
	}
	// The replica, float by float. A layer's attention half keeps its
	// input, the normed input, q, k, v, the attention output, the residual
	// and the MLP's normed input (Qwen3 also q and k before their norms).
	attn := 4*h + 2*qw + 2*kvw
	if c.QKNorm() {
		attn += qw + kvw
	}
	// The MLP keeps gate, up and their product; its backward adds their
	// gradients (six intermediate-wide tensors, or five and the LoRA
	// dropout's two copies of the widest input), over rows at a time.
	rows := n
	if o.Recompute {
		rows = min(n, float64(max(1, MLPChunkFloats/c.Intermediate)))
		if o.MLPChunk > 0 {
			rows = min(n, float64(o.MLPChunk))
		}
	}
	mlp := 6 * inter * rows / n
	// The backward of a layer at its peak: the MLP's, with the gradients
	// of its input and of the layer's output; or the attention's, with
	// the gradients of the attention output, q, k, v and the normed input.
	peak := max(attn+2*h+mlp, attn+h+2*qw+2*kvw)
	var held float64 // what the layers keep for the backward
	if o.Recompute {
		// Each layer's input (its checkpoint).
		held = n * L * h * 4
		if ckptBF16 {
			held /= 2
		}
	} else {
		// Every layer's activations, the MLP's whole, but the one whose
		// backward runs (in peak).
		held = n * 4 * (L - 1) * (attn + 3*inter)
		peak += 3 * inter * (1 - rows/n)
	}
	// The peak is in a layer's backward (the running gradient, the logits
	// when they were kept whole) or at the head (the logits and their
	// gradient); act is what it adds to the logits line.
	kept := 0.0
	if learned <= o.logitChunk(c.VocabSize) {
		kept = logits / 2
	}
	return max(held+n*4*(h+peak)+kept, held+logits) - logits, logits
}

// ReferenceBytes is what a device holds of a frozen reference policy (full
// fine-tuning at rl.beta > 0), its matrices as base holds frozen ones
// (bf16 unless BaseF32): all of it, or under model.offload_reference the
// embedding, final norm and head with one layer at a time.
func ReferenceBytes(c qwen.Config, base Base, offload bool) float64 {
	layers := make([]float64, c.Layers)
	rest := 0.0
	for _, p := range qwen.Params(c) {
		n := 1.0
		for _, d := range p.Shape {
			n *= float64(d)
		}
		b := 4 * n
		if len(p.Shape) == 2 && p.Shape[0] > 1 && p.Shape[1] > 1 && base != BaseF32 {
			b = 2 * n
		}
		if p.Layer >= 0 {
			layers[p.Layer] += b
		} else {
			rest += b
		}
	}
	if offload {
		return rest + slices.Max(layers)
	}
	for _, b := range layers {
		rest += b
	}
	return rest
}
