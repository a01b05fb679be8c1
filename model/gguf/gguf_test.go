package gguf

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/ollama/ollama/fs/ggml"
	ollamatok "github.com/ollama/ollama/tokenizer"
	"github.com/x448/float16"

	"github.com/agemem/agemem/internal/testkit"
	"github.com/agemem/agemem/model/lora"
	"github.com/agemem/agemem/model/qwen"
	"github.com/agemem/agemem/model/safetensors"
	"github.com/agemem/agemem/model/tokenizer"
)

// qwenPretokenizer is the pre-tokenizer Ollama's qwen2 and qwen3 models
// give their byte-pair encoder.
const qwenPretokenizer = `(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`

// tinyQwen writes a random model with the real Qwen3 tokenizer (151,669
// ids, more embedding rows than tokens as Qwen's checkpoints have).
func tinyQwen(t *testing.T, cfg qwen.Config, dtype safetensors.DType) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "model")
	tokDir := testkit.QwenTokenizerDir(t)
	cfg.VocabSize = 151680
	if err := qwen.InitRandom(dir, cfg, dtype, 9); err != nil {
		t.Fatal(err)
	}
	if err := lora.CopyFiles(tokDir, dir, "tokenizer.json", "tokenizer_config.json"); err != nil {
		t.Fatal(err)
	}
	return dir
}

var small = map[string]qwen.Config{
	"qwen3": {ModelType: "qwen3", HiddenSize: 32, Layers: 2, Heads: 2, KVHeads: 1, HeadDim: 16,
		Intermediate: 64, RMSNormEps: 1e-6, RopeTheta: 1e6, TieEmbeddings: false, MaxPositions: 4096},
	"qwen2": {ModelType: "qwen2", HiddenSize: 32, Layers: 2, Heads: 2, KVHeads: 1, HeadDim: 16,
		Intermediate: 64, RMSNormEps: 1e-5, RopeTheta: 1e4, TieEmbeddings: true, MaxPositions: 2048},
}

func decode(t *testing.T, path string) (*ggml.GGML, *os.File) {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	g, err := ggml.Decode(f, -1)
	if err != nil {
		t.Fatalf("ollama's fs/ggml cannot decode %s: %v", path, err)
	}
	return g, f
}

// values reads a tensor back from the file with the offsets and sizes
// Ollama's decoder computed, and dequantises it independently of the
// writer (x448/float16 for F16, bit shifts for BF16, blocks for Q8_0).
func values(t *testing.T, f *os.File, base uint64, tt *ggml.Tensor) []float32 {
	t.Helper()
	raw := make([]byte, tt.Size())
	if _, err := f.ReadAt(raw, int64(base+tt.Offset)); err != nil {
		t.Fatalf("%s: %v", tt.Name, err)
	}
	n := int(tt.Elements())
	out := make([]float32, n)
	switch Type(tt.Kind) {
	case F32:
		for i := range out {
			out[i] = math.Float32frombits(binary.LittleEndian.Uint32(raw[4*i:]))
		}
	case F16:
		for i := range out {
			out[i] = float16.Frombits(binary.LittleEndian.Uint16(raw[2*i:])).Float32()
		}
	case BF16:
		for i := range out {
			out[i] = math.Float32frombits(uint32(binary.LittleEndian.Uint16(raw[2*i:])) << 16)
		}
	case Q8_0:
		for b := 0; b < n/32; b++ {
			blk := raw[b*34 : (b+1)*34]
			d := float16.Frombits(binary.LittleEndian.Uint16(blk)).Float32()
			for j := range 32 {
				out[b*32+j] = d * float32(int8(blk[2+j]))
			}
		}
	default:
		t.Fatalf("%s: unexpected kind %d", tt.Name, tt.Kind)
	}
	return out
}

