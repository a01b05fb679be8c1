package train

import (
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/agemem/agemem/model/lora"
	"github.com/agemem/agemem/model/optim"
	"github.com/agemem/agemem/model/qwen"
	"github.com/agemem/agemem/model/safetensors"
	"github.com/agemem/agemem/model/tape"
)

func tinyDir(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	if err := qwen.InitRandom(dir, qwen.Presets["tiny-qwen3"], safetensors.BF16, 4); err != nil {
		t.Fatal(err)
	}
	return dir
}

// batch returns a fixed packed batch for step i.
func batch(i int) Batch {
	r := rand.New(rand.NewPCG(uint64(i), 9))
	var seqs []Sequence
	for range 3 {
		ids := []int{1, 2, 3, 4}
		for range 12 {
			ids = append(ids, r.IntN(512))
		}
		loss := make([]bool, len(ids))
		for j := 8; j < len(ids); j++ {
			loss[j] = true
		}
		seqs = append(seqs, Sequence{IDs: ids, Loss: loss})
	}
	return Pack(seqs)
}

// step trains one step on batch(t.Step) and returns the loss before it.
func step(t *testing.T, tr *Optimizer) float64 {
	b := batch(tr.Step)
	tp := tape.New[float32]()
	lp := tr.Model.W.LogProbs(tp, b, TrainOptions{Dropout: true, Seed: uint64(tr.Step)})
	d := make([]float32, len(lp.Val))
	loss := 0.0
	for i, v := range lp.Val {
		loss -= float64(v) / float64(len(lp.Val))
		d[i] = -1 / float32(len(lp.Val))
	}
	tp.Backward(lp, d)
	if _, _, err := tr.Update(); err != nil {
		t.Fatal(err)
	}
	return loss
}

func newTrainer(t *testing.T, dir string, withLoRA bool) *Optimizer {
	t.Helper()
	l := lora.DefaultOptions(qwen.LoRATargets)
	l.Enabled = withLoRA
	p, err := Open(dir, l, 3)
	if err != nil {
		t.Fatal(err)
	}
	return NewOptimizer(p, optim.DefaultConfig(), 1e-2, optim.Schedule{Warmup: 2, Total: 8, Cosine: true, MinRatio: 0.1}, 1, "seed: 1\n")
}

// TestResumeIsDeterministic: three steps, a checkpoint, a fresh process
// (new trainer from the same base) resuming it and taking three more steps
// gives bit-identical losses and weights to six uninterrupted steps, for
// full fine-tuning and LoRA (with dropout on).
func TestResumeIsDeterministic(t *testing.T) {
	for _, withLoRA := range []bool{false, true} {
		base := tinyDir(t)
		straight := newTrainer(t, base, withLoRA)
		var want []float64
		for range 6 {
			want = append(want, step(t, straight))
		}
		first := newTrainer(t, base, withLoRA)
		for range 3 {
			step(t, first)
		}
		ck := filepath.Join(t.TempDir(), "checkpoint-3")
		if err := first.Save(ck); err != nil {
			t.Fatal(err)
		}
		resumed := newTrainer(t, base, withLoRA)
		if err := resumed.Resume(ck); err != nil {
			t.Fatal(err)
		}
		for i := 3; i < 6; i++ {
			if got := step(t, resumed); got != want[i] {
				t.Fatalf("lora=%v step %d: loss %v after resuming, %v without stopping", withLoRA, i+1, got, want[i])
			}
		}
		for i, p := range straight.Params() {
			if !slices.Equal(p.W, resumed.Params()[i].W) {
				t.Fatalf("lora=%v: parameter %s differs after resuming", withLoRA, p.Name)
			}
		}
		if want[5] >= want[0] {
			t.Fatalf("lora=%v: loss did not fall over six steps on repeating data: %v", withLoRA, want)
		}
	}
}

