package train

import (
	"strings"
	"testing"

	"github.com/agemem/agemem/internal/testkit"
	"github.com/agemem/agemem/model/tape"
)

// TestCUDAReplicaMatchesTape holds the GPU training step (forward,
// backward, clipped AdamW) to the CPU tape, as TestReplicaMatchesTape
// holds the CPU backend.
func TestCUDAReplicaMatchesTape(t *testing.T) {
	g := testkit.GPU(t)
	checkReplica(t, g, 1e-4)
}

// TestCUDAReplicaEngine: GRPO's rollouts on a GPU decode with the
// replica's own weights; the engine's logits are a host engine's, before
// and after a training step.
func TestCUDAReplicaEngine(t *testing.T) {
	checkReplicaEngine(t, testkit.GPU(t), 1e-4)
}

// TestCUDAReplicaBF16Base: the frozen base held in bf16 on the GPU (f32
// GEMMs reading bf16 weights) against the tape on the rounded base.
func TestCUDAReplicaBF16Base(t *testing.T) {
	checkBF16Base(t, testkit.GPU(t), 1e-4)
}

// TestCUDAReplicaQ8Base: the base's projections held as Q8_0 blocks on the
// GPU (model.train_dtype: q8_0: widened to bf16 for tensor-core GEMMs)
// against the tape on the dequantized base, within bf16 rounding: the
// activations are rounded too here (an H200 measured 5.1% on the largest
// element of one adapter's gradient), so each gradient must also point the
// tape's way, as in TestCUDAReplicaBF16.
func TestCUDAReplicaQ8Base(t *testing.T) {
	g := testkit.GPU(t)
	g.BF16 = true
	checkQ8Base(t, g, 2e-2, 0.1)
}

// TestCUDAReplicaBF16: with tensor-core bf16 matmuls (mixed
// precision) the step stays close to the f32 tape: log-probabilities within
// bf16 rounding and every gradient pointing the same way (cosine > 0.99).
func TestCUDAReplicaBF16(t *testing.T) {
	g := testkit.GPU(t)
	g.BF16 = true
	for _, c := range deviceCases(t) {
		w := c.w
		b := Pack(fdSeqs)
		coef := make([]float32, len(b.LossRows))
		for i := range coef {
			coef[i] = float32(i%3) - 1.2
		}
		tp := tape.New[float32]()
		lp := w.LogProbs(tp, b, TrainOptions{})
		tp.Backward(lp, coef)
		d := NewReplica(g, w, BaseF32)
		acts := d.Forward(b, TrainOptions{})
		relClose(t, c.name+" bf16 logprobs", g.ToHost(acts.LogProbs), lp.Val, 2e-2)
		d.Backward(acts, g.FromHost(coef, len(coef)))
		for i, nv := range w.Trainable() {
			if strings.HasSuffix(nv.Name, "k_proj.bias") {
				continue // zero up to rounding: no direction
			}
			sameDirection(t, c.name+": gradient of "+nv.Name, g.ToHost(d.Params[i].G), nv.V.Grad)
		}
	}
}