// close reports whether got is within the rounding of type k of want.
func closeTo(k Type, want, got []float32) (int, bool) {
	for b := 0; b < len(want); b += 32 {
		end := min(b+32, len(want))
		var amax float64
		for _, v := range want[b:end] {
			amax = max(amax, math.Abs(float64(v)))
		}
		for i := b; i < end; i++ {
			w, g := float64(want[i]), float64(got[i])
			var tol float64
			switch k {
			case F32:
				tol = 0
			case F16:
				tol = math.Abs(w)*0x1p-11 + 0x1p-24
			case BF16:
				tol = math.Abs(w) * 0x1p-8
			case Q8_0:
				// half a quantisation step, plus the f16 rounding of the scale
				tol = amax / 127 * (0.5 + 127*0x1p-11)
			}
			if math.Abs(w-g) > tol {
				return i, false
			}
		}
	}
	return 0, true
}

// Every export is read back by Ollama's own GGUF decoder: every metadata
// key and value, every tensor's name, shape, type and values, for both
// architectures and all four types.
func TestExportReadBackByOllama(t *testing.T) {
	for _, arch := range []string{"qwen3", "qwen2"} {
		cfg := small[arch]
		dir := tinyQwen(t, cfg, safetensors.BF16)
		st, err := safetensors.OpenDir(dir)
		if err != nil {
			t.Fatal(err)
		}
		defer st.Close()
		tok, err := tokenizer.Load(filepath.Join(dir, "tokenizer.json"))
		if err != nil {
			t.Fatal(err)
		}
		for _, typ := range []Type{F32, F16, BF16, Q8_0} {
			t.Run(arch+"/"+typ.String(), func(t *testing.T) {
				path := filepath.Join(t.TempDir(), "m.gguf")
				sum, err := ExportQwenFile(dir, path, ExportOptions{Type: typ, Name: "agemem-test"})
				if err != nil {
					t.Fatal(err)
				}
				if fi, err := os.Stat(path); err != nil || fi.Mode().Perm() != 0o644 {
					t.Fatalf("the exported file's mode is %v, want 0644 (others, e.g. an Ollama server, read it)", fi.Mode().Perm())
				}
				g, f := decode(t, path)
				kv := g.KV()
				want := map[string]any{
					"general.architecture":                     arch,
					"general.type":                             "model",
					"general.name":                             "agemem-test",
					"general.file_type":                        typ.FileType(),
					"general.quantization_version":             uint32(2),
					arch + ".block_count":                      uint32(cfg.Layers),
					arch + ".context_length":                   uint32(cfg.MaxPositions),
					arch + ".embedding_length":                 uint32(cfg.HiddenSize),
					arch + ".feed_forward_length":              uint32(cfg.Intermediate),
					arch + ".attention.head_count":             uint32(cfg.Heads),
					arch + ".attention.head_count_kv":          uint32(cfg.KVHeads),
					arch + ".attention.key_length":             uint32(cfg.HeadDim),
					arch + ".attention.value_length":           uint32(cfg.HeadDim),
					arch + ".rope.dimension_count":             uint32(cfg.HeadDim),
					arch + ".rope.freq_base":                   float32(cfg.RopeTheta),
					arch + ".attention.layer_norm_rms_epsilon": float32(cfg.RMSNormEps),
					"tokenizer.ggml.model":                     "gpt2",
					"tokenizer.ggml.pre":                       "qwen2",
					"tokenizer.ggml.eos_token_id":              uint32(151645), // <|im_end|>
					"tokenizer.ggml.padding_token_id":          uint32(151643), // <|endoftext|>
					"tokenizer.ggml.bos_token_id":              uint32(151643),
					"tokenizer.ggml.add_bos_token":             false,
					"general.parameter_count":                  sum.Params, // the decoder adds it
				}
				arrays := []string{"tokenizer.ggml.tokens", "tokenizer.ggml.token_type", "tokenizer.ggml.merges", "tokenizer.chat_template"}
				if kv.Len() != len(want)+len(arrays) {
					var keys []string
					for k := range kv.Keys() {
						keys = append(keys, k)
					}
					slices.Sort(keys)
					t.Fatalf("%d metadata keys, want %d: %v", kv.Len(), len(want)+len(arrays), keys)
				}
				for k, v := range want {
					if got := kv.Value(k); got != v {
						t.Errorf("%s = %#v (%T), want %#v (%T)", k, got, got, v, v)
					}
				}
				if !strings.Contains(kv.ChatTemplate(), "<|im_start|>") || !strings.Contains(kv.ChatTemplate(), "</think>") {
					t.Errorf("tokenizer.chat_template is not Qwen3's: %.80q", kv.ChatTemplate())
				}
				tokens, types, merges := kv.Strings("tokenizer.ggml.tokens"), kv.Ints("tokenizer.ggml.token_type"), kv.Strings("tokenizer.ggml.merges")
				if len(tokens) != 151680 || len(types) != len(tokens) {
					t.Fatalf("%d tokens and %d types, want 151680 (the embedding's rows)", len(tokens), len(types))
				}
				if tokens[151645] != "<|im_end|>" || types[151645] != TokenControl || types[151667] != TokenUserDefined || tokens[151667] != "<think>" ||
					types[1000] != TokenNormal || tokens[151679] != "[PAD151679]" || types[151679] != TokenUnused {
					t.Errorf("token table: %q/%d %q/%d %d %q/%d", tokens[151645], types[151645], tokens[151667], types[151667], types[1000], tokens[151679], types[151679])
				}
				if len(merges) != len(tok.Merges()) || merges[0] != "Ġ Ġ" {
					t.Errorf("%d merges (first %q), want %d", len(merges), merges[0], len(tok.Merges()))
				}

				ts := g.Tensors()
				nTensors := 1 + 1 + cfg.Layers*11
				if arch == "qwen2" {
					nTensors = 1 + 1 + cfg.Layers*12 // biases, no q/k norms, tied output
				} else {
					nTensors++ // untied output
				}
				if len(ts.Items()) != nTensors || sum.Tensors != nTensors {
					t.Fatalf("%d tensors (summary %d), want %d", len(ts.Items()), sum.Tensors, nTensors)
				}
				hfName := map[string]string{}
				for _, p := range qwen.Params(cfg) {
					hfName[p.GGUF] = p.Name
				}
				for _, tt := range ts.Items() {
					src, ok := st.Tensor(hfName[tt.Name])
					if !ok {
						t.Fatalf("tensor %s has no source", tt.Name)
					}
					wantShape := make([]uint64, len(src.Shape))
					for i, d := range src.Shape {
						wantShape[len(src.Shape)-1-i] = uint64(d)
					}
					if !slices.Equal(tt.Shape, wantShape) {
						t.Errorf("%s: shape %v, want %v", tt.Name, tt.Shape, wantShape)
					}
					wantKind := typ
					if len(src.Shape) == 1 {
						wantKind = F32
					}
					if Type(tt.Kind) != wantKind {
						t.Errorf("%s: kind %d, want %v", tt.Name, tt.Kind, wantKind)
					}
					if i, ok := closeTo(Type(tt.Kind), src.Float32(), values(t, f, ts.Offset, tt)); !ok {
						t.Errorf("%s (%v): value %d differs beyond the rounding of the type", tt.Name, Type(tt.Kind), i)
					}
				}
				for _, need := range []string{"token_embd.weight", "output_norm.weight", "blk.1.ffn_down.weight", "blk.0.attn_output.weight"} {
					if len(ts.Items(need)) != 1 {
						t.Errorf("no tensor %s", need)
					}
				}
				if arch == "qwen3" && (len(ts.Items("blk.0.attn_q_norm.weight")) != 1 || len(ts.Items("output.weight")) != 1) {
					t.Errorf("qwen3 export lacks attn_q_norm or output")
				}
				if arch == "qwen2" && (len(ts.Items("blk.1.attn_v.bias")) != 1 || len(ts.Items("output.weight")) != 0) {
					t.Errorf("qwen2 export lacks attn_v.bias or writes a tied output")
				}
			})
		}
	}
}

