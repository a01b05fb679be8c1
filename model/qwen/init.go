package qwen

import (
	"encoding/binary"
	"encoding/json"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"sync"

	"github.com/agemem/agemem/kernels/half"

	"github.com/agemem/agemem/model/safetensors"
)

// Presets are model shapes for tests and benchmarks ("tiny" is tiny-qwen3).
var Presets = map[string]Config{
	"tiny": {ModelType: "qwen3", HiddenSize: 64, Layers: 2, Heads: 4, KVHeads: 2, HeadDim: 32,
		Intermediate: 128, RMSNormEps: 1e-6, RopeTheta: 1e6, TieEmbeddings: false, VocabSize: 512, MaxPositions: 8192},
	"tiny-qwen2": {ModelType: "qwen2", HiddenSize: 64, Layers: 2, Heads: 4, KVHeads: 2, HeadDim: 16,
		Intermediate: 128, RMSNormEps: 1e-6, RopeTheta: 1e6, TieEmbeddings: true, VocabSize: 512, MaxPositions: 8192},
	"tiny-qwen3": {ModelType: "qwen3", HiddenSize: 64, Layers: 2, Heads: 4, KVHeads: 2, HeadDim: 32,
		Intermediate: 128, RMSNormEps: 1e-6, RopeTheta: 1e6, TieEmbeddings: false, VocabSize: 512, MaxPositions: 8192},
	"qwen2.5-0.5b-shape": {ModelType: "qwen2", HiddenSize: 896, Layers: 24, Heads: 14, KVHeads: 2, HeadDim: 64,
		Intermediate: 4864, RMSNormEps: 1e-6, RopeTheta: 1e6, TieEmbeddings: true, VocabSize: 151936, MaxPositions: 32768},
	// The paper's two models (Qwen2.5-7B-Instruct, Qwen3-4B-Instruct),
	// shapes as their config.json files give them.
	"qwen2.5-7b-shape": {ModelType: "qwen2", HiddenSize: 3584, Layers: 28, Heads: 28, KVHeads: 4, HeadDim: 128,
		Intermediate: 18944, RMSNormEps: 1e-6, RopeTheta: 1e6, TieEmbeddings: false, VocabSize: 152064, MaxPositions: 32768},
	"qwen3-4b-shape": {ModelType: "qwen3", HiddenSize: 2560, Layers: 36, Heads: 32, KVHeads: 8, HeadDim: 128,
		Intermediate: 9728, RMSNormEps: 1e-6, RopeTheta: 1e6, TieEmbeddings: true, VocabSize: 151936, MaxPositions: 40960},
}

// InitRandom writes a random-weight model in the Hugging Face layout
// (config.json, model.safetensors) to dir: projections ~ N(0, 0.02²)
// (biases too, so they are exercised), norm weights 1 + N(0, 0.1²).
func InitRandom(dir string, cfg Config, dtype safetensors.DType, seed uint64) error {
	return InitRandomProgress(dir, cfg, dtype, seed, nil)
}

