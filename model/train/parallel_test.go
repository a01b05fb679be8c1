package train

import (
	"errors"
	"fmt"
	"math"
	"path/filepath"
	"testing"

	"github.com/agemem/agemem/kernels"
	"github.com/agemem/agemem/kernels/cpu"
	"github.com/agemem/agemem/kernels/cuda"
	"github.com/agemem/agemem/model/lora"
	"github.com/agemem/agemem/model/optim"
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
// through host memory, and one GPU replica reduced by NCCL, each give the
// CPU's update.
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
	n, err := cuda.NewNCCL([]kernels.TrainBackend{g0})
	if err != nil {
		t.Skipf("NCCL not loaded: %v", err)
	}
	got, gl, _ = parallelOn(t, dir, []kernels.TrainBackend{g0}, n, LearnerOptions{}, false)
	check("1 GPU, NCCL", got, gl)
}

// TestShardedOptimizer: with model.shard_optimizer each of three simulated
// devices holds about a third of the AdamW moments and updates only its
// parameters, and training ends with exactly the weights and moments of
// the unsharded run (the same update, computed once instead of thrice).
func TestShardedOptimizer(t *testing.T) {
	dir := tinyDir(t)
	bes := func() []kernels.TrainBackend { return []kernels.TrainBackend{cpu.New(), cpu.New(), cpu.New()} }
	want, wl, full := parallelOn(t, dir, bes(), nil, LearnerOptions{}, false)
	got, gl, sharded := parallelOn(t, dir, bes(), nil, LearnerOptions{ShardOptimizer: true}, false)
	for name, w := range want {
		for i := range w {
			if w[i] != got[name][i] {
				t.Fatalf("%s[%d]: %g sharded, %g unsharded", name, i, got[name][i], w[i])
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
