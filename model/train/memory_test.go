package train

import (
	"runtime"
	"testing"
	"weak"

	"github.com/agemem/agemem/kernels"
	"github.com/agemem/agemem/kernels/cpu"
	"github.com/agemem/agemem/model/lora"
	"github.com/agemem/agemem/model/optim"
	"github.com/agemem/agemem/model/qwen"
)

// meter is the CPU backend counting the bytes of the tensors it allocated
// that are still reachable: before each allocation (of 16 KiB or more) it
// collects garbage and drops what was freed, so peak is the most ever held at once (the
// caching allocator's figure on a GPU, without its size classes).
type meter struct {
	*cpu.Backend
	live       []held
	now, peak  int64
	collecting bool
}

type held struct {
	alive func() bool
	bytes int64
}

func (m *meter) add(alive func() bool, bytes int64) {
	if m.collecting && bytes >= 16<<10 { // small ones cannot make the peak
		runtime.GC()
		kept := m.live[:0]
		m.now = 0
		for _, h := range m.live {
			if h.alive() {
				kept = append(kept, h)
				m.now += h.bytes
			}
		}
		m.live = kept
	}
	m.live = append(m.live, held{alive, bytes})
	m.now += bytes
	m.peak = max(m.peak, m.now)
}

func (m *meter) track(t kernels.Tensor) kernels.Tensor {
	d := t.(*cpu.Tensor).Data
	if len(d) > 0 {
		w := weak.Make(&d[0]) // the backing array: views keep it alive
		m.add(func() bool { return w.Value() != nil }, int64(4*len(d)))
	}
	return t
}

func (m *meter) Zeros(shape ...int) kernels.Tensor { return m.track(m.Backend.Zeros(shape...)) }
func (m *meter) Empty(shape ...int) kernels.Tensor { return m.track(m.Backend.Empty(shape...)) }
func (m *meter) FromHost(d []float32, shape ...int) kernels.Tensor {
	return m.track(m.Backend.FromHost(d, shape...))
}
func (m *meter) Upload(w kernels.Weight) kernels.Tensor {
	t := m.Backend.Upload(w)
	p := weak.Make(t.(*cpu.Tensor))
	m.add(func() bool { return p.Value() != nil }, int64(w.Bytes()))
	return t
}
func (m *meter) NarrowBF16(x kernels.Tensor) kernels.Tensor {
	t := m.Backend.NarrowBF16(x)
	w := weak.Make(t.(*cpu.Tensor)) // nothing takes views of a checkpoint
	m.add(func() bool { return w.Value() != nil }, int64(2*x.Len()))
	return t
}

// TestActivationBytesMeasured: what --dry-run predicts for a micro-batch's
// activations and logits (ActivationBytes) is within 10% of the most a
// replica's forward and backward hold at once on the metered CPU backend,
// beyond its weights and gradients: whole, recomputed, recomputed with the
// MLP in chunks and with bf16 checkpoints (LoRA on all seven projections).
func TestActivationBytesMeasured(t *testing.T) {
	for _, typ := range []string{"qwen2", "qwen3"} {
		cfg := qwen.Config{ModelType: typ, HiddenSize: 64, Layers: 4, Heads: 4, KVHeads: 2, HeadDim: 16,
			Intermediate: 256, RMSNormEps: 1e-6, RopeTheta: 1e4, TieEmbeddings: typ == "qwen2", VocabSize: 512, MaxPositions: 2048}
		measureActivations(t, cfg)
	}
}