func TestResumeRejectsDamageAndMismatch(t *testing.T) {
	base := tinyDir(t)
	tr := newTrainer(t, base, false)
	step(t, tr)
	ck := filepath.Join(t.TempDir(), "ck")
	if err := tr.Save(ck); err != nil {
		t.Fatal(err)
	}
	// A LoRA run cannot resume a full fine-tuning checkpoint.
	if err := newTrainer(t, base, true).Resume(ck); err == nil || !strings.Contains(err.Error(), "lora_A") {
		t.Fatalf("LoRA resuming a full checkpoint: %v", err)
	}
	// Flip one byte of the parameters: the checksum names the file, and the
	// trainer's weights are left as they were.
	path := filepath.Join(ck, "params.safetensors")
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	raw[len(raw)-3] ^= 0x40
	if err := os.WriteFile(path, raw, 0o644); err != nil {
		t.Fatal(err)
	}
	fresh := newTrainer(t, base, false)
	before := slices.Clone(fresh.Params()[0].W)
	err = fresh.Resume(ck)
	if err == nil || !strings.Contains(err.Error(), "params.safetensors") {
		t.Fatalf("damaged checkpoint: %v", err)
	}
	if !slices.Equal(before, fresh.Params()[0].W) || fresh.Step != 0 {
		t.Fatal("a failed resume changed the trainer")
	}
}

// TestExportLoadsBack: a full export is a model directory the engine
// loads; a LoRA export is a PEFT adapter that reproduces the trained
// log-probabilities on top of the base.
func TestExportLoadsBack(t *testing.T) {
	base := tinyDir(t)
	for _, withLoRA := range []bool{false, true} {
		tr := newTrainer(t, base, withLoRA)
		for range 3 {
			step(t, tr)
		}
		out := t.TempDir()
		if err := tr.Model.Export(out, safetensors.F32); err != nil {
			t.Fatal(err)
		}
		b := batch(0)
		want := tr.Model.W.LogProbs(tape.New[float32](), b, TrainOptions{}).Val
		var again *Policy
		var err error
		if withLoRA {
			again, err = Open(base, lora.Options{}, 0)
			if err == nil {
				var a *lora.Adapter
				if a, err = lora.Load(out); err == nil {
					err = again.W.AttachLoRA(a)
				}
			}
		} else {
			again, err = Open(out, lora.Options{}, 0)
		}
		if err != nil {
			t.Fatal(err)
		}
		got := again.W.LogProbs(tape.New[float32](), b, TrainOptions{}).Val
		for i := range want {
			if math.Abs(float64(got[i]-want[i])) > 1e-5 {
				t.Fatalf("lora=%v: log-prob %d is %g after export, %g before", withLoRA, i, got[i], want[i])
			}
		}
	}
}

// TestOpenAnAdapterDirectory: a LoRA SFT output opens as its base with the
// adapter merged, scoring as the adapter did; a new LoRA on top of it is
// refused with advice.
func TestOpenAnAdapterDirectory(t *testing.T) {
	base := tinyDir(t)
	tr := newTrainer(t, base, true)
	for range 3 {
		step(t, tr)
	}
	out := t.TempDir()
	if err := tr.Model.Export(out, safetensors.F32); err != nil {
		t.Fatal(err)
	}
	want := tr.Model.W.LogProbs(tape.New[float32](), batch(0), TrainOptions{}).Val
	p, err := Open(out, lora.Options{}, 0)
	if err != nil {
		t.Fatal(err)
	}
	got := p.W.LogProbs(tape.New[float32](), batch(0), TrainOptions{}).Val
	for i := range want {
		if math.Abs(float64(got[i]-want[i])) > 1e-5 {
			t.Fatalf("log-prob %d: %g merged, %g with the adapter", i, got[i], want[i])
		}
	}
	l := lora.DefaultOptions(qwen.LoRATargets)
	l.Enabled = true
	if _, err := Open(out, l, 0); err == nil || !strings.Contains(err.Error(), "merge it first") {
		t.Fatalf("LoRA on an adapter: %v", err)
	}
}
