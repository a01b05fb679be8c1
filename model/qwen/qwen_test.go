package qwen

import (
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/agemem/agemem/kernels"
	"github.com/agemem/agemem/kernels/cpu"
	"github.com/agemem/agemem/kernels/half"
	"github.com/agemem/agemem/model/lora"
	"github.com/agemem/agemem/model/safetensors"
)

// ref64 is an independent float64 forward pass written plainly from the
// architecture, reading the checkpoint itself: the oracle for Forward.
func ref64(t *testing.T, dir string, tokens []int) [][]float64 {
	cfg, err := LoadConfig(dir)
	if err != nil {
		t.Fatal(err)
	}
	st, err := safetensors.OpenDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	w := func(name string) []float64 {
		tn, ok := st.Tensor(name)
		if !ok {
			t.Fatalf("missing %s", name)
		}
		f := tn.Float32()
		out := make([]float64, len(f))
		for i, v := range f {
			out[i] = float64(v)
		}
		return out
	}
	H, hd, nh, nkv := cfg.HiddenSize, cfg.HeadDim, cfg.Heads, cfg.KVHeads
	linear := func(x []float64, W, b []float64, out int) []float64 {
		in := len(x)
		if refQ8Inputs && in%kernels.QK8 == 0 {
			x = q8Round(x)
		}
		y := make([]float64, out)
		for o := range out {
			s := 0.0
			for i := range in {
				s += x[i] * W[o*in+i]
			}
			if b != nil {
				s += b[o]
			}
			y[o] = s
		}
		return y
	}
	rms := func(x, g []float64) []float64 {
		s := 0.0
		for _, v := range x {
			s += v * v
		}
		inv := 1 / math.Sqrt(s/float64(len(x))+cfg.RMSNormEps)
		y := make([]float64, len(x))
		for i := range x {
			y[i] = x[i] * inv * g[i]
		}
		return y
	}
	rope := func(v []float64, p int) {
		half := hd / 2
		for i := range half {
			a := float64(p) * math.Pow(cfg.RopeTheta, -2*float64(i)/float64(hd))
			x0, x1 := v[i], v[i+half]
			v[i] = x0*math.Cos(a) - x1*math.Sin(a)
			v[i+half] = x1*math.Cos(a) + x0*math.Sin(a)
		}
	}
	emb := w("model.embed_tokens.weight")
	T := len(tokens)
	x := make([][]float64, T)
	for i, id := range tokens {
		x[i] = append([]float64(nil), emb[id*H:(id+1)*H]...)
	}
	for l := range cfg.Layers {
		p := fmt.Sprintf("model.layers.%d.", l)
		var qb, kb, vb []float64
		if cfg.QKVBias() {
			qb, kb, vb = w(p+"self_attn.q_proj.bias"), w(p+"self_attn.k_proj.bias"), w(p+"self_attn.v_proj.bias")
		}
		Q := make([][]float64, T)
		K := make([][]float64, T)
		V := make([][]float64, T)
		for i := range T {
			xn := rms(x[i], w(p+"input_layernorm.weight"))
			Q[i] = linear(xn, w(p+"self_attn.q_proj.weight"), qb, nh*hd)
			K[i] = linear(xn, w(p+"self_attn.k_proj.weight"), kb, nkv*hd)
			V[i] = linear(xn, w(p+"self_attn.v_proj.weight"), vb, nkv*hd)
			for h := range nh {
				if cfg.QKNorm() {
					copy(Q[i][h*hd:], rms(Q[i][h*hd:(h+1)*hd], w(p+"self_attn.q_norm.weight")))
				}
				rope(Q[i][h*hd:(h+1)*hd], i)
			}
			for h := range nkv {
				if cfg.QKNorm() {
					copy(K[i][h*hd:], rms(K[i][h*hd:(h+1)*hd], w(p+"self_attn.k_norm.weight")))
				}
				rope(K[i][h*hd:(h+1)*hd], i)
			}
		}
		for i := range T {
			att := make([]float64, nh*hd)
			for h := range nh {
				kh := h / (nh / nkv)
				sc := make([]float64, i+1)
				mx := math.Inf(-1)
				for j := 0; j <= i; j++ {
					s := 0.0
					for d := range hd {
						s += Q[i][h*hd+d] * K[j][kh*hd+d]
					}
					sc[j] = s / math.Sqrt(float64(hd))
					mx = math.Max(mx, sc[j])
				}
				z := 0.0
				for j := range sc {
					sc[j] = math.Exp(sc[j] - mx)
					z += sc[j]
				}
				for j := range sc {
					for d := range hd {
						att[h*hd+d] += sc[j] / z * V[j][kh*hd+d]
					}
				}
			}
			o := linear(att, w(p+"self_attn.o_proj.weight"), nil, H)
			for d := range H {
				x[i][d] += o[d]
			}
			xn := rms(x[i], w(p+"post_attention_layernorm.weight"))
			g := linear(xn, w(p+"mlp.gate_proj.weight"), nil, cfg.Intermediate)
			u := linear(xn, w(p+"mlp.up_proj.weight"), nil, cfg.Intermediate)
			for j := range g {
				g[j] = g[j] / (1 + math.Exp(-g[j])) * u[j]
			}
			dn := linear(g, w(p+"mlp.down_proj.weight"), nil, H)
			for d := range H {
				x[i][d] += dn[d]
			}
		}
	}
	head := "lm_head.weight"
	if cfg.TieEmbeddings {
		head = "model.embed_tokens.weight"
	}
	out := make([][]float64, T)
	for i := range T {
		out[i] = linear(rms(x[i], w("model.norm.weight")), w(head), nil, cfg.VocabSize)
	}
	return out
}

