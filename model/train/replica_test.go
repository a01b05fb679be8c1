package train

import (
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"github.com/agemem/agemem/kernels"
	"github.com/agemem/agemem/kernels/cpu"
	"github.com/agemem/agemem/kernels/half"
	"github.com/agemem/agemem/model/lora"
	"github.com/agemem/agemem/model/optim"
	"github.com/agemem/agemem/model/qwen"
	"github.com/agemem/agemem/model/tape"
)

// relClose fails when got and want differ by more than tol relative to
// the largest magnitude of want.
func relClose(t *testing.T, name string, got, want []float32, tol float64) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%s: %d values, want %d", name, len(got), len(want))
	}
	scale, worst := 1e-30, 0.0
	for _, v := range want {
		scale = math.Max(scale, math.Abs(float64(v)))
	}
	for i := range want {
		worst = math.Max(worst, math.Abs(float64(got[i]-want[i])))
	}
	if worst/scale > tol || math.IsNaN(worst) {
		t.Fatalf("%s: max error %.3g relative to %.3g (> %.1g)", name, worst, scale, tol)
	}
}

// deviceCases are the shapes the device trainer is held to: Qwen3 (q/k
// norms, untied head), Qwen2 (biases, tied head), LoRA with dropout.
func deviceCases(t *testing.T) []struct {
	name string
	w    *Weights[float32]
} {
	mk := func(typ string, tied, withLoRA bool) *Weights[float32] {
		cfg := micro(typ, tied)
		cfg.HiddenSize, cfg.HeadDim, cfg.Intermediate = 16, 8, 24
		w := weightsFor[float32](t, cfg, 3)
		if withLoRA {
			a, err := lora.New(lora.Config{R: 2, Alpha: 4, Dropout: 0.25, TargetModules: []string{"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"}},
				w.linearModules(), w.linearShape, 5, true)
			if err != nil {
				t.Fatal(err)
			}
			if err := w.AttachLoRA(a); err != nil {
				t.Fatal(err)
			}
		}
		return w
	}
	return []struct {
		name string
		w    *Weights[float32]
	}{{"qwen3", mk("qwen3", false, false)}, {"qwen2 tied", mk("qwen2", true, false)}, {"qwen3 lora dropout", mk("qwen3", false, true)}}
}

// TestReplicaMatchesTape: on the CPU backend, the explicit
// forward/backward gives the tape's log-probabilities, entropies and
// gradients (the tape's are finite-difference checked), packed sequences
// with a shared prefix included; the same function runs the GPU check.
func TestReplicaMatchesTape(t *testing.T) {
	checkReplica(t, cpu.New(), 1e-5)
}

