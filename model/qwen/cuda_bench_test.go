package qwen

import (
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
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

// BenchmarkCUDAPaperDecode is rollout decoding of the paper's models on one
// GPU: Qwen2.5-7B- and Qwen3-4B-shaped random bf16 weights, a 512-token
// prompt, then 64 greedy steps for a batch of 1 and of 8 sequences. Each
// figure stands beside the memory-bandwidth bound measured in the same run
// (a step reads every weight once: batch × bandwidth / weight bytes, the
// KV cache not counted). The transformers `generate` anchor is
// model/train/testdata/peft_anchor.py. $AGEMEM_PAPER_SHAPES picks shapes.
func BenchmarkCUDAPaperDecode(b *testing.B) {
	g := testkit.GPU(b)
	bw := testkit.CopyRate(g)
	shapes := os.Getenv("AGEMEM_PAPER_SHAPES")
	if shapes == "" {
		shapes = "qwen2.5-7b-shape,qwen3-4b-shape"
	}
	for _, shape := range strings.Split(shapes, ",") {
		cfg, ok := Presets[shape]
		if !ok {
			b.Fatalf("no preset %q", shape)
		}
		g.BF16 = true
		m, err := FromTensors(g, cfg, RandomBF16(cfg, 1))
		if err != nil {
			b.Fatal(err)
		}
		for _, batch := range []int{1, 8} {
			b.Run(fmt.Sprintf("%s/batch%d", shape, batch), func(b *testing.B) {
				const promptLen, steps = 512, 64
				var decode time.Duration
				for b.Loop() {
					prompts, caches, next := make([][]int, batch), make([]*Cache, batch), make([][]int, batch)
					for s := range batch {
						prompts[s] = make([]int, promptLen)
						for i := range prompts[s] {
							prompts[s][i] = (i*7919 + s*13) % m.VocabSize
						}
						caches[s] = m.NewCache(promptLen + steps + 1)
						next[s] = []int{s + 1}
					}
					if _, err := m.forward(prompts, caches, true); err != nil {
						b.Fatal(err)
					}
					g.Sync()
					t0 := time.Now()
					for range steps {
						if _, err := m.forward(next, caches, true); err != nil {
							b.Fatal(err)
						}
						for s := range next {
							next[s][0] = (next[s][0]*31 + 7) % m.VocabSize
						}
					}
					g.Sync()
					decode += time.Since(t0)
				}
				tps := float64(batch*steps*b.N) / decode.Seconds()
				bound := float64(batch) * bw / float64(m.WeightBytes())
				b.ReportMetric(tps, "decode_tok/s")
				b.ReportMetric(bound, "bound_tok/s")
				b.ReportMetric(tps/bound, "ratio")
				b.ReportMetric(bw/1e12, "bandwidth_TB/s")
			})
		}
		g.BF16 = false
		m = nil
		runtime.GC()
	}
}
