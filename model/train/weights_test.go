package train

import (
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/agemem/agemem/kernels/cpu"
	"github.com/agemem/agemem/model/lora"
	"github.com/agemem/agemem/model/qwen"
	"github.com/agemem/agemem/model/safetensors"
	"github.com/agemem/agemem/model/tape"
)

// micro is a Qwen shape small enough to finite-difference every parameter.
func micro(modelType string, tied bool) qwen.Config {
	return qwen.Config{ModelType: modelType, HiddenSize: 8, Layers: 2, Heads: 2, KVHeads: 1, HeadDim: 4,
		Intermediate: 12, RMSNormEps: 1e-6, RopeTheta: 1e4, TieEmbeddings: tied, VocabSize: 11, MaxPositions: 64}
}

func weightsFor[T tape.Float](t *testing.T, cfg qwen.Config, seed uint64) *Weights[T] {
	t.Helper()
	dir := t.TempDir()
	if err := qwen.InitRandom(dir, cfg, safetensors.F32, seed); err != nil {
		t.Fatal(err)
	}
	st, err := safetensors.OpenDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	w, err := NewWeights[T](cfg, st)
	if err != nil {
		t.Fatal(err)
	}
	return w
}

// fdSeqs share a prefix of three tokens, and learn different spans.
var fdSeqs = []Sequence{
	{IDs: []int{1, 2, 3, 4, 5, 6}, Loss: []bool{false, false, false, false, true, true}},
	{IDs: []int{1, 2, 3, 4, 9, 10, 7}, Loss: []bool{false, false, false, false, true, false, true}},
	{IDs: []int{1, 2, 3, 8, 0}, Loss: []bool{false, false, false, true, true}},
}

// TestWholeModelFiniteDifferences checks d(Σ r·logp)/dθ for every parameter
// of tiny Qwen3 (per-head q/k norms, untied head) and Qwen2 (biases, tied
// head), full fine-tuning and then LoRA on all seven projections.
func TestWholeModelFiniteDifferences(t *testing.T) {
	for _, c := range []struct {
		name  string
		cfg   qwen.Config
		lora  bool
		chunk int // TrainOptions.LogitChunk
	}{
		{"qwen3 full", micro("qwen3", false), false, 0},
		{"qwen2 tied full", micro("qwen2", true), false, 0},
		{"qwen3 lora", micro("qwen3", false), true, 0},
		// The LM head and log-softmax two learned tokens at a time, the
		// logits recomputed in the backward (LinearLogProbs).
		{"qwen2 tied full, logits in chunks of 2", micro("qwen2", true), false, 2},
		{"qwen3 full, logits in chunks of 3", micro("qwen3", false), false, 3},
	} {
		t.Run(c.name, func(t *testing.T) {
			w := weightsFor[float64](t, c.cfg, 3)
			if c.lora {
				a, err := lora.New(lora.Config{R: 2, Alpha: 4, TargetModules: []string{"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"}},
					w.linearModules(), w.linearShape, 5, true)
				if err != nil {
					t.Fatal(err)
				}
				if err := w.AttachLoRA(a); err != nil {
					t.Fatal(err)
				}
			}
			b := Pack(fdSeqs)
			if b.Segs[0].Hi != 2 {
				t.Fatalf("shared prefix of %d rows, want 2 (the rows before the first token that differs)", b.Segs[0].Hi)
			}
			r := rand.New(rand.NewPCG(7, 7))
			coef := make([]float64, len(b.LossRows))
			for i := range coef {
				coef[i] = r.NormFloat64()
			}
			loss := func() float64 {
				y := w.LogProbs(tape.New[float64](), b, TrainOptions{LogitChunk: c.chunk})
				s := 0.0
				for i, v := range y.Val {
					s += coef[i] * v
				}
				return s
			}
			tp := tape.New[float64]()
			tp.Backward(w.LogProbs(tp, b, TrainOptions{Recompute: true, LogitChunk: c.chunk}), coef)
			checked := 0
			for _, nv := range w.Trainable() {
				p := nv.V
				worst := 0.0
				for i := range p.Val {
					orig := p.Val[i]
					p.Val[i] = orig + 1e-6
					up := loss()
					p.Val[i] = orig - 1e-6
					down := loss()
					p.Val[i] = orig
					num := (up - down) / 2e-6
					worst = math.Max(worst, math.Abs(num-p.Grad[i])/math.Max(1, math.Abs(num)))
					checked++
				}
				if worst > 1e-6 {
					t.Errorf("%s: finite differences disagree, max relative error %.2e", nv.Name, worst)
				}
			}
			if c.lora && len(w.Trainable()) != 2*7*c.cfg.Layers {
				t.Fatalf("%d trainable tensors with LoRA, want %d", len(w.Trainable()), 2*7*c.cfg.Layers)
			}
			t.Logf("%d parameters checked", checked)
		})
	}
}

func (w *Weights[T]) linearModules() []string { m, _ := w.Config.Linears(); return m }

func (w *Weights[T]) linearShape(module string) (int, int, bool) {
	_, shape := w.Config.Linears()
	return shape(module)
}