func measureActivations(t *testing.T, cfg qwen.Config) {
	w := weightsFor[float32](t, cfg, 1)
	a, err := lora.New(lora.Config{R: 4, Alpha: 8, Dropout: 0.05, TargetModules: []string{"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"}},
		w.linearModules(), w.linearShape, 2, true)
	if err != nil {
		t.Fatal(err)
	}
	if err := w.AttachLoRA(a); err != nil {
		t.Fatal(err)
	}
	const n, learned = 512, 128
	ids, loss := make([]int, n), make([]bool, n)
	for i := range ids {
		ids[i] = (i * 7) % cfg.VocabSize
		loss[i] = i >= n-learned
	}
	b := Pack([]Sequence{{IDs: ids, Loss: loss}})
	for _, c := range []struct {
		name string
		o    TrainOptions
		bf16 bool
	}{
		{"whole", TrainOptions{}, false},
		{"recomputed", TrainOptions{Recompute: true}, false},
		{"recomputed, MLP in chunks of 64 rows", TrainOptions{Recompute: true, MLPChunk: 64}, false},
		{"recomputed, MLP chunks, bf16 checkpoints", TrainOptions{Recompute: true, MLPChunk: 64}, true},
		{"logits in chunks of 32 rows", TrainOptions{Recompute: true, LogitChunk: 32}, false},
	} {
		m := &meter{Backend: cpu.New()}
		base := BaseF32
		if c.bf16 {
			base = BaseBF16
		}
		d := NewReplica(m, w, base)
		coef := m.FromHost(make([]float32, learned), learned)
		m.collecting = true
		m.add(func() bool { return false }, 0) // collect what the set-up left
		start := m.now
		m.peak = start
		d.Backward(d.Forward(b, c.o), coef)
		m.add(func() bool { return false }, 0)
		got := float64(m.peak - start)
		act, logits := ActivationBytes(cfg, n, learned, c.o, true, c.bf16)
		ratio := (act + logits) / got
		t.Logf("%s %s: predicted %.2f MiB (activations %.2f, logits %.2f), measured %.2f MiB, ratio %.3f", cfg.ModelType, c.name, (act+logits)/(1<<20), act/(1<<20), logits/(1<<20), got/(1<<20), ratio)
		if ratio < 0.9 || ratio > 1.1 {
			t.Errorf("%s %s: prediction %.2f MiB is not within 10%% of the measured %.2f MiB", cfg.ModelType, c.name, (act+logits)/(1<<20), got/(1<<20))
		}
	}
}

// meteredBatch is one sequence of n tokens, the last learned of them.
func meteredBatch(cfg qwen.Config, n, learned int) Batch {
	ids, loss := make([]int, n), make([]bool, n)
	for i := range ids {
		ids[i] = (i * 7) % cfg.VocabSize
		loss[i] = i >= n-learned
	}
	return Pack([]Sequence{{IDs: ids, Loss: loss}})
}

// TestStepBytesMeasured: what --dry-run predicts a training step holds on a
// device (StateBytes: weights by how the base is held, gradients and AdamW
// moments; ActivationBytes) is within 10% of the most a replica holds at
// once over two steps on the metered CPU backend: full fine-tuning in f32,
// and LoRA over an f32, a bf16 and a Q8_0 base, recomputed.
func TestStepBytesMeasured(t *testing.T) {
	cfg := qwen.Config{ModelType: "qwen2", HiddenSize: 128, Layers: 2, Heads: 4, KVHeads: 2, HeadDim: 32,
		Intermediate: 352, RMSNormEps: 1e-6, RopeTheta: 1e4, VocabSize: 1024, MaxPositions: 1024}
	const n, learned = 256, 64
	b := meteredBatch(cfg, n, learned)
	targets := qwen.LoRATargets
	for _, c := range []struct {
		name string
		lora bool
		base Base
	}{{"full f32", false, BaseF32}, {"lora, f32 base", true, BaseF32}, {"lora, bf16 base", true, BaseBF16}, {"lora, Q8_0 base", true, BaseQ8}} {
		w := weightsFor[float32](t, cfg, 5)
		l := lora.Options{Enabled: c.lora, R: 8, Alpha: 16, TargetModules: targets}
		if c.lora {
			a, err := lora.New(lora.Config{R: l.R, Alpha: l.Alpha, TargetModules: targets}, w.linearModules(), w.linearShape, 5, true)
			if err != nil {
				t.Fatal(err)
			}
			if err := w.AttachLoRA(a); err != nil {
				t.Fatal(err)
			}
		}
		o := TrainOptions{Recompute: c.lora}
		m := &meter{Backend: cpu.New(), collecting: true}
		d := NewReplica(m, w, c.base)
		coef := m.FromHost(make([]float32, learned), learned)
		for step := 1; step <= 2; step++ {
			d.Backward(d.Forward(b, o), coef)
			d.Step(optim.DefaultConfig().AdamW(), step, 1e-3, 1, nil)
		}
		m.add(func() bool { return false }, 1<<20)
		st := StateBytes(cfg, l, c.base, 1, 0)
		weights, opt := st.Weights, st.Optimizer
		act, logits := ActivationBytes(cfg, n, learned, o, true, c.base != BaseF32)
		want := weights + opt + act + logits
		ratio := want / float64(m.peak)
		t.Logf("%s: predicted %.2f MiB (weights %.2f, optimiser %.2f, activations %.2f, logits %.2f), measured %.2f MiB, ratio %.3f",
			c.name, want/(1<<20), weights/(1<<20), opt/(1<<20), act/(1<<20), logits/(1<<20), float64(m.peak)/(1<<20), ratio)
		if ratio < 0.9 || ratio > 1.1 {
			t.Errorf("%s: predicted %.2f MiB is not within 10%% of the measured %.2f MiB", c.name, want/(1<<20), float64(m.peak)/(1<<20))
		}
	}
}

