package embed

import (
	"fmt"

	"github.com/agemem/agemem/internal/valid"
)

// Config selects the encoder enc(.) of Eq. 8-10 and 15 (config section
// "embed").
type Config struct {
	// Backend is "hashing" (deterministic feature hashing, no weights),
	// "encoder" (the BERT-family encoder in Path), "ollama" (Model on the
	// ollama server) or "openai" (Model on the OpenAI-compatible server).
	// Dim is the hashing dimension; the others have their model's.
	Backend string `yaml:"backend"`
	// Model is the embedding model (backends ollama and openai).
	Model string `yaml:"model"`
	// Path is the encoder's Hugging Face directory (backend encoder), the
	// output of agemem-train embed train or a BERT checkpoint.
	Path string `yaml:"path"`
	// Pooling is the encoder's sentence vector: cls | cls_mlp | mean.
	Pooling string `yaml:"pooling"`
	// BatchTokens bounds the tokens of one encoder batch.
	BatchTokens int `yaml:"batch_tokens"`
	// Device runs the encoder's batches and the cosine top-k of large
	// memory indexes (at least DeviceMinFloats): auto | cpu | cuda | cuda:N.
	Device string `yaml:"device"`
	// Dim is the embedding dimension.
	Dim int `yaml:"dim"`
	// CharNgrams are the character n-gram lengths hashed besides words.
	CharNgrams []int `yaml:"char_ngrams"`
}

// DefaultConfig is feature hashing at 384 dimensions.
func DefaultConfig() Config {
	return Config{Backend: "hashing", Dim: 384, CharNgrams: []int{3, 4}, Pooling: "mean", BatchTokens: 8192, Device: "auto"}
}

// Validate checks every key.
func (c Config) Validate() error {
	var e valid.Errors
	e.OneOf("backend", c.Backend, "hashing", "encoder", "ollama", "openai")
	if c.Backend == "encoder" && c.Path == "" {
		e.Add("path", "must name the encoder directory when embed.backend is encoder")
	}
	e.OneOf("pooling", c.Pooling, "cls", "cls_mlp", "mean")
	e.AtLeast("batch_tokens", c.BatchTokens, 16)
	if (c.Backend == "ollama" || c.Backend == "openai") && c.Model == "" {
		e.Add("model", "must name an embedding model (for example nomic-embed-text) when embed.backend is %s", c.Backend)
	}
	if c.Dim < 8 || c.Dim > 65536 {
		e.Add("dim", "%d is outside [8, 65536]", c.Dim)
	}
	for i, n := range c.CharNgrams {
		if n < 1 || n > 8 {
			e.Add(fmt.Sprintf("char_ngrams[%d]", i), "%d is outside [1, 8]", n)
		}
	}
	e.Device("device", c.Device, true)
	return e.Err()
}

// Hashing is the hashing embedder of the config's dimension and n-grams
// (what every other backend falls back to where no model is loaded).
func (c Config) Hashing() *Hashing { return NewHashing(c.Dim, c.CharNgrams) }