// The vocabulary and merges the file carries tokenise like our tokenizer
// (and so like Hugging Face's) when Ollama's own byte-pair encoder reads
// them: special tokens, whitespace runs, digits, accents and CJK.
func TestExportedTokenizerEncodesLikeOursInOllama(t *testing.T) {
	dir := tinyQwen(t, small["qwen3"], safetensors.F32)
	path := filepath.Join(t.TempDir(), "m.gguf")
	if _, err := ExportQwenFile(dir, path, ExportOptions{Type: F16}); err != nil {
		t.Fatal(err)
	}
	g, _ := decode(t, path)
	kv := g.KV()
	bpe := ollamatok.NewBytePairEncoding(&ollamatok.Vocabulary{
		Values: kv.Strings("tokenizer.ggml.tokens"),
		Types:  kv.Ints("tokenizer.ggml.token_type"),
		Merges: kv.Strings("tokenizer.ggml.merges"),
		AddBOS: kv.Bool("tokenizer.ggml.add_bos_token", true),
		BOS:    []int32{int32(kv.Uint("tokenizer.ggml.bos_token_id"))},
		EOS:    []int32{int32(kv.Uint("tokenizer.ggml.eos_token_id"))},
	}, qwenPretokenizer)
	ours, err := tokenizer.Load(filepath.Join(dir, "tokenizer.json"))
	if err != nil {
		t.Fatal(err)
	}
	texts := []string{
		"Hello world",
		"<|im_start|>system\nYou manage your memory.<|im_end|>\n<|im_start|>user\nWhere was Marla Quenby born?<|im_end|>\n<|im_start|>assistant\n<think>\nI should retrieve.\n</think>\n\n<tool_call>[{\"name\": \"Retrieve_memory\", \"arguments\": {\"query\": \"Marla Quenby\", \"top_k\": 3}}]</tool_call><|im_end|>",
		"  leading spaces,\ttabs\n\n\nand   runs of    whitespace   ",
		"Numbers 1234567 and 3.14159, dates 1971-03-04.",
		"Accents: café naïve Zürich; CJK: 北京是中国的首都; emoji: 🙂",
		"it's we'll THEY'RE don't",
	}
	for _, s := range texts {
		got, err := bpe.Encode(s, true)
		if err != nil {
			t.Fatal(err)
		}
		want := ours.Encode(s)
		g := make([]int, len(got))
		for i, v := range got {
			g[i] = int(v)
		}
		if !slices.Equal(g, want) {
			t.Errorf("%.40q: Ollama %v, ours %v", s, g, want)
		}
		back, err := bpe.Decode(got)
		if err != nil || back != s {
			t.Errorf("%.40q: Ollama decodes back to %.40q (%v)", s, back, err)
		}
	}
}

