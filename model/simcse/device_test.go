package simcse

import (
	"context"
	"io"
	"math"
	"math/rand/v2"
	"path/filepath"
	"testing"

	"github.com/agemem/agemem/kernels"
	"github.com/agemem/agemem/kernels/cpu"
	"github.com/agemem/agemem/kernels/device"
	"github.com/agemem/agemem/model/bert"
	"github.com/agemem/agemem/model/optim"
	"github.com/agemem/agemem/model/tape"
)

// InfoNCE (the device path's loss, on the host) is the tape's: the same
// loss and gradient for unsupervised (2b vectors) and supervised (3b)
// batches.
func TestInfoNCEMatchesTheTape(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for _, c := range []struct{ n, b int }{{8, 4}, {9, 3}} {
		const h, tau = 5, 0.05
		p := make([]float64, c.n*h)
		p32 := make([]float32, len(p))
		for i := range p {
			p[i] = r.NormFloat64()
			p32[i] = float32(p[i])
		}
		tp := tape.New[float64]()
		pv := tape.Param(p, c.n, h, true)
		z := tp.L2Normalize(pv)
		anchors, cands, targets := make([]int, c.b), make([]int, c.n-c.b), make([]int, c.b)
		for i := range anchors {
			anchors[i], targets[i] = i, i
		}
		for i := range cands {
			cands[i] = c.b + i
		}
		lp := tp.LogProbs(tp.Scale(tp.Linear(tp.Gather(z, anchors), tp.Gather(z, cands), nil), 1/tau), targets)
		var want float64
		dy := make([]float64, c.b)
		for i, v := range lp.Val {
			want -= v / float64(c.b)
			dy[i] = -1 / float64(c.b)
		}
		tp.Backward(lp, dy)
		loss, grad := InfoNCE(p32, c.n, c.b, tau)
		if math.Abs(loss-want) > 1e-5 {
			t.Fatalf("n %d b %d: loss %.8g, tape %.8g", c.n, c.b, loss, want)
		}
		for i, g := range grad {
			if math.Abs(float64(g)-pv.Grad[i]) > 1e-4*math.Max(1, math.Abs(pv.Grad[i])) {
				t.Fatalf("n %d b %d: dp[%d] = %g, tape %g", c.n, c.b, i, g, pv.Grad[i])
			}
		}
	}
}

// A run on a device (the CPU backend standing in for a GPU, as CI runs
// it) takes the tape's steps: the same losses, and the same encoder at
// the end, with hidden dropout (masks from the same seeds) and a
// checkpoint and evaluation in between.
func TestDeviceRunMatchesTheTape(t *testing.T) {
	deviceRunMatchesTheTape(t, cpu.New(), 1e-4)
}

// TestDeviceRunOnGPU is the same run with its steps on the first GPU (a
// skip where there is none): SimCSE training as `simcse.device: cuda`
// runs it, held to the tape on the host. Float32 kernels that sum in
// another order, over six AdamW steps: 1e-3.
func TestDeviceRunOnGPU(t *testing.T) {
	g, err := device.OpenEncoderTrainer("cuda", false, nil)
	if err != nil {
		t.Skipf("GPU test skipped: %v", err)
	}
	deviceRunMatchesTheTape(t, g, 1e-3)
}

func deviceRunMatchesTheTape(t *testing.T, be kernels.EncoderTrainer, tol float64) {
	corpus := NewGenerator(3).Corpus(400)
	dir := tinyEncoder(t, corpus)
	var data []Example
	for _, s := range corpus {
		data = append(data, Example{Anchor: s, Positive: s})
	}
	run := func(dev bool) (Result, *bert.Weights[float32]) {
		o := Options{Steps: 6, Batch: 16, LR: 1e-3, Warmup: 2, Temperature: 0.05, Dropout: 0.1, Pooling: bert.PoolMean,
			Optim: optim.DefaultConfig(), SaveEvery: 3, EvalEvery: 3, Out: filepath.Join(t.TempDir(), "run"), Log: io.Discard,
			Eval: func(ctx context.Context, e *bert.Encoder) (map[string]float64, error) {
				v, err := e.Embed(ctx, corpus[:4])
				return map[string]float64{"first": float64(v[0][0])}, err
			}}
		if dev {
			o.Device = be
		}
		res, err := Train(context.Background(), dir, data, o)
		if err != nil {
			t.Fatal(err)
		}
		w, err := bert.Load[float32](res.Encoder, false)
		if err != nil {
			t.Fatal(err)
		}
		return res, w
	}
	want, ww := run(false)
	got, gw := run(true)
	if math.Abs(got.FirstLoss-want.FirstLoss) > tol || math.Abs(got.LastLoss-want.LastLoss) > tol {
		t.Fatalf("losses %.6f -> %.6f on the device, %.6f -> %.6f on the tape", got.FirstLoss, got.LastLoss, want.FirstLoss, want.LastLoss)
	}
	if math.Abs(got.Eval["first"]-want.Eval["first"]) > tol {
		t.Fatalf("the evaluation saw %v on the device, %v on the tape", got.Eval, want.Eval)
	}
	for i, n := range ww.Named {
		for j, v := range n.V.Val {
			if d := math.Abs(float64(v - gw.Named[i].V.Val[j])); d > tol {
				t.Fatalf("%s[%d]: %g after the device's steps, %g after the tape's", n.Name, j, gw.Named[i].V.Val[j], v)
			}
		}
	}
	if got.FirstLoss == got.LastLoss {
		t.Fatal("the loss did not move: the test compares nothing")
	}
}
