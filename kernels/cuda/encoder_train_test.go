package cuda

import (
	"math/rand/v2"
	"testing"

	"github.com/agemem/agemem/kernels"
	"github.com/agemem/agemem/kernels/cpu"
)

// encoderCase is the input of the encoder training kernels' tests: three
// segments (one of a single row) of t rows, heads of hd.
type encoderCase struct {
	t, heads, hd                   int
	bounds                         []int
	q, k, v, dout, x, dy, w, dpool []float32
}

func newEncoderCase() encoderCase {
	r := rand.New(rand.NewPCG(11, 12))
	c := encoderCase{t: 11, heads: 2, hd: 8, bounds: []int{0, 4, 5, 11}}
	n, d := c.t*c.heads*c.hd, c.heads*c.hd
	c.q, c.k, c.v, c.dout, c.x, c.dy = rnd(r, n), rnd(r, n), rnd(r, n), rnd(r, n), rnd(r, n), rnd(r, n)
	c.w, c.dpool = rnd(r, d), rnd(r, 3*d)
	return c
}

// run applies the ops to c on be, each output from zero: the segment
// attention with dropout 0.3 (seed 99) and its backward, LayerNorm's
// backward (eps 1e-5), GELU's (erf, tanh), tanh's (y = x) and the segment
// mean's, in the emulator's order.
func (c encoderCase) run(be kernels.EncoderTrainer) map[string][]float32 {
	d := c.heads * c.hd
	m := func(x []float32) kernels.Tensor { return be.FromHost(x, c.t, d) }
	z := func() kernels.Tensor { return be.Zeros(c.t, d) }
	q, k, v, g, x, dy := m(c.q), m(c.k), m(c.v), m(c.dout), m(c.x), m(c.dy)
	out, dq, dk, dv, dx, ge, gt, th, dm := z(), z(), z(), z(), z(), z(), z(), z(), z()
	dw, db := be.Zeros(d), be.Zeros(d)
	be.SegmentAttentionDropout(out, q, k, v, c.bounds, c.heads, c.hd, 0.3, 99)
	be.SegmentAttentionBackward(dq, dk, dv, g, q, k, v, c.bounds, c.heads, c.hd, 0.3, 99)
	be.LayerNormBackward(dx, dw, db, dy, x, be.FromHost(c.w, d), 1e-5)
	be.GELUBackward(ge, dy, x, false)
	be.GELUBackward(gt, dy, x, true)
	be.TanhBackward(th, dy, x)
	be.SegmentMeanBackward(dm, be.FromHost(c.dpool, 3, d), c.bounds)
	out2 := map[string][]float32{}
	for name, t := range map[string]kernels.Tensor{"out": out, "dq": dq, "dk": dk, "dv": dv, "layernorm dx": dx, "layernorm dw": dw,
		"layernorm db": db, "gelu dx": ge, "gelu tanh dx": gt, "tanh dx": th, "segment mean dx": dm} {
		out2[name] = be.ToHost(t)
	}
	return out2
}

var encoderOutputs = []string{"out", "dq", "dk", "dv", "layernorm dx", "layernorm dw", "layernorm db", "gelu dx", "gelu tanh dx", "tanh dx", "segment mean dx"}

// TestEncoderTrainEmulated runs encoder_train.cu's kernels through the
// emulator and holds each output to the CPU backend's op (the reference
// the tape checks).
func TestEncoderTrainEmulated(t *testing.T) {
	bin := emulator(t)
	c := newEncoderCase()
	want := c.run(cpu.New())
	dims := append([]int{c.t, c.heads, c.hd, len(c.bounds) - 1}, c.bounds...)
	f := emulate(t, bin, "encoder", dims, c.q, c.k, c.v, c.dout, c.x, c.dy, c.w, c.dpool)
	for _, name := range encoderOutputs {
		n := len(want[name])
		if len(f) < n {
			t.Fatalf("%s: the emulator wrote too little", name)
		}
		close(t, name, f[:n], want[name], 1e-5)
		f = f[n:]
	}
	if len(f) != 0 {
		t.Fatalf("%d values left over", len(f))
	}
}

// TestEncoderTrainOnGPU is its GPU twin: the CUDA backend's ops against
// the CPU backend's.
func TestEncoderTrainOnGPU(t *testing.T) {
	g := gpu(t)
	c := newEncoderCase()
	want, got := c.run(cpu.New()), c.run(g)
	for _, name := range encoderOutputs {
		close(t, name, got[name], want[name], 1e-5)
	}
}
