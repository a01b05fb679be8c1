package gguf

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"strconv"

	"github.com/agemem/agemem/model/lora"
	"github.com/agemem/agemem/model/qwen"
	"github.com/agemem/agemem/model/safetensors"
	"github.com/agemem/agemem/model/tokenizer"
)

// Token types of tokenizer.ggml.token_type (llama.h's llama_token_type).
const (
	TokenNormal      int32 = 1
	TokenControl     int32 = 3
	TokenUserDefined int32 = 4
	TokenUnused      int32 = 5
)

// ExportOptions shape a Qwen export.
type ExportOptions struct {
	// Type stores the 2-D weights; norms and biases stay F32 as llama.cpp's
	// converter keeps them. Q8_0 falls back to F16 for a matrix whose rows
	// are not a multiple of 32 values.
	Type Type
	// Name is general.name (default: the directory's base name).
	Name string
}

// Summary says what an export wrote.
type Summary struct {
	Arch    string
	Tensors int
	Params  uint64
	Types   map[Type]int // tensors per type
}

// ExportQwen writes the Qwen2/Qwen3 model in dir as GGUF to w, with the
// metadata keys, tensor names and tokenizer entries llama.cpp's
// convert_hf_to_gguf.py writes and Ollama reads. dir is a Hugging Face
// directory (config.json, tokenizer.json, tokenizer_config.json,
// safetensors) or a PEFT LoRA adapter directory, which is merged into its
// base model first.
func ExportQwen(dir string, w io.Writer, o ExportOptions) (Summary, error) {
	if a, err := lora.Load(dir); err == nil {
		if a.Config.BaseModel == "" {
			return Summary{}, fmt.Errorf("%s/adapter_config.json names no base_model_name_or_path", dir)
		}
		tmp, err := os.MkdirTemp("", "agemem-merge-")
		if err != nil {
			return Summary{}, err
		}
		defer os.RemoveAll(tmp)
		if err := lora.Merge(a.Config.BaseModel, dir, tmp); err != nil {
			return Summary{}, fmt.Errorf("merging adapter %s into %s: %w", dir, a.Config.BaseModel, err)
		}
		if o.Name == "" {
			o.Name = filepath.Base(filepath.Clean(dir))
		}
		dir = tmp
	}
	if o.Name == "" {
		o.Name = filepath.Base(filepath.Clean(dir))
	}
	cfg, err := qwen.LoadConfig(dir)
	if err != nil {
		return Summary{}, err
	}
	if cfg.ModelType != "qwen2" && cfg.ModelType != "qwen3" {
		return Summary{}, fmt.Errorf("%s: model_type %q: only qwen2 and qwen3 export to GGUF", dir, cfg.ModelType)
	}
	tok, err := tokenizer.Load(filepath.Join(dir, "tokenizer.json"))
	if err != nil {
		return Summary{}, err
	}
	tc, err := readTokenizerConfig(dir)
	if err != nil {
		return Summary{}, err
	}
	st, err := safetensors.OpenDir(dir)
	if err != nil {
		return Summary{}, err
	}
	defer st.Close()

	tensors, err := qwenTensors(cfg, st, o.Type)
	if err != nil {
		return Summary{}, fmt.Errorf("%s: %w", dir, err)
	}
	nVocab := cfg.VocabSize
	if emb, ok := st.Tensor("model.embed_tokens.weight"); ok {
		nVocab = emb.Shape[0]
	}
	if nVocab < tok.VocabSize() {
		return Summary{}, fmt.Errorf("%s: the tokenizer has %d ids but the embedding only %d rows", dir, tok.VocabSize(), nVocab)
	}
	kvs, err := qwenMetadata(cfg, tok, tc, nVocab, o)
	if err != nil {
		return Summary{}, fmt.Errorf("%s: %w", dir, err)
	}
	s := Summary{Arch: cfg.ModelType, Tensors: len(tensors), Types: map[Type]int{}}
	for _, t := range tensors {
		s.Params += uint64(len(t.Data))
		s.Types[t.Type]++
	}
	return s, Write(w, kvs, tensors)
}

// ExportQwenFile writes the export to path, through a temporary file that
// is renamed into place, so a failed export leaves no partial file.
func ExportQwenFile(dir, path string, o ExportOptions) (Summary, error) {
	f, err := os.CreateTemp(filepath.Dir(path), ".gguf-*")
	if err != nil {
		return Summary{}, err
	}
	defer os.Remove(f.Name())
	s, err := ExportQwen(dir, f, o)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return Summary{}, err
	}
	return s, os.Rename(f.Name(), path)
}

var layerName = regexp.MustCompile(`^model\.layers\.(\d+)\.(.+)$`)

