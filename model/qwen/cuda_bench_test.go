package qwen

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/agemem/agemem/internal/testkit"
	"github.com/agemem/agemem/model/safetensors"
)

// BenchmarkCUDA reports, on the GPU: f32 GEMM TFLOP/s (cuBLAS through the
// backend) at 4096³, and prefill / decode tokens/s of the Qwen2.5-0.5B-shaped
// bf16 model. $AGEMEM_BENCH_DIR keeps the model for the PyTorch anchors
// (testdata/torch_anchors.py). Skipped without a GPU.
func BenchmarkCUDA(b *testing.B) {
	g := testkit.GPU(b)
	tflops := testkit.GEMMRate(g, false) / 1e12
	bf16tflops := testkit.GEMMRate(g, true) / 1e12
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
