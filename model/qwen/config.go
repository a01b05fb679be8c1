// Package qwen is the Qwen2 / Qwen2.5 / Qwen3 decoder: a struct of layers
// loaded from a Hugging Face directory, whose Forward reads like the
// architecture (norm, attention, residual, norm, MLP, residual).
package qwen

import (
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"

	"github.com/agemem/agemem/internal/jsonerr"
)

// Config is the part of config.json the decoder needs.
type Config struct {
	ModelType        string   `json:"model_type"` // qwen2 or qwen3
	HiddenSize       int      `json:"hidden_size"`
	Layers           int      `json:"num_hidden_layers"`
	Heads            int      `json:"num_attention_heads"`
	KVHeads          int      `json:"num_key_value_heads"`
	HeadDim          int      `json:"head_dim"` // Qwen3 sets it; Qwen2 derives it
	Intermediate     int      `json:"intermediate_size"`
	RMSNormEps       float64  `json:"rms_norm_eps"`
	RopeTheta        float64  `json:"rope_theta"`
	TieEmbeddings    bool     `json:"tie_word_embeddings"`
	VocabSize        int      `json:"vocab_size"`
	MaxPositions     int      `json:"max_position_embeddings"`
	AttentionBias    *bool    `json:"attention_bias,omitempty"` // Qwen3; Qwen2 always has q/k/v biases
	BOSTokenID       *int     `json:"bos_token_id,omitempty"`
	EOSTokenID       any      `json:"eos_token_id,omitempty"`
	Architectures    []string `json:"architectures,omitempty"`
	TorchDType       string   `json:"torch_dtype,omitempty"`
	HiddenAct        string   `json:"hidden_act,omitempty"`
	SlidingWindow    any      `json:"sliding_window,omitempty"`
	UseSlidingWindow bool     `json:"use_sliding_window"`
}

// QKVBias reports whether q/k/v projections carry biases.
func (c Config) QKVBias() bool {
	if c.AttentionBias != nil {
		return *c.AttentionBias
	}
	return c.ModelType == "qwen2"
}

// QKNorm reports whether queries and keys are RMS-normalised per head (Qwen3).
func (c Config) QKNorm() bool { return c.ModelType == "qwen3" }

// LoadConfig reads dir/config.json and checks it.
func LoadConfig(dir string) (Config, error) {
	path := filepath.Join(dir, "config.json")
	raw, err := os.ReadFile(path)
	if err != nil {
		return Config{}, err
	}
	var c Config
	if err := json.Unmarshal(raw, &c); err != nil {
		return Config{}, fmt.Errorf("%s: %w", path, jsonerr.Explain(err))
	}
	if c.HeadDim == 0 && c.Heads > 0 {
		c.HeadDim = c.HiddenSize / c.Heads
	}
	if c.RopeTheta == 0 {
		c.RopeTheta = 10000
	}
	if c.RMSNormEps == 0 {
		c.RMSNormEps = 1e-6
	}
	if err := c.Validate(); err != nil {
		return Config{}, fmt.Errorf("%s: %w", path, err)
	}
	return c, nil
}

// Validate checks the shapes agree.
func (c Config) Validate() error {
	switch {
	case c.ModelType != "qwen2" && c.ModelType != "qwen3":
		return fmt.Errorf("model_type %q: want qwen2 or qwen3", c.ModelType)
	case c.HiddenSize <= 0 || c.Layers <= 0 || c.Heads <= 0 || c.KVHeads <= 0 || c.Intermediate <= 0 || c.VocabSize <= 0:
		return fmt.Errorf("hidden_size, num_hidden_layers, num_attention_heads, num_key_value_heads, intermediate_size and vocab_size must be positive")
	case c.Heads%c.KVHeads != 0:
		return fmt.Errorf("num_attention_heads %d is not a multiple of num_key_value_heads %d", c.Heads, c.KVHeads)
	case c.HeadDim <= 0 || c.HeadDim%2 != 0:
		return fmt.Errorf("head_dim %d must be positive and even (rotary pairs)", c.HeadDim)
	case !(c.RMSNormEps > 0) || math.IsInf(c.RMSNormEps, 0):
		return fmt.Errorf("rms_norm_eps %g must be positive (a negative one makes the norm of a quiet token NaN)", c.RMSNormEps)
	case !(c.RopeTheta > 0) || math.IsInf(c.RopeTheta, 0):
		return fmt.Errorf("rope_theta %g must be positive (rotary frequencies are its powers)", c.RopeTheta)
	case c.MaxPositions < 0:
		return fmt.Errorf("max_position_embeddings %d is negative", c.MaxPositions)
	}
	return nil
}

// Linears lists the projections by PEFT module name (model.layers.0.
// self_attn.q_proj) with their (out, in) shapes, as lora.New takes them.
func (c Config) Linears() ([]string, func(string) (int, int, bool)) {
	var names []string
	shapes := map[string][2]int{}
	for _, p := range Params(c) {
		if p.Role == Weight {
			names = append(names, p.Module)
			shapes[p.Module] = [2]int{p.Shape[0], p.Shape[1]}
		}
	}
	return names, func(m string) (int, int, bool) {
		s, ok := shapes[m]
		return s[0], s[1], ok
	}
}