// ggufNames maps a layer's Hugging Face tensor suffix to its GGUF name.
var ggufNames = map[string]string{
	"input_layernorm.weight":          "attn_norm.weight",
	"self_attn.q_proj.weight":         "attn_q.weight",
	"self_attn.k_proj.weight":         "attn_k.weight",
	"self_attn.v_proj.weight":         "attn_v.weight",
	"self_attn.o_proj.weight":         "attn_output.weight",
	"self_attn.q_proj.bias":           "attn_q.bias",
	"self_attn.k_proj.bias":           "attn_k.bias",
	"self_attn.v_proj.bias":           "attn_v.bias",
	"self_attn.q_norm.weight":         "attn_q_norm.weight",
	"self_attn.k_norm.weight":         "attn_k_norm.weight",
	"post_attention_layernorm.weight": "ffn_norm.weight",
	"mlp.gate_proj.weight":            "ffn_gate.weight",
	"mlp.up_proj.weight":              "ffn_up.weight",
	"mlp.down_proj.weight":            "ffn_down.weight",
}

// GGUFName maps a Hugging Face Qwen tensor name to llama.cpp's; ok is
// false for a name the architecture does not have.
func GGUFName(hf string) (string, bool) {
	switch hf {
	case "model.embed_tokens.weight":
		return "token_embd.weight", true
	case "model.norm.weight":
		return "output_norm.weight", true
	case "lm_head.weight":
		return "output.weight", true
	}
	m := layerName.FindStringSubmatch(hf)
	if m == nil {
		return "", false
	}
	g, ok := ggufNames[m[2]]
	if !ok {
		return "", false
	}
	return "blk." + m[1] + "." + g, true
}

// qwenTensors converts every tensor of the checkpoint, in llama.cpp's
// order (embedding, layers, output), refusing any it cannot place.
func qwenTensors(cfg qwen.Config, st *safetensors.Dir, typ Type) ([]Tensor, error) {
	need := []string{"model.embed_tokens.weight", "model.norm.weight"}
	if !cfg.TieEmbeddings {
		need = append(need, "lm_head.weight")
	}
	for _, n := range need {
		if _, ok := st.Tensor(n); !ok {
			return nil, fmt.Errorf("the checkpoint has no %s", n)
		}
	}
	byGGUF := map[string]string{}
	for _, name := range st.Names() {
		g, ok := GGUFName(name)
		if !ok {
			return nil, fmt.Errorf("tensor %q has no GGUF name for %s", name, cfg.ModelType)
		}
		if name == "lm_head.weight" && cfg.TieEmbeddings {
			continue // tied: llama.cpp reads output from token_embd
		}
		byGGUF[g] = name
	}
	order := []string{"token_embd.weight"}
	for i := range cfg.Layers {
		for _, hf := range []string{"input_layernorm.weight", "self_attn.q_proj.weight", "self_attn.q_proj.bias",
			"self_attn.k_proj.weight", "self_attn.k_proj.bias", "self_attn.v_proj.weight", "self_attn.v_proj.bias",
			"self_attn.o_proj.weight", "self_attn.q_norm.weight", "self_attn.k_norm.weight",
			"post_attention_layernorm.weight", "mlp.gate_proj.weight", "mlp.up_proj.weight", "mlp.down_proj.weight"} {
			order = append(order, "blk."+strconv.Itoa(i)+"."+ggufNames[hf])
		}
	}
	order = append(order, "output_norm.weight", "output.weight")
	var out []Tensor
	for _, g := range order {
		hf, ok := byGGUF[g]
		if !ok {
			continue
		}
		delete(byGGUF, g)
		t, _ := st.Tensor(hf)
		dims := make([]uint64, len(t.Shape))
		for i, d := range t.Shape {
			dims[len(t.Shape)-1-i] = uint64(d)
		}
		tt := typ
		if len(dims) < 2 {
			tt = F32
		} else if tt == Q8_0 && dims[0]%QK8_0 != 0 {
			tt = F16
		}
		out = append(out, Tensor{Name: g, Dims: dims, Type: tt, Data: t.Float32()})
	}
	for g, hf := range byGGUF {
		return nil, fmt.Errorf("tensor %q (%s) is beyond the model's %d layers", hf, g, cfg.Layers)
	}
	return out, nil
}

type tokenizerConfig struct {
	ChatTemplate string
	EOS          string
}

