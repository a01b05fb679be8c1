package qwen

import (
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/agemem/agemem/kernels"
	"github.com/agemem/agemem/kernels/cuda"
	"github.com/agemem/agemem/model/safetensors"
)

// BenchmarkCUDA reports, on the GPU: f32 GEMM TFLOP/s (cuBLAS through the
// backend) at 4096³, and prefill / decode tokens/s of the Qwen2.5-0.5B-shaped
// bf16 model. $AGEMEM_BENCH_DIR keeps the model for the PyTorch anchors
// (testdata/torch_anchors.py). Skipped without a GPU.
func BenchmarkCUDA(b *testing.B) {
	g, err := cuda.New(0)
	if errors.Is(err, cuda.ErrNoDevice) {
		b.Skipf("no GPU: %v", err)
	}
	if err != nil {
		b.Fatal(err)
	}
	const n = 4096
	x := g.Zeros(n, n)
	w := g.Upload(kernels.Weight{Rows: n, Cols: n, F32: make([]float32, n*n)})
	y := g.Zeros(n, n)
	g.MatMul(y, x, w, nil)
	g.Sync()
	start := time.Now()
	const reps = 10
	for range reps {
		g.MatMul(y, x, w, nil)
	}
	g.Sync()
	tflops := 2 * float64(n) * n * n * reps / time.Since(start).Seconds() / 1e12
	// bf16 tensor-core GEMM at 8192³.
	const nb = 8192
	g.BF16 = true
	xb, wb, yb := g.Zeros(nb, nb), g.Upload(kernels.Weight{Rows: nb, Cols: nb, F32: make([]float32, nb*nb)}), g.Zeros(nb, nb)
	g.MatMul(yb, xb, wb, nil)
	g.Sync()
	start = time.Now()
	for range reps {
		g.MatMul(yb, xb, wb, nil)
	}
	g.Sync()
	bf16tflops := 2 * float64(nb) * nb * nb * reps / time.Since(start).Seconds() / 1e12
	xb, wb, yb = nil, nil, nil
	g.BF16 = os.Getenv("AGEMEM_BENCH_BF16") != ""

	dir := os.Getenv("AGEMEM_BENCH_DIR")
	if dir == "" {
		dir = b.TempDir()
	}
	dir = filepath.Join(dir, "q05")
	if _, err := os.Stat(filepath.Join(dir, "config.json")); err != nil {
		if err := InitRandom(dir, Presets["qwen2.5-0.5b-shape"], safetensors.BF16, 1); err != nil {
			b.Fatal(err)
		}
	}
	m, err := LoadOn(g, dir)
	if err != nil {
		b.Fatal(err)
	}
	prompt := make([]int, 128)
	for i := range prompt {
		prompt[i] = (i * 7919) % m.VocabSize
	}
	const steps = 64
	var prefill, decode time.Duration
	for b.Loop() {
		c := m.NewCache(len(prompt) + steps + 1)
		t0 := time.Now()
		if _, err := m.forward([][]int{prompt}, []*Cache{c}, true); err != nil {
			b.Fatal(err)
		}
		prefill += time.Since(t0)
		t0 = time.Now()
		tok := 1
		for range steps {
			if _, err := m.forward([][]int{{tok}}, []*Cache{c}, true); err != nil {
				b.Fatal(err)
			}
			tok = (tok*31 + 7) % m.VocabSize
		}
		decode += time.Since(t0)
	}
	b.ReportMetric(tflops, "f32gemm_TFLOP/s")
	b.ReportMetric(bf16tflops, "bf16gemm_TFLOP/s")
	b.ReportMetric(float64(len(prompt)*b.N)/prefill.Seconds(), "prefill_tok/s")
	b.ReportMetric(float64(steps*b.N)/decode.Seconds(), "decode_tok/s")
}
