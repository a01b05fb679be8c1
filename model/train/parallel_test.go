package train

import (
	"errors"
	"fmt"
	"math"
	"path/filepath"
	"strings"
	"testing"

	"github.com/agemem/agemem/kernels"
	"github.com/agemem/agemem/kernels/cpu"
	"github.com/agemem/agemem/kernels/cuda"
	"github.com/agemem/agemem/kernels/half"
	"github.com/agemem/agemem/model/lora"
	"github.com/agemem/agemem/model/optim"
	"github.com/agemem/agemem/model/qwen"
)

// parallelRun trains three steps of four micro-batches (a mean-NLL loss
// over all of a step's learned tokens) on the given devices and returns
// the trained weights by name and the step losses.
func parallelRun(t *testing.T, dir string, devices int, lora bool) (map[string][]float32, []float64) {
	t.Helper()
	var bes []kernels.TrainBackend
	for range devices {
		bes = append(bes, cpu.New())
	}
	w, l, _ := parallelOn(t, dir, bes, nil, LearnerOptions{}, lora)
	return w, l
}

func parallelOn(t *testing.T, dir string, bes []kernels.TrainBackend, reduce kernels.Reducer, o LearnerOptions, withLoRA bool) (map[string][]float32, []float64, *Parallel) {
	t.Helper()
	p, err := Open(dir, lora.Options{Enabled: withLoRA, R: 4, Alpha: 8, Dropout: 0.1, TargetModules: []string{"q_proj", "v_proj", "down_proj"}}, 1)
	if err != nil {
		t.Fatal(err)
	}
	tr := NewOptimizer(p, optim.Config{Beta1: 0.9, Beta2: 0.999, Eps: 1e-8, WeightDecay: 0.01, ClipNorm: 1}, 1e-2, optim.Schedule{}, 1, "")
	par, err := NewParallel(tr, bes, reduce, o, nil)
	if err != nil {
		t.Fatal(err)
	}
	var losses []float64
	for s := range 3 {
		micro := []Batch{batch(4 * s), batch(4*s + 1), batch(4*s + 2), batch(4*s + 3)}
		learned := 0
		for _, b := range micro {
			learned += len(b.LossRows)
		}
		parts := make([]float64, len(micro))
		err := par.Run(len(micro), func(r *Replica, i int) error {
			be := r.Backend()
			acts := r.Forward(micro[i], TrainOptions{Dropout: true, Seed: uint64(100*s + i)})
			d := make([]float32, len(micro[i].LossRows))
			for j := range d {
				d[j] = -1 / float32(learned)
			}
			r.Backward(acts, be.FromHost(d, len(d)))
			for _, v := range be.ToHost(acts.LogProbs) {
				parts[i] -= float64(v) / float64(learned)
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		loss := 0.0
		for _, v := range parts {
			loss += v
		}
		losses = append(losses, loss)
		if _, _, err := par.Update(); err != nil {
			t.Fatal(err)
		}
	}
	par.SyncHost()
	out := map[string][]float32{}
	for _, nv := range p.W.Trainable() {
		out[nv.Name] = append([]float32(nil), nv.V.Val...)
	}
	return out, losses, par
}

// TestDataParallelMatchesOneDevice: two and three simulated devices give
// the update of one device on the combined batch, step after step, with
// full fine-tuning and with LoRA (dropout masks follow the micro-batch, not
// the device), and the loss falls.
func TestDataParallelMatchesOneDevice(t *testing.T) {
	dir := tinyDir(t)
	for _, withLoRA := range []bool{false, true} {
		one, l1 := parallelRun(t, dir, 1, withLoRA)
		for _, n := range []int{2, 3} {
			many, ln := parallelRun(t, dir, n, withLoRA)
			sameUpdate(t, fmt.Sprintf("lora %v, %d devices", withLoRA, n), one, many, l1, ln, 2e-4, 1e-5)
		}
		if !(l1[2] < l1[0]) {
			t.Fatalf("lora %v: loss did not fall over three steps: %v", withLoRA, l1)
		}
	}
}

// sameUpdate fails unless two runs' weights and step losses agree as runs
// that sum in different orders do. Adam turns a rounding difference in a
// gradient near zero (a rare token's lm_head row) into a sizeable share of
// a step (lr 1e-2), so a few weights may differ by up to half a step; a
// lost or doubled micro-batch moves most of them and changes the losses.
// tol is how far a weight may differ (more than a thousandth of a tensor
// beyond it fails), lossTol how far a step's loss.
func sameUpdate(t *testing.T, name string, want, got map[string][]float32, wl, gl []float64, tol, lossTol float64) {
	t.Helper()
	for n, w := range want {
		worst, off := 0.0, 0
		for i := range w {
			d := math.Abs(float64(w[i] - got[n][i]))
			worst = math.Max(worst, d)
			if d > tol {
				off++
			}
		}
		if worst > 5e-3 || off > len(w)/1000 {
			t.Fatalf("%s: %s differs by up to %.3g, %d of %d weights by more than %g", name, n, worst, off, len(w), tol)
		}
		if off > 0 {
			t.Logf("%s: %s: %d of %d weights differ by more than %g (at most %.3g)", name, n, off, len(w), tol, worst)
		}
	}
	for s := range wl {
		if math.Abs(gl[s]-wl[s]) > lossTol {
			t.Fatalf("%s: step %d loss %.6f, want %.6f", name, s, gl[s], wl[s])
		}
	}
}

// TestDataParallelGPU (GPU machines): two replicas on the GPU, all-reduced
// through host memory or under ZeRO-2, and one GPU replica reduced by
// NCCL, each give the CPU's update; ZeRO-2 with bf16 working copies its
// losses.
func TestDataParallelGPU(t *testing.T) {
	g0, err := cuda.New(0)
	if errors.Is(err, cuda.ErrNoDevice) {
		t.Skipf("GPU test skipped: %v", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	g1, err := cuda.New(0)
	if err != nil {
		t.Fatal(err)
	}
	dir := tinyDir(t)
	want, wl := parallelRun(t, dir, 1, false)
	check := func(name string, got map[string][]float32, gl []float64) {
		// cuBLAS sums in another order than the CPU.
		sameUpdate(t, name, want, got, wl, gl, 5e-4, 1e-4*math.Abs(wl[0]))
	}
	got, gl, _ := parallelOn(t, dir, []kernels.TrainBackend{g0, g1}, nil, LearnerOptions{}, false)
	check("2 GPU replicas, host all-reduce", got, gl)
	got, gl, _ = parallelOn(t, dir, []kernels.TrainBackend{g0, g1}, nil, LearnerOptions{ZeroStage: 2}, false)
	check("2 GPU replicas, ZeRO-2", got, gl)
	// bf16 working copies on tensor cores (NarrowBF16Into on the device):
	// the f32 run's losses as bf16 rounding allows.
	g0.BF16, g1.BF16 = true, true
	_, gl, _ = parallelOn(t, dir, []kernels.TrainBackend{g0, g1}, nil, LearnerOptions{ZeroStage: 2, BF16: true}, false)
	g0.BF16, g1.BF16 = false, false
	for s := range wl {
		if d := math.Abs(gl[s] - wl[s]); d > 5e-3*math.Abs(wl[s]) {
			t.Fatalf("ZeRO-2 bf16 on the GPU: step %d loss %.6f, %.6f in f32 on the CPU", s, gl[s], wl[s])
		}
	}
	// LoRA with dropout over a bf16 base on tensor cores (the dropped-out
	// input made bf16 by dropout_bf16, its backward by dropout_add): the
	// CPU's losses over the same base as bf16 rounding allows.
	_, ll, _ := parallelOn(t, dir, []kernels.TrainBackend{cpu.New()}, nil, LearnerOptions{BF16: true}, true)
	g0.BF16 = true
	_, gl, _ = parallelOn(t, dir, []kernels.TrainBackend{g0}, nil, LearnerOptions{BF16: true}, true)
	g0.BF16 = false
	for s := range ll {
		if d := math.Abs(gl[s] - ll[s]); d > 5e-3*math.Abs(ll[s]) {
			t.Fatalf("LoRA bf16 on the GPU: step %d loss %.6f, %.6f on the CPU", s, gl[s], ll[s])
		}
	}
	n, err := cuda.NewNCCL([]kernels.TrainBackend{g0})
	if err != nil {
		t.Skipf("NCCL not loaded: %v", err)
	}
	got, gl, _ = parallelOn(t, dir, []kernels.TrainBackend{g0}, n, LearnerOptions{}, false)
	check("1 GPU, NCCL", got, gl)
}

// TestShardedOptimizer: with model.zero_stage 1 each of three simulated
// devices holds about a third of the AdamW moments and updates only its
// parameters, and training ends with exactly the weights and moments of
// the unsharded run (the same update, computed once instead of thrice).
func TestShardedOptimizer(t *testing.T) {
	dir := tinyDir(t)
	bes := func() []kernels.TrainBackend { return []kernels.TrainBackend{cpu.New(), cpu.New(), cpu.New()} }
	want, wl, full := parallelOn(t, dir, bes(), nil, LearnerOptions{}, false)
	got, gl, sharded := parallelOn(t, dir, bes(), nil, LearnerOptions{ZeroStage: 1}, false)
	// Updated weights sent through host memory, and as NCCL would (an
	// all-reduce only the owner adds to): both to the bit.
	dev, _, _ := parallelOn(t, dir, bes(), deviceReducer{}, LearnerOptions{ZeroStage: 1}, false)
	for name, w := range want {
		for i := range w {
			if w[i] != got[name][i] || w[i] != dev[name][i] {
				t.Fatalf("%s[%d]: %g sharded, %g sent device to device, %g unsharded", name, i, got[name][i], dev[name][i], w[i])
			}
		}
	}
	if fmt.Sprint(wl) != fmt.Sprint(gl) {
		t.Fatalf("losses %v sharded, %v unsharded", gl, wl)
	}
	moments := func(r *Replica) (n int) {
		for _, p := range r.Params {
			if p.M != nil {
				n += 2 * p.M.Len()
			}
		}
		return n
	}
	total := moments(full.Replicas[0])
	sum := 0
	for i, r := range sharded.Replicas {
		n := moments(r)
		sum += n
		if n > total/2 {
			t.Fatalf("device %d holds %d of %d moment floats: not sharded", i, n, total)
		}
		t.Logf("device %d: %d of %d moment floats (%.0f%%)", i, n, total, 100*float64(n)/float64(total))
	}
	if sum != total {
		t.Fatalf("the shards hold %d moment floats, the whole %d", sum, total)
	}
	// A checkpoint gathers every shard: the same moments as unsharded.
	if err := full.Save(filepath.Join(t.TempDir(), "a")); err != nil {
		t.Fatal(err)
	}
	if err := sharded.Save(filepath.Join(t.TempDir(), "b")); err != nil {
		t.Fatal(err)
	}
	for name, m := range full.T.Opt.M {
		if fmt.Sprint(m) != fmt.Sprint(sharded.T.Opt.M[name]) || fmt.Sprint(full.T.Opt.V[name]) != fmt.Sprint(sharded.T.Opt.V[name]) {
			t.Fatalf("%s: saved moments differ", name)
		}
	}
}

// TestZeRO2: with model.zero_stage 2 over three simulated devices (four
// micro-batches a step, so the last round has two idle devices), each
// gradient is summed onto its owner as the backward makes it (through
// host memory, or all-reduced as NCCL would): training
// ends with the all-reduced run's weights and losses (summed in another
// order), full fine-tuning and LoRA, and between steps a device holds
// only its own parameters' gradients.
func TestZeRO2(t *testing.T) {
	dir := tinyDir(t)
	bes := func() []kernels.TrainBackend { return []kernels.TrainBackend{cpu.New(), cpu.New(), cpu.New()} }
	for _, withLoRA := range []bool{false, true} {
		want, wl, _ := parallelOn(t, dir, bes(), nil, LearnerOptions{}, withLoRA)
		got, gl, z := parallelOn(t, dir, bes(), nil, LearnerOptions{ZeroStage: 2}, withLoRA)
		sameUpdate(t, fmt.Sprintf("zero_stage 2, lora %v", withLoRA), want, got, wl, gl, 2e-4, 1e-5)
		// A device reducer (NCCL's path: each stage all-reduced, the
		// owners keeping the sum).
		ar, al, _ := parallelOn(t, dir, bes(), deviceReducer{}, LearnerOptions{ZeroStage: 2}, withLoRA)
		sameUpdate(t, fmt.Sprintf("zero_stage 2 all-reduced, lora %v", withLoRA), want, ar, wl, al, 2e-4, 1e-5)
		held, total := 0, 0
		for r, rep := range z.Replicas {
			for j, p := range rep.Params {
				if r == 0 {
					total += p.W.Len()
				}
				switch {
				case p.G != nil && z.owner[j] != r:
					t.Fatalf("device %d holds the gradient of %s, owned by device %d", r, p.Name, z.owner[j])
				case p.G == nil && z.owner[j] == r:
					t.Fatalf("device %d lost the gradient of its own %s", r, p.Name)
				case p.G != nil:
					held += p.G.Len()
				}
			}
		}
		if held != total {
			t.Fatalf("the devices hold %d gradient floats between steps, the model has %d", held, total)
		}
	}
}

// deviceReducer all-reduces through host memory but is not
// kernels.HostReduce, so ZeRO-2 takes the path it takes with NCCL.
type deviceReducer struct{ kernels.HostReduce }

// TestZeRO2BF16: under model.zero_stage 2 with train_dtype bf16 every
// device computes with bf16 working copies of the trainable matrices and
// only a parameter's owner keeps its float32 master: after each update
// every device's working copy is the owner's master rounded to bf16, the
// weights the host reads (checkpoints) are the float32 masters, not their
// rounding, and the run follows the float32 run as bf16 rounding allows;
// full fine-tuning, and LoRA (its adapters so, over a bf16 base).
func TestZeRO2BF16(t *testing.T) {
	dir := tinyDir(t)
	for _, withLoRA := range []bool{false, true} {
		for _, red := range []kernels.Reducer{nil, deviceReducer{}} {
			t.Run(fmt.Sprintf("lora %v, %T", withLoRA, red), func(t *testing.T) { zero2BF16(t, dir, withLoRA, red) })
		}
	}
}

func zero2BF16(t *testing.T, dir string, withLoRA bool, red kernels.Reducer) {
	bes := func() []kernels.TrainBackend { return []kernels.TrainBackend{cpu.New(), cpu.New(), cpu.New()} }
	// The reference holds a LoRA base in bf16 as well: only the working
	// copies differ.
	want, wl, _ := parallelOn(t, dir, bes(), nil, LearnerOptions{BF16: true}, withLoRA)
	got, gl, z := parallelOn(t, dir, bes(), red, LearnerOptions{ZeroStage: 2, BF16: true}, withLoRA)
	for s := range wl {
		if d := math.Abs(gl[s] - wl[s]); d > 2e-3*math.Abs(wl[s]) {
			t.Fatalf("step %d loss %.6f with bf16 working weights, %.6f in f32", s, gl[s], wl[s])
		}
	}
	if !(gl[2] < gl[0]) {
		t.Fatalf("loss did not fall: %v", gl)
	}
	unrounded, masters, far, all := 0, 0, 0, 0
	for j, p := range z.Replicas[0].Params {
		o := z.Replicas[z.owner[j]]
		host := got[p.Name]
		if fmt.Sprint(host) != fmt.Sprint(o.Backend().ToHost(o.Params[j].master())) {
			t.Fatalf("%s: the host copy is not the owner's master", p.Name)
		}
		if !isMatrix(p.W) {
			continue
		}
		masters++
		for r, rep := range z.Replicas {
			if (rep.Params[j].Master != nil) != (r == z.owner[j]) {
				t.Fatalf("%s: device %d holds a master: %v, owner %d", p.Name, r, rep.Params[j].Master != nil, z.owner[j])
			}
			// The working copy's rows, widened as a lookup reads them.
			be, rows := rep.Backend(), p.W.Shape()[0]
			ids := make([]int, rows)
			for i := range ids {
				ids[i] = i
			}
			wide := be.Zeros(p.W.Shape()...)
			be.Embedding(wide, rep.Params[j].W, ids)
			for i, v := range be.ToHost(wide) {
				if x := host[i]; v != half.BF16ToF32(half.F32ToBF16(x)) {
					t.Fatalf("%s on device %d [%d]: working %g, master %g", p.Name, r, i, v, x)
				}
			}
		}
		for i, x := range host {
			if x != half.BF16ToF32(half.F32ToBF16(x)) {
				unrounded++
			}
			if d := math.Abs(float64(x - want[p.Name][i])); d > 1e-3 {
				far++
			}
			all++
		}
	}
	// Adam turns a rounding difference in a near-zero gradient (a rare
	// token's row; an adapter B's first steps from zero) into a sizeable
	// share of a step: a few weights may differ (0.06% of a full model,
	// 1% of the adapters measured); stale working copies or masters
	// would move most of them.
	t.Logf("%d of %d matrix weights differ from the f32 run by more than 1e-3", far, all)
	if limit := map[bool]int{false: all / 500, true: all / 40}[withLoRA]; far > limit {
		t.Fatalf("%d of %d matrix weights differ from the f32 run by more than 1e-3", far, all)
	}
	if masters == 0 || unrounded == 0 {
		t.Fatalf("%d masters, %d values not representable in bf16: the masters were rounded", masters, unrounded)
	}
}

// TestZeRO2DeviceFails: a device whose micro-batch fails mid-step does not
// leave the others waiting at a stage's sum: Run returns its error.
func TestZeRO2DeviceFails(t *testing.T) {
	dir := tinyDir(t)
	p, err := Open(dir, lora.Options{}, 1)
	if err != nil {
		t.Fatal(err)
	}
	tr := NewOptimizer(p, optim.Config{Beta1: 0.9, Beta2: 0.999, Eps: 1e-8, ClipNorm: 1}, 1e-2, optim.Schedule{}, 1, "")
	par, err := NewParallel(tr, []kernels.TrainBackend{cpu.New(), cpu.New(), cpu.New()}, nil, LearnerOptions{ZeroStage: 2}, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, fail := range []func(i int) error{
		func(i int) error { return fmt.Errorf("micro-batch %d: bad loss", i) },
		func(i int) error { panic(fmt.Sprintf("micro-batch %d: kernel fault", i)) },
	} {
		err = par.Run(5, func(r *Replica, i int) error {
			if i == 4 {
				return fail(i)
			}
			b := batch(i)
			r.Backward(r.Forward(b, TrainOptions{}), r.Backend().FromHost(make([]float32, len(b.LossRows)), len(b.LossRows)))
			return nil
		})
		if err == nil || !strings.Contains(err.Error(), "micro-batch 4") {
			t.Fatalf("Run returned %v, want micro-batch 4's failure", err)
		}
	}
	// The run goes on after a failed step.
	if err := par.Run(3, func(r *Replica, i int) error {
		b := batch(i)
		r.Backward(r.Forward(b, TrainOptions{}), r.Backend().FromHost(make([]float32, len(b.LossRows)), len(b.LossRows)))
		return nil
	}); err != nil {
		t.Fatal(err)
	}
}

// TestOffloadedReference: under model.offload_reference a frozen reference
// scores the same log-probabilities, to the bit, as one held whole on each
// device (a bf16 and an f32 base), while a device holds its layers only
// during its forward: the most the metered device gains for scoring is
// the embedding, head and about one layer, not the whole model.
func TestOffloadedReference(t *testing.T) {
	cfg := qwen.Config{ModelType: "qwen2", HiddenSize: 128, Layers: 6, Heads: 4, KVHeads: 2, HeadDim: 32,
		Intermediate: 352, RMSNormEps: 1e-6, RopeTheta: 1e4, VocabSize: 512, MaxPositions: 1024}
	ref := weightsFor[float32](t, cfg, 6)
	for _, nv := range ref.Named {
		nv.V.Requires, nv.V.Grad = false, nil
	}
	batches := []Batch{batch(0), batch(1), batch(2)}
	score := func(bf16, offload bool) ([][]float32, int64) {
		m := &Policy{W: weightsFor[float32](t, cfg, 5)}
		tr := NewOptimizer(m, optim.DefaultConfig(), 1e-3, optim.Schedule{}, 1, "")
		mt := &meter{Backend: cpu.New()}
		par, err := NewParallel(tr, []kernels.TrainBackend{mt, cpu.New()}, nil, LearnerOptions{BF16: bf16, OffloadReference: offload}, nil)
		if err != nil {
			t.Fatal(err)
		}
		mt.collecting = true
		mt.add(func() bool { return false }, 1<<20) // collects, then goes itself
		base := mt.now - 1<<20
		mt.peak = 0
		lps, err := par.Score(ref, batches, TrainOptions{Recompute: true})
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range par.frozen[ref] {
			for li := range r.Layers {
				if w := r.Layers[li].Attn.Q.W.W; w != nil && offload {
					t.Fatalf("layer %d of the offloaded reference stayed on the device", li)
				}
			}
		}
		return lps, mt.peak - base
	}
	var layer, rest float64 // bf16 bytes of one layer, of the embedding
	for _, p := range qwen.Params(cfg) {
		n := 2.0
		for _, d := range p.Shape {
			n *= float64(d)
		}
		if p.Layer == 0 {
			layer += n
		} else if p.Layer < 0 {
			rest += n
		}
	}
	for _, bf16 := range []bool{true, false} {
		whole, wholeBytes := score(bf16, false)
		off, offBytes := score(bf16, true)
		if fmt.Sprint(whole) != fmt.Sprint(off) {
			t.Fatalf("bf16 %v: offloaded reference scores %v, held whole %v", bf16, off, whole)
		}
		l := layer
		if !bf16 {
			l *= 2
		}
		t.Logf("bf16 %v: scoring took %.2f MiB on the device held whole, %.2f offloaded (a layer %.2f MiB)", bf16, float64(wholeBytes)/(1<<20), float64(offBytes)/(1<<20), l/(1<<20))
		if saved := float64(wholeBytes - offBytes); saved < 0.9*float64(cfg.Layers-1)*l || saved > 1.1*float64(cfg.Layers)*l {
			t.Fatalf("offloading saved %.0f bytes, want about %d layers of %.0f", saved, cfg.Layers-1, l)
		}
	}
}