func checkReplica(t *testing.T, be kernels.TrainBackend, tol float64) {
	for _, c := range deviceCases(t) {
		t.Run(c.name, func(t *testing.T) {
			w := c.w
			b := Pack(fdSeqs)
			o := TrainOptions{Dropout: true, Seed: 42}
			r := rand.New(rand.NewPCG(7, 7))
			coef := make([]float32, len(b.LossRows))
			for i := range coef {
				coef[i] = float32(r.NormFloat64())
			}
			tp := tape.New[float32]()
			lp, ent := w.LogProbsEntropy(tp, b, o)
			tp.Backward(lp, coef)

			d := NewReplica(be, w, BaseF32)
			acts := d.Forward(b, o)
			relClose(t, "logprobs", be.ToHost(acts.LogProbs), lp.Val, tol)
			ent32 := make([]float32, len(ent))
			for i, e := range ent {
				ent32[i] = float32(e)
			}
			relClose(t, "entropy", be.ToHost(acts.Ent), ent32, tol)
			d.Backward(acts, be.FromHost(coef, len(coef)))
			tr := w.Trainable()
			if len(tr) != len(d.Params) {
				t.Fatalf("%d trainable on the device, %d on the tape", len(d.Params), len(tr))
			}
			for i, nv := range tr {
				relClose(t, "gradient of "+nv.Name, be.ToHost(d.Params[i].G), nv.V.Grad, 10*tol)
			}
			// The LM head in chunks of two learned tokens (the logits
			// recomputed in the backward) and every layer's activations
			// recomputed in the backward: the same values and gradients.
			oc2 := o
			oc2.LogitChunk, oc2.Recompute = 2, true
			d2 := NewReplica(be, w, BaseF32)
			acts2 := d2.Forward(b, oc2)
			if acts2.logits != nil || acts2.layers[0].att != nil {
				t.Fatal("the forward kept the whole logits or a layer's activations")
			}
			relClose(t, "chunked logprobs", be.ToHost(acts2.LogProbs), lp.Val, tol)
			relClose(t, "chunked entropy", be.ToHost(acts2.Ent), ent32, tol)
			d2.Backward(acts2, be.FromHost(coef, len(coef)))
			for i, nv := range tr {
				relClose(t, "chunked gradient of "+nv.Name, be.ToHost(d2.Params[i].G), nv.V.Grad, 10*tol)
			}
			// At a sampling temperature (GRPO's π/T), whole and chunked.
			for _, chunk := range []int{0, 2} {
				ot := o
				ot.Temperature, ot.LogitChunk = 0.7, chunk
				tpT := tape.New[float32]()
				lpT, entT := w.LogProbsEntropy(tpT, b, ot)
				for _, nv := range tr {
					clear(nv.V.Grad)
				}
				tpT.Backward(lpT, coef)
				dT := NewReplica(be, w, BaseF32)
				actsT := dT.Forward(b, ot)
				relClose(t, "logprobs at temperature 0.7", be.ToHost(actsT.LogProbs), lpT.Val, tol)
				if entT[0] == ent[0] {
					t.Fatal("the temperature did not change the entropy")
				}
				dT.Backward(actsT, be.FromHost(coef, len(coef)))
				for i, nv := range tr {
					relClose(t, "gradient at temperature 0.7 of "+nv.Name, be.ToHost(dT.Params[i].G), nv.V.Grad, 10*tol)
				}
			}
			tp = tape.New[float32]() // the gradients at temperature 1 again, for the step below
			for _, nv := range tr {
				clear(nv.V.Grad)
			}
			lp = w.LogProbs(tp, b, o)
			tp.Backward(lp, coef)
			// One optimiser step, clipped: the same update as optim's.
			params := make([]optim.Param, len(tr))
			for i, nv := range tr {
				params[i] = optim.Param{Name: nv.Name, W: nv.V.Val, G: nv.V.Grad, Decay: optim.DecayFor(nv.Name)}
			}
			oc := optim.AdamWConfig{Beta1: 0.9, Beta2: 0.99, Eps: 1e-8, WeightDecay: 0.1}
			optim.ClipGlobalNorm(params, 0.5)
			opt := optim.NewAdamW(oc)
			if err := opt.Step(params, 1e-2); err != nil {
				t.Fatal(err)
			}
			ss := d.Step(oc, 1, 1e-2, 0.5, nil)
			if got := be.ToHost(ss)[0]; got <= 0.25 {
				t.Fatalf("squared gradient norm %g: the test must clip", got)
			}
			for i, nv := range tr {
				if strings.HasSuffix(nv.Name, "k_proj.bias") {
					// Its gradient is zero up to rounding (a key bias shifts
					// every score of a row alike), and Adam scales rounding
					// noise to a full step of either sign.
					continue
				}
				relClose(t, "updated "+nv.Name, be.ToHost(d.Params[i].W), nv.V.Val, 10*tol)
				relClose(t, "zeroed gradient of "+nv.Name, be.ToHost(d.Params[i].G), make([]float32, len(nv.V.Val)), 0)
			}
			// Download brings the update (and moments) to the host.
			host := make([]float32, len(tr[0].V.Val))
			copy(host, tr[0].V.Val)
			clear(tr[0].V.Val)
			opt2 := optim.NewAdamW(oc)
			d.Download(w, opt2)
			relClose(t, "downloaded "+tr[0].Name, tr[0].V.Val, host, 0)
			relClose(t, "downloaded moment of "+tr[0].Name, opt2.M[tr[0].Name], opt.M[tr[0].Name], 10*tol)
		})
	}
}

