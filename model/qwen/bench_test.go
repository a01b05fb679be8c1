package qwen

import (
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/agemem/agemem/kernels/cpu"
	"github.com/agemem/agemem/kernels/vec"
	"github.com/agemem/agemem/model/safetensors"
)

// rssMB reads the resident set size of this process.
func rssMB() float64 {
	raw, _ := os.ReadFile("/proc/self/status")
	for _, line := range strings.Split(string(raw), "\n") {
		if f := strings.Fields(line); len(f) >= 2 && f[0] == "VmRSS:" {
			kb, _ := strconv.ParseFloat(f[1], 64)
			return kb / 1024
		}
	}
	return 0
}

// BenchmarkQwen05B loads a random Qwen2.5-0.5B-shaped model (24 layers,
// hidden 896, 14 heads, 2 KV heads, intermediate 4864, vocab 151936, bf16
// weights, and the same shape stored as f16) as stored and as Q8_0 blocks
// (quantize q8_0, what Ollama's q8_0 runs), and reports prefill and decode tokens/s beside the
// decode bound set by memory bandwidth (weight bytes per token ÷ read
// bandwidth measured in the same run), and the RSS that loading added (bf16
// weights are mapped, not read).
func BenchmarkQwen05B(b *testing.B) {
	dirs := map[safetensors.DType]string{}
	for _, dt := range []safetensors.DType{safetensors.BF16, safetensors.F16} {
		dirs[dt] = filepath.Join(b.TempDir(), "q05-"+string(dt))
		if err := InitRandom(dirs[dt], Presets["qwen2.5-0.5b-shape"], dt, 1); err != nil {
			b.Fatal(err)
		}
	}
	// bf16-act: the bf16 weights with the activations rounded to bf16 (the
	// backend device.Open gives inference: AVX512_BF16's VDPBF16PS tiles
	// for the prefill where the CPU has them), beside bf16 in the same run.
	for _, v := range []struct {
		name, quant string
		dtype       safetensors.DType
		bf16Act     bool
	}{{"bf16", "", safetensors.BF16, false}, {"bf16-act", "", safetensors.BF16, true}, {"f16", "", safetensors.F16, false}, {"q8_0", "q8_0", safetensors.BF16, false}} {
		dir, quant, bf16Act := dirs[v.dtype], v.quant, v.bf16Act
		b.Run(v.name, func(b *testing.B) {
			runtime.GC()
			before := rssMB()
			m, err := LoadWith(&cpu.Backend{BF16: bf16Act}, dir, Options{Quantize: quant})
			if err != nil {
				b.Fatal(err)
			}
			defer m.Close()
			loadRSS := rssMB() - before
			prompt := make([]int, 128)
			for i := range prompt {
				prompt[i] = (i * 7919) % m.VocabSize
			}
			// 64 steps a round and the bandwidth read after each round, so
			// that the bound and the decode share the VM's mood of the moment.
			const decodeSteps = 64
			var prefill, decode time.Duration
			var bwSum float64
			for b.Loop() {
				c := m.NewCache(len(prompt) + decodeSteps + 1)
				start := time.Now()
				if _, err := m.forward([][]int{prompt}, []*Cache{c}, true); err != nil {
					b.Fatal(err)
				}
				prefill += time.Since(start)
				start = time.Now()
				tok := 1
				for range decodeSteps {
					if _, err := m.forward([][]int{{tok}}, []*Cache{c}, true); err != nil {
						b.Fatal(err)
					}
					tok = (tok*31 + 7) % m.VocabSize
				}
				decode += time.Since(start)
				bwSum += vec.ReadBandwidth(1 << 30)
			}
			n := float64(b.N)
			decodeTPS := decodeSteps * n / decode.Seconds()
			bw := bwSum / n
			bound := bw * 1e9 / float64(m.WeightBytes())
			b.ReportMetric(float64(len(prompt))*n/prefill.Seconds(), "prefill_tok/s")
			b.ReportMetric(decodeTPS, "decode_tok/s")
			b.ReportMetric(bound, "bw_bound_tok/s")
			b.ReportMetric(decodeTPS/bound, "decode_ratio")
			b.ReportMetric(bw, "membw_GB/s")
			b.ReportMetric(float64(m.WeightBytes())/1e6, "weights_MB")
			b.ReportMetric(loadRSS, "load_RSS_MB")
		})
	}
}