// InitRandomProgress is InitRandom telling progress the parameters drawn
// so far out of all of them, after each tensor (a 0.5B model takes tens of
// seconds on a CPU).
func InitRandomProgress(dir string, cfg Config, dtype safetensors.DType, seed uint64, progress func(done, total int)) error {
	if cfg.HeadDim == 0 {
		cfg.HeadDim = cfg.HiddenSize / cfg.Heads
	}
	if err := cfg.Validate(); err != nil {
		return err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	if err := safetensors.Write(filepath.Join(dir, "model.safetensors"), drawTensors(cfg, dtype, seed, progress), map[string]string{"format": "pt"}); err != nil {
		return err
	}
	return WriteConfig(dir, cfg, dtype)
}

// RandomTensors draws InitRandom's weights into memory.
func RandomTensors(cfg Config, dtype safetensors.DType, seed uint64) []safetensors.Tensor {
	return drawTensors(cfg, dtype, seed, nil)
}

func drawTensors(cfg Config, dtype safetensors.DType, seed uint64, progress func(done, total int)) []safetensors.Tensor {
	r := rand.New(rand.NewPCG(seed, 0x7177656e))
	var ts []safetensors.Tensor
	params := drawOrder(Params(cfg))
	total, done := 0, 0
	for _, p := range params {
		n := 1
		for _, d := range p.Shape {
			n *= d
		}
		total += n
	}
	for _, p := range params {
		std, mean := 0.02, 0.0
		if p.Role == Norm || p.Role == HeadNorm {
			std, mean = 0.1, 1
		}
		n := 1
		for _, d := range p.Shape {
			n *= d
		}
		v := make([]float32, n)
		for i := range v {
			v[i] = float32(mean + std*r.NormFloat64())
		}
		ts = append(ts, safetensors.FromFloat32(p.Name, dtype, p.Shape, v))
		if done += n; progress != nil {
			progress(done, total)
		}
	}
	return ts
}

// RandomBF16 draws bf16 weights of cfg's shapes for benchmarks of real
// model sizes, in parallel: matrices uniform with standard deviation 0.02,
// norm weights 1. A 7B model takes seconds where RandomTensors (one
// normal draw at a time, in a fixed order) takes minutes.
func RandomBF16(cfg Config, seed uint64) TensorMap {
	m := TensorMap{}
	var wg sync.WaitGroup
	var mu sync.Mutex
	for i, p := range Params(cfg) {
		n := 1
		for _, d := range p.Shape {
			n *= d
		}
		data := make([]byte, 2*n)
		mu.Lock()
		m[p.Name] = safetensors.Tensor{Name: p.Name, DType: safetensors.BF16, Shape: p.Shape, Data: data}
		mu.Unlock()
		const chunk = 1 << 22
		for lo := 0; lo < n; lo += chunk {
			wg.Add(1)
			go func(lo, hi int, seed uint64) {
				defer wg.Done()
				out := data[2*lo : 2*hi]
				if p.Role == Norm || p.Role == HeadNorm {
					for j := 0; j < len(out); j += 2 {
						binary.LittleEndian.PutUint16(out[j:], half.F32ToBF16(1))
					}
					return
				}
				const a = 0.02 * 1.7320508 // uniform on [-a, a] has std 0.02
				x := seed
				for j := 0; j < len(out); j += 2 {
					x ^= x << 13 // xorshift64
					x ^= x >> 7
					x ^= x << 17
					binary.LittleEndian.PutUint16(out[j:], half.F32ToBF16(float32(a*(2*float64(x>>11)/(1<<53)-1))))
				}
			}(lo, min(lo+chunk, n), seed*0x9e3779b97f4a7c15+uint64(i)<<32+uint64(lo)|1)
		}
	}
	wg.Wait()
	return m
}

// WriteConfig writes a config.json that transformers loads too.
func WriteConfig(dir string, cfg Config, dtype safetensors.DType) error {
	arch := map[string]string{"qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM"}[cfg.ModelType]
	cfg.Architectures = []string{arch}
	cfg.TorchDType = map[safetensors.DType]string{safetensors.F32: "float32", safetensors.F16: "float16", safetensors.BF16: "bfloat16"}[dtype]
	cfg.HiddenAct = "silu"
	if cfg.ModelType == "qwen3" && cfg.AttentionBias == nil {
		f := false
		cfg.AttentionBias = &f
	}
	raw, err := json.MarshalIndent(cfg, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, "config.json"), raw, 0o644)
}

// drawOrder is the order InitRandom draws tensors in: the globals first,
// then per layer its two norms, the attention projections' weights, their
// biases, the q/k norms and the MLP's weights. It is the order of the first
// release, kept so that a seed still gives the same model.
func drawOrder(ps []Param) []Param {
	attention := LoRATargets[:4] // q, k, v, o
	part := func(p Param) int {
		switch {
		case p.Role == Norm:
			return 0
		case p.Role == Weight && slices.Contains(attention, p.Target):
			return 1
		case p.Role == Bias:
			return 2
		case p.Role == HeadNorm:
			return 3
		}
		return 4 // the MLP's weights
	}
	out := slices.Clone(ps)
	slices.SortStableFunc(out, func(a, b Param) int {
		if a.Layer != b.Layer {
			return a.Layer - b.Layer
		}
		if a.Layer < 0 {
			return 0
		}
		return part(a) - part(b)
	})
	return out
}