// TestReplicaRecomputeChunksTheMLP: recomputing, the device path runs the
// MLP a few rows at a time (MLPChunk; the widest intermediates exist a
// chunk at a time) and gives the tape's log-probabilities and gradients.
// With LoRA dropout each chunk draws its own masks, the same again when the
// backward recomputes it: the gradient is that of the function the forward
// computed (a directional finite difference of the replica's own forward).
func TestReplicaRecomputeChunksTheMLP(t *testing.T) {
	be := cpu.New()
	b := Pack(fdSeqs)
	coef := make([]float32, len(b.LossRows))
	for i := range coef {
		coef[i] = float32(i%3) - 1
	}
	for _, c := range deviceCases(t) {
		w := c.w
		for _, nv := range w.Trainable() {
			clear(nv.V.Grad)
		}
		tp := tape.New[float32]()
		lp := w.LogProbs(tp, b, TrainOptions{})
		tp.Backward(lp, coef)
		for _, chunk := range []int{1, 4, 7} {
			o := TrainOptions{Recompute: true, MLPChunk: chunk}
			d := NewReplica(be, w, BaseF32)
			acts := d.Forward(b, o)
			relClose(t, c.name+": chunked MLP logprobs", be.ToHost(acts.LogProbs), lp.Val, 1e-5)
			d.Backward(acts, be.FromHost(coef, len(coef)))
			for i, nv := range w.Trainable() {
				relClose(t, c.name+": chunked MLP gradient of "+nv.Name, be.ToHost(d.Params[i].G), nv.V.Grad, 1e-4)
			}
		}
	}
	// LoRA dropout, chunks of 4 rows.
	cs := deviceCases(t)
	w := cs[len(cs)-1].w
	o := TrainOptions{Recompute: true, MLPChunk: 4, Dropout: true, Seed: 9}
	loss := func() float64 {
		acts := NewReplica(be, w, BaseF32).Forward(b, o)
		var l float64
		for i, v := range be.ToHost(acts.LogProbs) {
			l += float64(coef[i] * v)
		}
		return l
	}
	d := NewReplica(be, w, BaseF32)
	d.Backward(d.Forward(b, o), be.FromHost(coef, len(coef)))
	r := rand.New(rand.NewPCG(3, 3))
	var want float64
	dirs := map[string][]float32{}
	for i, nv := range w.Trainable() {
		if !strings.Contains(nv.Name, "mlp") {
			continue
		}
		u := make([]float32, len(nv.V.Val))
		g := be.ToHost(d.Params[i].G)
		for j := range u {
			u[j] = float32(r.NormFloat64())
			want += float64(u[j] * g[j])
		}
		dirs[nv.Name] = u
	}
	step := func(eps float32) {
		for _, nv := range w.Trainable() {
			for j, v := range dirs[nv.Name] {
				nv.V.Val[j] += eps * v
			}
		}
	}
	const eps = 1e-2
	step(eps)
	up := loss()
	step(-2 * eps)
	down := loss()
	step(eps)
	if got := (up - down) / (2 * eps); math.Abs(got-want) > 0.02*math.Abs(want) {
		t.Fatalf("directional derivative of the MLP adapters under chunked dropout: finite difference %.5g, gradient %.5g", got, want)
	}
}

// TestReplicaBF16Checkpoints: with a bf16 base, recomputation keeps each
// layer's input in bf16 (half the bytes; a bf16 table on the device): the
// forward is unchanged and the gradients are the float32 checkpoints'
// within bf16 rounding.
func TestReplicaBF16Checkpoints(t *testing.T) {
	be := cpu.New()
	cs := deviceCases(t)
	w := cs[len(cs)-1].w // LoRA: a bf16 base needs frozen matrices
	b := Pack(fdSeqs)
	coef := make([]float32, len(b.LossRows))
	for i := range coef {
		coef[i] = float32(i%3) - 1
	}
	o := TrainOptions{Dropout: true, Seed: 42}
	ref := NewReplica(be, w, BaseBF16) // nothing recomputed: float32 activations
	refActs := ref.Forward(b, o)
	ref.Backward(refActs, be.FromHost(coef, len(coef)))
	o.Recompute = true
	d := NewReplica(be, w, BaseBF16)
	acts := d.Forward(b, o)
	for li, a := range acts.layers {
		ct, ok := a.xs.(*cpu.Tensor)
		if a.x != nil || !ok || ct.Data != nil {
			t.Fatalf("layer %d's checkpoint is not held in bf16", li)
		}
	}
	relClose(t, "logprobs", be.ToHost(acts.LogProbs), be.ToHost(refActs.LogProbs), 0)
	d.Backward(acts, be.FromHost(coef, len(coef)))
	for i, p := range d.Params {
		relClose(t, "gradient of "+p.Name, be.ToHost(p.G), be.ToHost(ref.Params[i].G), 3e-2)
	}
}