// A LoRA adapter directory exports as its merged model; Q8_0 keeps a
// matrix whose rows are not a multiple of 32 in F16; a checkpoint with a
// tensor the architecture lacks, or without a config, is refused by name.
func TestExportAdapterFallbackAndErrors(t *testing.T) {
	cfg := small["qwen2"]
	cfg.HiddenSize, cfg.Heads, cfg.HeadDim = 48, 3, 16 // rows of 48 values
	base := tinyQwen(t, cfg, safetensors.F32)
	names, shape := cfg.Linears()
	a, err := lora.New(lora.Config{R: 4, Alpha: 8, BaseModel: base, TargetModules: []string{"q_proj", "v_proj", "down_proj"}}, names, shape, 3, true)
	if err != nil {
		t.Fatal(err)
	}
	adapter := filepath.Join(t.TempDir(), "adapter")
	if err := a.Save(adapter); err != nil {
		t.Fatal(err)
	}
	merged := filepath.Join(t.TempDir(), "merged")
	if err := lora.Merge(base, adapter, merged); err != nil {
		t.Fatal(err)
	}
	var fromAdapter, fromMerged, fromBase bytes.Buffer
	o := ExportOptions{Type: Q8_0, Name: "x"}
	sum, err := ExportQwen(adapter, &fromAdapter, o)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ExportQwen(merged, &fromMerged, o); err != nil {
		t.Fatal(err)
	}
	if _, err := ExportQwen(base, &fromBase, o); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(fromAdapter.Bytes(), fromMerged.Bytes()) {
		t.Error("exporting the adapter differs from exporting the merged model")
	}
	if bytes.Equal(fromAdapter.Bytes(), fromBase.Bytes()) {
		t.Error("exporting the adapter ignored it")
	}
	// token_embd, q, k, v, gate, up have rows of 48: F16; o_proj and
	// down_proj rows of 48 and 64... o: in 48 -> F16; down: in 64 -> Q8_0.
	if sum.Types[Q8_0] != cfg.Layers || sum.Types[F16] != 1+6*cfg.Layers {
		t.Errorf("types %v: want %d Q8_0 (ffn_down) and %d F16", sum.Types, cfg.Layers, 1+6*cfg.Layers)
	}

	bad := t.TempDir()
	if err := lora.CopyFiles(base, bad, "config.json", "tokenizer.json", "tokenizer_config.json"); err != nil {
		t.Fatal(err)
	}
	src, _ := safetensors.OpenDir(base)
	var ts []safetensors.Tensor
	for _, n := range src.Names() {
		tt, _ := src.Tensor(n)
		ts = append(ts, safetensors.Tensor{Name: n, DType: tt.DType, Shape: tt.Shape, Data: tt.Data})
	}
	ts = append(ts, safetensors.FromFloat32("model.layers.0.mlp.experts.weight", safetensors.F32, []int{2}, []float32{1, 2}))
	if err := safetensors.Write(filepath.Join(bad, "model.safetensors"), ts, nil); err != nil {
		t.Fatal(err)
	}
	src.Close()
	if _, err := ExportQwen(bad, io.Discard, o); err == nil || !strings.Contains(err.Error(), "model.layers.0.mlp.experts.weight") {
		t.Errorf("unknown tensor: %v", err)
	}
	if _, err := ExportQwen(t.TempDir(), io.Discard, o); err == nil || !strings.Contains(err.Error(), "config.json") {
		t.Errorf("no config: %v", err)
	}
	// A tokenizer that cuts text with another regex than Qwen's: llama.cpp
	// and Ollama would cut it with Qwen's.
	words := t.TempDir()
	if err := lora.CopyFiles(base, words, "config.json", "tokenizer_config.json", "model.safetensors"); err != nil {
		t.Fatal(err)
	}
	raw, _ := os.ReadFile(filepath.Join(base, "tokenizer.json"))
	q, _ := json.Marshal(tokenizer.QwenPattern)
	w, _ := json.Marshal(tokenizer.WordsPattern)
	if !bytes.Contains(raw, q) {
		t.Fatal("the Qwen tokenizer.json does not hold Qwen's regex as marshalled")
	}
	os.WriteFile(filepath.Join(words, "tokenizer.json"), bytes.Replace(raw, q, w, 1), 0o644)
	if _, err := ExportQwen(words, io.Discard, o); err == nil || !strings.Contains(err.Error(), "would read token ids it was not trained on") ||
		!strings.Contains(err.Error(), `\\p{L}+ ?`) {
		t.Errorf("a words-pattern tokenizer: %v", err)
	}
	out := filepath.Join(t.TempDir(), "never.gguf")
	if _, err := ExportQwenFile(bad, out, o); err == nil {
		t.Error("a failed export succeeded")
	}
	if _, err := os.Stat(out); !os.IsNotExist(err) {
		t.Error("a failed export left a file behind")
	}
}