// TestZeRO2BytesMeasured: under model.zero_stage 2 with train_dtype bf16
// (full fine-tuning over two devices: bf16 working copies, half the f32
// masters, moments and gradients on each, a layer's gradients of the other
// device's parameters while the backward makes them), what --dry-run
// predicts a device holds (StateBytes, ActivationBytes) is within 10% of
// the most each metered device holds at once over two steps.
func TestZeRO2BytesMeasured(t *testing.T) {
	cfg := qwen.Config{ModelType: "qwen2", HiddenSize: 128, Layers: 4, Heads: 4, KVHeads: 2, HeadDim: 32,
		Intermediate: 352, RMSNormEps: 1e-6, RopeTheta: 1e4, VocabSize: 512, MaxPositions: 1024}
	const n, learned = 256, 64
	b := meteredBatch(cfg, n, learned)
	m := &Policy{W: weightsFor[float32](t, cfg, 5)}
	tr := NewOptimizer(m, optim.DefaultConfig(), 1e-3, optim.Schedule{}, 1, "")
	meters := []*meter{{Backend: cpu.New()}, {Backend: cpu.New()}}
	par, err := NewParallel(tr, []kernels.TrainBackend{meters[0], meters[1]}, nil, LearnerOptions{ZeroStage: 2, BF16: true}, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, mt := range meters { // what the replicas were given counts from here
		mt.collecting = true
		mt.add(func() bool { return false }, 1<<20)
	}
	o := TrainOptions{Recompute: true}
	for range 2 {
		err := par.Run(2, func(r *Replica, i int) error {
			r.Backward(r.Forward(b, o), r.Backend().FromHost(make([]float32, learned), learned))
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		if _, _, err := par.Update(); err != nil {
			t.Fatal(err)
		}
	}
	st := StateBytes(cfg, lora.Options{}, BaseBF16, 2, 2)
	act, logits := ActivationBytes(cfg, n, learned, o, true, true)
	want := st.Weights + st.Optimizer + act + logits
	for i, mt := range meters {
		mt.add(func() bool { return false }, 1<<20)
		ratio := want / float64(mt.peak)
		t.Logf("device %d: predicted %.2f MiB (weights %.2f, optimiser %.2f, activations %.2f, logits %.2f), measured %.2f MiB, ratio %.3f",
			i, want/(1<<20), st.Weights/(1<<20), st.Optimizer/(1<<20), act/(1<<20), logits/(1<<20), float64(mt.peak)/(1<<20), ratio)
		if ratio < 0.9 || ratio > 1.1 {
			t.Errorf("device %d: predicted %.2f MiB is not within 10%% of the measured %.2f MiB", i, want/(1<<20), float64(mt.peak)/(1<<20))
		}
	}
}