// TestReplicaBF16Base: under LoRA a replica may hold the frozen base in
// bf16 (half its bytes); it then computes exactly what the tape computes
// with the base rounded to bf16, gradients of the adapters included.
func TestReplicaBF16Base(t *testing.T) {
	d := checkBF16Base(t, cpu.New(), 1e-5)
	// Held as uploaded bf16 weights, not float32 tensors.
	for name, p := range d.all {
		if ct := p.W.(*cpu.Tensor); strings.HasSuffix(name, "proj.weight") && ct.Data != nil {
			t.Fatalf("%s is held in float32", name)
		}
	}
}

func checkBF16Base(t *testing.T, be kernels.TrainBackend, tol float64) *Replica {
	cs := deviceCases(t)
	w := cs[len(cs)-1].w // LoRA
	frozen := 0
	for _, nv := range w.Named {
		if v := nv.V; !v.Requires && v.Rows > 1 && v.Cols > 1 {
			for i, x := range v.Val {
				v.Val[i] = half.BF16ToF32(half.F32ToBF16(x))
			}
			frozen++
		}
	}
	if frozen == 0 {
		t.Fatal("no frozen matrices under LoRA")
	}
	b := Pack(fdSeqs)
	o := TrainOptions{Dropout: true, Seed: 42}
	lp, coef := tapeStep(w, b, o)
	d := NewReplica(be, w, BaseBF16)
	acts := d.Forward(b, o)
	relClose(t, "logprobs", be.ToHost(acts.LogProbs), lp, tol)
	d.Backward(acts, be.FromHost(coef, len(coef)))
	for i, nv := range w.Trainable() {
		relClose(t, "gradient of "+nv.Name, be.ToHost(d.Params[i].G), nv.V.Grad, 10*tol)
	}
	return d
}

// TestReplicaQ8Base: under LoRA a replica may hold the base's projections
// as Q8_0 blocks (model.train_dtype: q8_0): 36 bytes per 32 values, the
// embeddings and LM head in bf16, a projection whose rows cannot be
// blocked (o_proj's 24 inputs here) in bf16 too. It computes what the tape
// computes with the base rounded so (dequantized Q8_0, bf16), within the
// error of the CPU's q8_0 matmul, which quantizes its input too; the
// adapters' gradients included.
func TestReplicaQ8Base(t *testing.T) {
	d, w := checkQ8Base(t, cpu.New(), 2e-3, 4e-2)
	held := map[string]int{}
	for _, nv := range w.Named {
		v := nv.V
		got := d.all[nv.Name].W.(*cpu.Tensor).Bytes()
		n := v.Rows * v.Cols
		want := 4 * n
		switch {
		case v.Requires || v.Rows == 1 || v.Cols == 1:
		case strings.HasSuffix(nv.Name, "proj.weight") && v.Cols%32 == 0:
			want = n / 32 * 36
		default:
			want = 2 * n
		}
		if got != want {
			t.Fatalf("%s [%d, %d] takes %d bytes on the device, want %d", nv.Name, v.Rows, v.Cols, got, want)
		}
		held[map[int]string{4 * n: "f32", 2 * n: "bf16", n / 32 * 36: "q8_0"}[want]]++
	}
	// 2 layers × (q, k, v, gate, up, down); o_proj, the embeddings and the
	// head in bf16.
	if held["q8_0"] != 12 || held["bf16"] != 4 {
		t.Fatalf("held as %v, want 12 Q8_0 projections and 4 bf16 matrices", held)
	}
}