// cachedLogits are the logits of tokens decoded through the KV cache: the
// first four at once, then one at a time.
func cachedLogits(t *testing.T, m *Model, tokens []int) []float32 {
	t.Helper()
	c := m.NewCache(64)
	out, err := m.Forward(tokens[:4], c)
	if err != nil {
		t.Fatal(err)
	}
	for _, tok := range tokens[4:] {
		step, err := m.Forward([]int{tok}, c)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, step...)
	}
	return out
}

// refQ8Inputs makes ref64 quantize each matmul's input to Q8_0 blocks,
// as a q8_0 model's matmuls do (ggml's q8_0·q8_0 dot).
var refQ8Inputs bool

// q8Round is x through Q8_0 blocks and back.
func q8Round(x []float64) []float64 {
	out := make([]float64, len(x))
	var q [kernels.QK8]int8
	xf := make([]float32, kernels.QK8)
	for b := 0; b < len(x); b += kernels.QK8 {
		for i := range xf {
			xf[i] = float32(x[b+i])
		}
		d := float64(half.F16ToF32(kernels.QuantizeQ8Block(q[:], xf)))
		for i, v := range q {
			out[b+i] = d * float64(v)
		}
	}
	return out
}

func maxRelErr(got []float32, want [][]float64, vocab int) float64 {
	worst := 0.0
	for i, row := range want {
		scale := 0.0
		for _, v := range row {
			scale = math.Max(scale, math.Abs(v))
		}
		for j, v := range row {
			worst = math.Max(worst, math.Abs(float64(got[i*vocab+j])-v)/scale)
		}
	}
	return worst
}

func TestLogitsMatchFloat64Reference(t *testing.T) {
	tokens := []int{1, 17, 300, 42, 42, 7, 511, 0, 99, 256, 3}
	f32Bytes := map[string]int{}
	for _, preset := range []string{"tiny-qwen2", "tiny-qwen3"} {
		for _, dtype := range []safetensors.DType{safetensors.F32, safetensors.BF16, safetensors.F16} {
			t.Run(preset+"/"+string(dtype), func(t *testing.T) {
				dir := filepath.Join(t.TempDir(), "m")
				if err := InitRandom(dir, Presets[preset], dtype, 7); err != nil {
					t.Fatal(err)
				}
				m, err := Load(dir)
				if err != nil {
					t.Fatal(err)
				}
				// 16-bit checkpoints are held as stored: about half the
				// bytes of float32 (norms stay float32).
				if dtype == safetensors.F32 {
					f32Bytes[preset] = m.WeightBytes()
				} else if b := m.WeightBytes(); b > f32Bytes[preset]*6/10 {
					t.Fatalf("%s holds %d weight bytes, float32 %d", dtype, b, f32Bytes[preset])
				}
				want := ref64(t, dir, tokens)
				full, err := m.Forward(tokens, m.NewCache(64))
				if err != nil {
					t.Fatal(err)
				}
				if e := maxRelErr(full, want, m.VocabSize); e > 1e-4 {
					t.Fatalf("full forward: max relative error %.2e", e)
				}
				// KV-cache decoding equals full recomputation.
				if e := maxRelErr(cachedLogits(t, m, tokens), want, m.VocabSize); e > 1e-4 {
					t.Fatalf("cached decoding: max relative error %.2e", e)
				}
			})
		}
	}
}