// Write refuses a tensor whose data does not match its dims, a Q8_0
// tensor with a partial block, and repeated names, before writing.
func TestWriteRefusesBadTensors(t *testing.T) {
	for _, c := range []struct {
		name string
		kvs  []KV
		ts   []Tensor
		want string
	}{
		{"short data", nil, []Tensor{{Name: "a", Dims: []uint64{4, 2}, Type: F32, Data: make([]float32, 7)}}, "dims [4 2] but 7 values"},
		{"q8 partial block", nil, []Tensor{{Name: "a", Dims: []uint64{48}, Type: Q8_0, Data: make([]float32, 48)}}, "multiple of 32"},
		{"two tensors one name", nil, []Tensor{{Name: "a", Dims: []uint64{1}, Data: []float32{1}}, {Name: "a", Dims: []uint64{1}, Data: []float32{1}}}, "twice"},
		{"two keys one name", []KV{{"k", uint32(1)}, {"k", uint32(2)}}, nil, "twice"},
		{"bad value", []KV{{"k", struct{}{}}}, nil, "unsupported value type"},
	} {
		var buf bytes.Buffer
		err := Write(&buf, c.kvs, c.ts)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want an error with %q", c.name, err, c.want)
		}
	}
}

// Q8_0 blocks round as ggml's reference does: d = amax/127, values
// round(x/d) with halves away from zero; an all-zero block is all zeros.
func TestQuantizeQ8_0(t *testing.T) {
	x := make([]float32, 32)
	want := make([]int8, 32)
	for i := range x {
		x[i] = float32(i-16) + 0.5 // exact halves: -15.5 -> -16, 2.5 -> 3
		want[i] = int8(i - 16)
		if i >= 16 {
			want[i]++
		}
	}
	x[0], want[0] = -127, -127 // amax 127: d = 1 exactly
	var blk [34]byte
	QuantizeQ8_0(blk[:], x)
	if d := float16.Frombits(binary.LittleEndian.Uint16(blk[:])).Float32(); d != 1 {
		t.Fatalf("scale %g, want 1", d)
	}
	for i := range x {
		if int8(blk[2+i]) != want[i] {
			t.Errorf("q[%d] = %d, want %d", i, int8(blk[2+i]), want[i])
		}
	}
	QuantizeQ8_0(blk[:], make([]float32, 32))
	if !bytes.Equal(blk[:], make([]byte, 34)) {
		t.Errorf("zero block: %v", blk)
	}
}