// checkQ8Base trains one step of a LoRA replica over a Q8_0 base on be and
// holds its log-probabilities and adapter gradients to the tape's over the
// base rounded as the replica holds it.
func checkQ8Base(t *testing.T, be kernels.TrainBackend, lpTol, gradTol float64) (*Replica, *Weights[float32]) {
	cfg := qwen.Config{ModelType: "qwen3", HiddenSize: 32, Layers: 2, Heads: 3, KVHeads: 1, HeadDim: 8,
		Intermediate: 64, RMSNormEps: 1e-6, RopeTheta: 1e4, VocabSize: 11, MaxPositions: 64}
	w := weightsFor[float32](t, cfg, 3)
	a, err := lora.New(lora.Config{R: 2, Alpha: 4, TargetModules: qwen.LoRATargets}, w.linearModules(), w.linearShape, 5, true)
	if err != nil {
		t.Fatal(err)
	}
	if err := w.AttachLoRA(a); err != nil {
		t.Fatal(err)
	}
	// B starts at zero; move it so that the adapters change the output.
	for _, nv := range w.Trainable() {
		for i := range nv.V.Val {
			nv.V.Val[i] += 0.05 * float32((i%5)-2)
		}
	}
	d := NewReplica(be, w, BaseQ8)
	for _, nv := range w.Named { // the tape's base: rounded as held
		v := nv.V
		switch {
		case v.Requires || v.Rows == 1 || v.Cols == 1:
		case strings.HasSuffix(nv.Name, "proj.weight") && v.Cols%32 == 0:
			q, err := kernels.QuantizeQ8(kernels.Weight{Rows: v.Rows, Cols: v.Cols, F32: v.Val})
			if err != nil {
				t.Fatal(err)
			}
			copy(v.Val, q.Dequantize().F32)
		default:
			for i, x := range v.Val {
				v.Val[i] = half.BF16ToF32(half.F32ToBF16(x))
			}
		}
	}
	b := Pack(fdSeqs)
	o := TrainOptions{}
	lp, coef := tapeStep(w, b, o)
	acts := d.Forward(b, o)
	relClose(t, "logprobs", be.ToHost(acts.LogProbs), lp, lpTol)
	d.Backward(acts, be.FromHost(coef, len(coef)))
	for i, nv := range w.Trainable() {
		got := be.ToHost(d.Params[i].G)
		relClose(t, "gradient of "+nv.Name, got, nv.V.Grad, gradTol)
		sameDirection(t, "gradient of "+nv.Name, got, nv.V.Grad)
	}
	return d, w
}

// sameDirection fails when got's cosine with want is under 0.99: what
// rounding (bf16 activations, a quantized base) cannot do to a gradient
// and a wrong one does. A want of zero up to rounding has no direction.
func sameDirection(t *testing.T, name string, got, want []float32) {
	t.Helper()
	var dot, a2, b2 float64
	for j, v := range want {
		dot += float64(v) * float64(got[j])
		a2 += float64(v) * float64(v)
		b2 += float64(got[j]) * float64(got[j])
	}
	if a2 < 1e-12 {
		return
	}
	if cos := dot / math.Sqrt(a2*b2); !(cos >= 0.99) {
		t.Fatalf("%s has cosine %.4f with the tape's", name, cos)
	}
}

// tapeStep is the reference a replica is held to: the tape's
// log-probabilities of b and, in w's gradients, the backward of a fixed
// mix of their coefficients (returned too).
func tapeStep(w *Weights[float32], b Batch, o TrainOptions) (lp, coef []float32) {
	coef = make([]float32, len(b.LossRows))
	for i := range coef {
		coef[i] = float32(i%3) - 1
	}
	tp := tape.New[float32]()
	v := w.LogProbs(tp, b, o)
	tp.Backward(v, coef)
	return v.Val, coef
}

// TestReplicaEngineSharesTheTrainersWeights: Replica.Engine decodes with
// the replica's own tensors: its logits are the host engine's (built from a
// copy of the weights, the adapter's scale folded in), it allocates no
// weights of its own, and after a training step on the replica it decodes
// with the new weights, as a host engine rebuilt from them does.
func TestReplicaEngineSharesTheTrainersWeights(t *testing.T) {
	checkReplicaEngine(t, cpu.New(), 1e-5)
}