// A model held as Q8_0 blocks (quantize q8_0) computes what the float64
// reference computes from the dequantized weights with each matmul's input
// quantized to Q8_0 blocks (as ggml's q8_0 matmul does), in a prefill
// (AVX-512 VNNI integer tiles where the CPU has them, else tiles widened
// from the blocks) and in cached decoding (the 8-bit dot kernel), and
// stays near the unquantized model; an unknown quantization is refused.
func TestQuantizedQ8MatchesReference(t *testing.T) {
	tokens := []int{1, 17, 300, 42, 42, 7, 511, 0, 99, 256, 3}
	for _, dtype := range []safetensors.DType{safetensors.F32, safetensors.BF16, safetensors.F16} {
		t.Run(string(dtype), func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "m")
			if err := InitRandom(dir, Presets["tiny-qwen3"], dtype, 7); err != nil {
				t.Fatal(err)
			}
			// The checkpoint of the dequantized weights, for the reference.
			deq := t.TempDir()
			if err := lora.CopyFiles(dir, deq, "config.json"); err != nil {
				t.Fatal(err)
			}
			st, err := safetensors.OpenDir(dir)
			if err != nil {
				t.Fatal(err)
			}
			var out []safetensors.Tensor
			quantized := 0
			for _, name := range st.Names() {
				tt, _ := st.Tensor(name)
				v := tt.Float32()
				if len(tt.Shape) == 2 && tt.Shape[1]%kernels.QK8 == 0 {
					q, err := kernels.QuantizeQ8(kernels.Weight{Rows: tt.Shape[0], Cols: tt.Shape[1], F32: v})
					if err != nil {
						t.Fatal(err)
					}
					v = q.Dequantize().F32
					quantized++
				}
				out = append(out, safetensors.FromFloat32(name, safetensors.F32, tt.Shape, v))
			}
			st.Close()
			if err := safetensors.Write(filepath.Join(deq, "model.safetensors"), out, nil); err != nil {
				t.Fatal(err)
			}
			refQ8Inputs = true
			want := ref64(t, deq, tokens)
			refQ8Inputs = false
			m, err := LoadWith(cpu.New(), dir, Options{Quantize: "q8_0"})
			if err != nil {
				t.Fatal(err)
			}
			plain, _ := Load(dir)
			if quantized < 5 || m.WeightBytes() >= plain.WeightBytes()/2+plain.WeightBytes()/4 {
				t.Fatalf("%d matrices quantized, %d bytes held against %d", quantized, m.WeightBytes(), plain.WeightBytes())
			}
			full, err := m.Forward(tokens, m.NewCache(64))
			if err != nil {
				t.Fatal(err)
			}
			if e := maxRelErr(full, want, m.VocabSize); e > 1e-4 {
				t.Fatalf("prefill: max relative error %.2e against the dequantized reference", e)
			}
			if e := maxRelErr(cachedLogits(t, m, tokens), want, m.VocabSize); e > 1e-4 {
				t.Fatalf("cached decoding: max relative error %.2e", e)
			}
			orig, _ := plain.Forward(tokens, plain.NewCache(64))
			if e := maxRelErr(full, ref64(t, dir, tokens), m.VocabSize); e > 0.05 || e < 1e-6 {
				t.Fatalf("the quantized model is %.2e from the stored one (want small but not zero); %d logits", e, len(orig))
			}
		})
	}
	if _, err := LoadWith(cpu.New(), t.TempDir(), Options{Quantize: "q4_0"}); err == nil || !strings.Contains(err.Error(), "q4_0") {
		t.Fatalf("quantize q4_0: %v", err)
	}
}

func TestBadCheckpoints(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "m")
	InitRandom(dir, Presets["tiny-qwen3"], safetensors.F32, 1)
	m, _ := Load(dir)
	if _, err := m.Forward([]int{600}, m.NewCache(8)); err == nil || !strings.Contains(err.Error(), "outside the vocabulary") {
		t.Fatalf("bad token: %v", err)
	}
	if _, err := m.Forward(make([]int, 9), m.NewCache(8)); err == nil {
		t.Fatal("overflowing the cache must fail")
	}
	// A config that disagrees with the weights names the tensor.
	cfg := Presets["tiny-qwen3"]
	cfg.Intermediate = 96
	WriteConfig(dir, cfg, safetensors.F32)
	if _, err := Load(dir); err == nil || !strings.Contains(err.Error(), `"model.layers.0.mlp.gate_proj.weight" has shape [128 64], config.json implies [96 64]`) {
		t.Fatalf("shape mismatch: %v", err)
	}
	cfg.Heads = 3
	WriteConfig(dir, cfg, safetensors.F32)
	if _, err := Load(dir); err == nil || !strings.Contains(err.Error(), "not a multiple") {
		t.Fatalf("bad heads: %v", err)
	}
	// A value of the wrong JSON type is named by key, in the file's terms.
	os.WriteFile(filepath.Join(dir, "config.json"), []byte(`{"model_type": "qwen3", "hidden_size": "64"}`), 0o644)
	if _, err := Load(dir); err == nil || !strings.Contains(err.Error(), "config.json: hidden_size is a JSON string where an integer belongs") {
		t.Fatalf("mistyped config: %v", err)
	}
	// Tensors whose bytes do not hold their shape in a known dtype (an
	// unknown dtype, a truncated tensor) are refused by name, not read as
	// zeros.
	cfg = Presets["tiny-qwen3"]
	for _, c := range []struct {
		what string
		edit func(ts []safetensors.Tensor)
	}{{"dtype I8", func(ts []safetensors.Tensor) { ts[0].DType = "I8" }},
		{"truncated", func(ts []safetensors.Tensor) { ts[0].Data = ts[0].Data[:len(ts[0].Data)-2] }}} {
		ts := RandomTensors(cfg, safetensors.BF16, 1)
		c.edit(ts)
		if _, err := FromTensors(cpu.New(), cfg, MapOf(ts)); err == nil || !strings.Contains(err.Error(), ts[0].Name) || !strings.Contains(err.Error(), "bytes") {
			t.Fatalf("%s: %v", c.what, err)
		}
	}
}