// TestTrainingForwardMatchesEngine: the tape's log-probabilities equal the
// log-softmax of the inference engine's logits (itself checked against
// Hugging Face transformers), with and without an adapter, and at a
// sampling temperature the log-softmax of the logits divided by it.
func TestTrainingForwardMatchesEngine(t *testing.T) {
	for _, preset := range []string{"tiny-qwen2", "tiny-qwen3"} {
		cfg := qwen.Presets[preset]
		w := weightsFor[float32](t, cfg, 11)
		a, err := lora.New(lora.Config{R: 4, Alpha: 8, TargetModules: []string{"q_proj", "v_proj", "down_proj"}}, w.linearModules(), w.linearShape, 2, true)
		if err != nil {
			t.Fatal(err)
		}
		for _, withLoRA := range []bool{false, true} {
			if withLoRA {
				if err := w.AttachLoRA(a); err != nil {
					t.Fatal(err)
				}
			}
			m, err := w.Engine(cpu.New())
			if err != nil {
				t.Fatal(err)
			}
			r := rand.New(rand.NewPCG(1, 1))
			var seqs []Sequence
			for range 3 {
				ids := []int{5, 6, 7, 8, 9}
				for range 20 + r.IntN(10) {
					ids = append(ids, r.IntN(cfg.VocabSize))
				}
				loss := make([]bool, len(ids))
				for i := 6; i < len(ids); i++ {
					loss[i] = true
				}
				seqs = append(seqs, Sequence{IDs: ids, Loss: loss})
			}
			b := Pack(seqs)
			got := w.LogProbs(tape.New[float32](), b, TrainOptions{}).Val
			const temp = 0.7
			gotT := w.LogProbs(tape.New[float32](), b, TrainOptions{Temperature: temp}).Val
			k := 0
			for s, seq := range seqs {
				logits, err := m.Forward(seq.IDs, m.NewCache(len(seq.IDs)))
				if err != nil {
					t.Fatal(err)
				}
				for i := 0; i+1 < len(seq.IDs); i++ {
					if !seq.Loss[i+1] {
						continue
					}
					if b.Seq[k] != s {
						t.Fatalf("loss row %d belongs to sequence %d, want %d", k, b.Seq[k], s)
					}
					row := logits[i*cfg.VocabSize : (i+1)*cfg.VocabSize]
					want := cpu.LogProbGather(row, []int{seq.IDs[i+1]}, cfg.VocabSize)[0]
					if d := math.Abs(float64(got[k] - want)); d > 2e-4 {
						t.Fatalf("%s lora=%v seq %d token %d: tape %g, engine %g", preset, withLoRA, s, i+1, got[k], want)
					}
					scaled := make([]float32, len(row))
					for j, v := range row {
						scaled[j] = v / temp
					}
					wantT := cpu.LogProbGather(scaled, []int{seq.IDs[i+1]}, cfg.VocabSize)[0]
					if d := math.Abs(float64(gotT[k] - wantT)); d > 2e-4 || wantT == want {
						t.Fatalf("%s lora=%v seq %d token %d at temperature %g: tape %g, engine %g (at 1: %g)", preset, withLoRA, s, i+1, temp, gotT[k], wantT, want)
					}
					k++
				}
			}
			if k != len(got) {
				t.Fatalf("%d log-probs, %d learned tokens", len(got), k)
			}
		}
	}
}

// TestNoAdapterIsTheBase: with an adapter attached, NoAdapter gives the
// base's log-probabilities exactly (GRPO's reference under LoRA).
func TestNoAdapterIsTheBase(t *testing.T) {
	w := weightsFor[float32](t, qwen.Presets["tiny-qwen3"], 8)
	b := Pack(fdSeqs)
	base := w.LogProbs(tape.New[float32](), b, TrainOptions{}).Val
	a, err := lora.New(lora.Config{R: 2, Alpha: 4, TargetModules: []string{"q_proj", "up_proj"}}, w.linearModules(), w.linearShape, 1, true)
	if err != nil {
		t.Fatal(err)
	}
	if err := w.AttachLoRA(a); err != nil {
		t.Fatal(err)
	}
	with := w.LogProbs(tape.New[float32](), b, TrainOptions{}).Val
	without := w.LogProbs(tape.New[float32](), b, TrainOptions{NoAdapter: true}).Val
	moved := false
	for i := range base {
		if without[i] != base[i] {
			t.Fatalf("token %d: %g without the adapter, %g for the base", i, without[i], base[i])
		}
		moved = moved || with[i] != base[i]
	}
	if !moved {
		t.Fatal("the adapter changed nothing; the test cannot tell")
	}
}

// TestNewWeightsInPieces: the parallel conversion gives every tensor's
// values (an embedding of 4.5M values, converted in two pieces, included),
// in float32 and float64; frozen weights (the base an adapter is attached
// to) get no gradient buffers, trainable ones do.
func TestNewWeightsInPieces(t *testing.T) {
	cfg := micro("qwen2", false)
	cfg.VocabSize, cfg.HiddenSize, cfg.HeadDim = 70001, 64, 32
	src := qwen.RandomBF16(cfg, 5)
	for _, trainable := range []bool{true, false} {
		w32, err := newWeights[float32](cfg, src, trainable)
		if err != nil {
			t.Fatal(err)
		}
		w64, err := newWeights[float64](cfg, src, trainable)
		if err != nil {
			t.Fatal(err)
		}
		for i, nv := range w32.Named {
			want := src[nv.Name].Float32()
			if !slices.Equal(nv.V.Val, want) {
				t.Fatalf("%s: float32 values differ from the tensor's", nv.Name)
			}
			for k, v := range w64.Named[i].V.Val {
				if v != float64(want[k]) {
					t.Fatalf("%s: float64 value %d is %g, want %g", nv.Name, k, v, want[k])
				}
			}
			if (nv.V.Grad != nil) != trainable || nv.V.Requires != trainable {
				t.Fatalf("%s: trainable %v but gradient buffer %v, requires %v", nv.Name, trainable, nv.V.Grad != nil, nv.V.Requires)
			}
		}
	}
}
