package qwen

import (
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
	g := gpuOrSkip(b)
	tflops := gemmRate(g, false) / 1e12
	bf16tflops := gemmRate(g, true) / 1e12
	g.BF16 = os.Getenv("AGEMEM_BENCH_BF16") != ""

	m, err := LoadOn(g, benchModelDir(b))
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

// gemmRate measures cuBLAS GEMM FLOP/s through the backend: f32 at 4096³,
// or bf16 on tensor cores at 8192³.
func gemmRate(g *cuda.Backend, bf16 bool) float64 {
	n, reps := 4096, 10
	if bf16 {
		n = 8192
	}
	saved := g.BF16
	g.BF16 = bf16
	defer func() { g.BF16 = saved }()
	x, y := g.Zeros(n, n), g.Zeros(n, n)
	w := g.Upload(kernels.Weight{Rows: n, Cols: n, F32: make([]float32, n*n)})
	g.MatMul(y, x, w, nil)
	g.Sync()
	t0 := time.Now()
	for range reps {
		g.MatMul(y, x, w, nil)
	}
	g.Sync()
	return 2 * float64(n) * float64(n) * float64(n) * float64(reps) / time.Since(t0).Seconds()
}

// benchModelDir is the Qwen2.5-0.5B-shaped bf16 checkpoint the benchmarks
// and the PyTorch anchors share: $AGEMEM_BENCH_DIR/q05, written once.
func benchModelDir(b *testing.B) string {
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
	return dir
}