func readTokenizerConfig(dir string) (tokenizerConfig, error) {
	path := filepath.Join(dir, "tokenizer_config.json")
	raw, err := os.ReadFile(path)
	if os.IsNotExist(err) {
		return tokenizerConfig{EOS: "<|im_end|>"}, nil
	}
	if err != nil {
		return tokenizerConfig{}, err
	}
	var f struct {
		ChatTemplate json.RawMessage `json:"chat_template"`
		EOS          json.RawMessage `json:"eos_token"`
	}
	if err := json.Unmarshal(raw, &f); err != nil {
		return tokenizerConfig{}, fmt.Errorf("%s: %w", path, err)
	}
	var tc tokenizerConfig
	// chat_template is a string, or a list of {name, template} of which
	// "default" is the chat one.
	if len(f.ChatTemplate) > 0 && json.Unmarshal(f.ChatTemplate, &tc.ChatTemplate) != nil {
		var named []struct{ Name, Template string }
		if err := json.Unmarshal(f.ChatTemplate, &named); err != nil {
			return tokenizerConfig{}, fmt.Errorf("%s: chat_template is neither a string nor a list of named templates", path)
		}
		for _, n := range named {
			if n.Name == "default" {
				tc.ChatTemplate = n.Template
			}
		}
	}
	// eos_token is a string or an AddedToken object.
	if len(f.EOS) > 0 && json.Unmarshal(f.EOS, &tc.EOS) != nil {
		var obj struct{ Content string }
		if err := json.Unmarshal(f.EOS, &obj); err != nil {
			return tokenizerConfig{}, fmt.Errorf("%s: eos_token is neither a string nor a token object", path)
		}
		tc.EOS = obj.Content
	}
	if tc.EOS == "" {
		tc.EOS = "<|im_end|>"
	}
	return tc, nil
}

func qwenMetadata(cfg qwen.Config, tok *tokenizer.Tokenizer, tc tokenizerConfig, nVocab int, o ExportOptions) ([]KV, error) {
	arch := cfg.ModelType
	u := func(v int) uint32 { return uint32(v) }
	kvs := []KV{
		{"general.architecture", arch},
		{"general.type", "model"},
		{"general.name", o.Name},
		{"general.file_type", o.Type.FileType()},
		{"general.quantization_version", uint32(2)},
		{arch + ".block_count", u(cfg.Layers)},
		{arch + ".context_length", u(cfg.MaxPositions)},
		{arch + ".embedding_length", u(cfg.HiddenSize)},
		{arch + ".feed_forward_length", u(cfg.Intermediate)},
		{arch + ".attention.head_count", u(cfg.Heads)},
		{arch + ".attention.head_count_kv", u(cfg.KVHeads)},
		{arch + ".attention.key_length", u(cfg.HeadDim)},
		{arch + ".attention.value_length", u(cfg.HeadDim)},
		{arch + ".rope.dimension_count", u(cfg.HeadDim)},
		{arch + ".rope.freq_base", float32(cfg.RopeTheta)},
		{arch + ".attention.layer_norm_rms_epsilon", float32(cfg.RMSNormEps)},
	}
	tokens := make([]string, nVocab)
	types := make([]int32, nVocab)
	for id := range nVocab {
		switch s := tok.Token(id); {
		case s == "":
			tokens[id], types[id] = fmt.Sprintf("[PAD%d]", id), TokenUnused
		case tok.IsAdded(id) && tok.IsSpecial(id):
			tokens[id], types[id] = s, TokenControl
		case tok.IsAdded(id):
			tokens[id], types[id] = s, TokenUserDefined
		default:
			tokens[id], types[id] = s, TokenNormal
		}
	}
	merges := tok.Merges()
	ms := make([]string, len(merges))
	for i, m := range merges {
		ms[i] = m[0] + " " + m[1]
	}
	id := func(s string) (uint32, error) {
		i, ok := tok.TokenID(s)
		if !ok {
			return 0, fmt.Errorf("the tokenizer has no %q token", s)
		}
		return uint32(i), nil
	}
	eos, err := id(tc.EOS)
	if err != nil {
		return nil, err
	}
	pad, err := id("<|endoftext|>")
	if err != nil {
		return nil, err
	}
	kvs = append(kvs,
		KV{"tokenizer.ggml.model", "gpt2"},
		KV{"tokenizer.ggml.pre", "qwen2"},
		KV{"tokenizer.ggml.tokens", tokens},
		KV{"tokenizer.ggml.token_type", types},
		KV{"tokenizer.ggml.merges", ms},
		KV{"tokenizer.ggml.eos_token_id", eos},
		KV{"tokenizer.ggml.padding_token_id", pad},
		KV{"tokenizer.ggml.bos_token_id", pad},
		KV{"tokenizer.ggml.add_bos_token", false},
	)
	if tc.ChatTemplate != "" {
		kvs = append(kvs, KV{"tokenizer.chat_template", tc.ChatTemplate})
	}
	return kvs, nil
}
