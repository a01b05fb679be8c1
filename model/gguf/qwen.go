package gguf

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"

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
	// Progress, if set, is called after each tensor is written.
	Progress func(done, total int)
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
	nVocab := cfg.VocabSize // the embedding's rows, checked by qwenTensors
	if nVocab < tok.VocabSize() {
		return Summary{}, fmt.Errorf("%s: the tokenizer has %d ids but the embedding only %d rows", dir, tok.VocabSize(), nVocab)
	}
	kvs, err := qwenMetadata(cfg, tok, tc, nVocab, o)
	if err != nil {
		return Summary{}, fmt.Errorf("%s: %w", dir, err)
	}
	s := Summary{Arch: cfg.ModelType, Tensors: len(tensors), Types: map[Type]int{}}
	for _, t := range tensors {
		s.Params += t.Len()
		s.Types[t.Type]++
	}
	return s, WriteProgress(w, kvs, tensors, o.Progress)
}

// ExportQwenFile writes the export to path (making its directory),
// through a temporary file that is renamed into place, so a failed export
// leaves no partial file.
func ExportQwenFile(dir, path string, o ExportOptions) (Summary, error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return Summary{}, err
	}
	f, err := os.CreateTemp(filepath.Dir(path), ".gguf-*")
	if err != nil {
		return Summary{}, err
	}
	defer os.Remove(f.Name())
	s, err := ExportQwen(dir, f, o)
	if err == nil {
		err = f.Sync()
	}
	if err == nil {
		// CreateTemp makes the file 0600; a model file is for others to
		// read (an Ollama server running as its own user), as a plain
		// os.Create would leave it under the usual umask.
		err = f.Chmod(0o644)
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return Summary{}, err
	}
	return s, os.Rename(f.Name(), path)
}

// qwenTensors converts every tensor of the checkpoint, in the declaration's
// order (embedding, layers, output: llama.cpp's), under llama.cpp's names,
// refusing any the architecture does not have.
func qwenTensors(cfg qwen.Config, st *safetensors.Dir, typ Type) ([]Tensor, error) {
	left := map[string]bool{}
	for _, n := range st.Names() {
		left[n] = true
	}
	var out []Tensor
	for _, p := range qwen.Params(cfg) {
		t, ok := st.Tensor(p.Name)
		if !ok {
			return nil, fmt.Errorf("the checkpoint has no %s", p.Name)
		}
		if !slices.Equal(t.Shape, p.Shape) {
			return nil, fmt.Errorf("tensor %q has shape %v, config.json implies %v", p.Name, t.Shape, p.Shape)
		}
		delete(left, p.Name)
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
		// Converted when written: the mapped file is read one tensor at a
		// time, so exporting a 7B model does not hold it in float32.
		out = append(out, Tensor{Name: p.GGUF, Dims: dims, Type: tt, Load: t.Float32})
	}
	if cfg.TieEmbeddings {
		// A tied checkpoint may still hold a copy of the head: llama.cpp
		// reads output from token_embd, so it is left out.
		untied := cfg
		untied.TieEmbeddings = false
		for _, p := range qwen.Params(untied) {
			if p.Role == qwen.Head {
				delete(left, p.Name)
			}
		}
	}
	for _, n := range st.Names() {
		if left[n] {
			return nil, fmt.Errorf("tensor %q is not part of a %d-layer %s model", n, cfg.Layers, cfg.ModelType)
		}
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
	// llama.cpp and Ollama cut a qwen2 or qwen3 model's text with Qwen's
	// regex whatever the file says; a model trained on ids cut another way
	// would read ids it never saw. Refused, as llama.cpp's converter
	// refuses a pre-tokenizer it does not recognise.
	if p := tok.Pattern(); p != tokenizer.QwenPattern {
		what := fmt.Sprintf("the pre-tokenizer regex %q", p)
		if p == "" {
			what = "GPT-2's ByteLevel pre-tokenizer"
		}
		return nil, fmt.Errorf("tokenizer.json cuts text with %s, but llama.cpp and Ollama cut a %s model's text with Qwen's regex (tokenizer.ggml.pre qwen2), so the exported model would read token ids it was not trained on; export a model whose tokenizer uses Qwen's regex (agemem-train tokenizer train --pretokenizer qwen)", what, cfg.ModelType)
	}
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