func checkReplicaEngine(t *testing.T, be kernels.TrainBackend, tol float64) {
	prompt := []int{3, 9, 1, 7, 7, 2}
	logits := func(m *qwen.Model) []float32 {
		out, err := m.ForwardLast([][]int{prompt}, []*qwen.Cache{m.NewCache(len(prompt))})
		if err != nil {
			t.Fatal(err)
		}
		return out[0]
	}
	for _, c := range deviceCases(t) {
		d := NewReplica(be, c.w, BaseF32)
		eng := d.Engine()
		if eng.Embed != d.Embed.W || eng.Layers[0].MLP.Up.W != d.Layers[0].MLP.Up.W.W {
			t.Fatalf("%s: the engine holds its own weights", c.name)
		}
		host, err := c.w.Engine(be)
		if err != nil {
			t.Fatal(err)
		}
		before := logits(eng)
		relClose(t, c.name+" engine vs host engine", before, logits(host), tol)

		b := Pack(fdSeqs)
		coef := make([]float32, len(b.LossRows))
		for i := range coef {
			coef[i] = 1
		}
		d.Backward(d.Forward(b, TrainOptions{}), be.FromHost(coef, len(coef)))
		d.Step(optim.AdamWConfig{Beta1: 0.9, Beta2: 0.999, Eps: 1e-8}, 1, 1e-2, 0, nil)
		d.Download(c.w, nil)
		after, err := c.w.Engine(be)
		if err != nil {
			t.Fatal(err)
		}
		now := logits(eng)
		relClose(t, c.name+" engine after a step vs a rebuilt host engine", now, logits(after), tol)
		if slices.Equal(now, before) {
			t.Fatalf("%s: the step did not change the engine's logits", c.name)
		}
	}
}

// lseCPU is the CPU backend as a kernels.LSEAttender: its forward writes
// each row's log-sum-exp beside the values, and its backward checks that
// the lse it is handed is that of the rows it is asked about, as the CUDA
// tensor-core kernels would silently use whatever they are given.
type lseCPU struct {
	*cpu.Backend
	t            *testing.T
	kept, handed int
}

// lseOf: each query row's natural log-sum-exp of its scaled causal scores.
func (b *lseCPU) lseOf(q, k kernels.Tensor, start, heads, kvHeads, hd int) []float32 {
	qh, kh := b.ToHost(q), b.ToHost(k)
	t := len(qh) / (heads * hd)
	out := make([]float32, t*heads)
	for i := range t {
		for h := range heads {
			kv := h / (heads / kvHeads)
			m, s := math.Inf(-1), 0.0
			sc := make([]float64, start+i+1)
			for j := range sc {
				for d := range hd {
					sc[j] += float64(qh[(i*heads+h)*hd+d]) * float64(kh[(j*kvHeads+kv)*hd+d])
				}
				sc[j] /= math.Sqrt(float64(hd))
				m = math.Max(m, sc[j])
			}
			for _, v := range sc {
				s += math.Exp(v - m)
			}
			out[i*heads+h] = float32(m + math.Log(s))
		}
	}
	return out
}

func (b *lseCPU) AttentionLSE(out, lse, q, k, v kernels.Tensor, start, heads, kvHeads, hd int) bool {
	b.Attention(out, q, k, v, nil, start, heads, kvHeads, hd)
	b.Zero(lse)
	b.AddScaled(lse, b.FromHost(b.lseOf(q, k, start, heads, kvHeads, hd), lse.Len()), 1)
	b.kept++
	return true
}

func (b *lseCPU) AttentionBackwardLSE(dq, dk, dv, dout, out, lse, q, k, v kernels.Tensor, start, heads, kvHeads, hd int) {
	relClose(b.t, "the lse handed to the backward", b.ToHost(lse), b.lseOf(q, k, start, heads, kvHeads, hd), 1e-6)
	b.handed++
	b.AttentionBackward(dq, dk, dv, dout, out, q, k, v, start, heads, kvHeads, hd)
}

// TestReplicaKeepsTheLSE: on a backend that keeps attention's log-sum-exps
// (kernels.LSEAttender), the replica hands each segment's rows of them to
// its backward, whole and recomputing, packed sequences with a shared
// prefix included, and still gives the tape's values and gradients.
func TestReplicaKeepsTheLSE(t *testing.T) {
	be := &lseCPU{Backend: cpu.New(), t: t}
	checkReplica(t, be, 1e-5)
	if be.kept == 0 || be.handed == 0 {
		t.Fatalf("the replica kept %d lse tensors and handed %d to the backward", be.kept, be.handed)
	}
}