// TestWriteLoadsOneTensorAtATime: tensors given as Load are read when
// their turn comes, one at a time (each after the previous one is
// written), and the file is the same, byte for byte, as from Data; a Load
// that returns the wrong length is an error naming the tensor.
func TestWriteLoadsOneTensorAtATime(t *testing.T) {
	mk := func(n int, seed float32) []float32 {
		v := make([]float32, n)
		for i := range v {
			v[i] = seed + float32(i)/7
		}
		return v
	}
	plain := []Tensor{{Name: "a", Dims: []uint64{64, 2}, Type: Q8_0, Data: mk(128, 1)}, {Name: "b", Dims: []uint64{5}, Type: F32, Data: mk(5, 2)},
		{Name: "c", Dims: []uint64{3, 4}, Type: F16, Data: mk(12, 3)}}
	var events []string
	lazy := make([]Tensor, len(plain))
	for i, p := range plain {
		lazy[i] = Tensor{Name: p.Name, Dims: p.Dims, Type: p.Type, Load: func() []float32 {
			events = append(events, "load "+p.Name)
			return p.Data
		}}
	}
	var want, got bytes.Buffer
	if err := Write(&want, nil, plain); err != nil {
		t.Fatal(err)
	}
	if err := WriteProgress(&got, nil, lazy, func(done, total int) { events = append(events, fmt.Sprintf("written %d/%d", done, total)) }); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got.Bytes(), want.Bytes()) {
		t.Fatal("the file from Load tensors differs from the one from Data")
	}
	if s := strings.Join(events, ", "); s != "load a, written 1/3, load b, written 2/3, load c, written 3/3" {
		t.Fatalf("events: %s", s)
	}
	lazy[1].Load = func() []float32 { return mk(4, 0) }
	if err := Write(io.Discard, nil, lazy); err == nil || !strings.Contains(err.Error(), `tensor "b" has dims [5] but loaded 4 values`) {
		t.Fatalf("short load: %v", err)
	}
}
