package tamem

import (
	"fmt"

	"github.com/agemem/agemem/embed"
	"github.com/agemem/agemem/internal/valid"
	"github.com/agemem/agemem/llm"
)

// Config is the "tamem" section: TA-Mem as a run on LoCoMo plays it
// (agemem-train locomo run --method ta-mem).
type Config struct {
	// DB is the memory database (SQLite; ":memory:" for none kept): a
	// conversation it already holds is not extracted again.
	DB string `yaml:"db"`
	// MaxTurns is the retrieval agent's tool-calling turns a question (the
	// paper's 7; its Figure 3 sweeps 1 and up).
	MaxTurns int `yaml:"max_turns"`
	// Parallel questions of a conversation are answered at once (on the
	// native engine their calls decode together).
	Parallel int `yaml:"parallel"`
	// Window is how many messages a page holds when the database is
	// measured with no model (--retrieval-only): fixed windows, no notes.
	Window int `yaml:"window"`
	// Chunking is how a session is cut before extraction.
	Chunking Chunking `yaml:"chunking"`
}

// Chunking is TA-Mem's chunking ablation: llm (the extraction agent
// segments each session itself, the paper's method), fixed (chunks of
// Tokens words overlapping by the share Overlap, the paper's 512 and 25%)
// or semantic (split where neighbouring messages' similarity falls below
// the Percentile of the session's, the paper's 8th); each chunk is then
// extracted into one note.
type Chunking struct {
	Kind       string  `yaml:"kind"`
	Tokens     int     `yaml:"tokens"`
	Overlap    float64 `yaml:"overlap"`
	Percentile float64 `yaml:"percentile"`
}

// DefaultConfig is the paper's setting.
func DefaultConfig() Config {
	return Config{DB: ":memory:", MaxTurns: MaxTurns, Parallel: 4, Window: 1,
		Chunking: Chunking{Kind: "llm", Tokens: 512, Overlap: 0.25, Percentile: 8}}
}

// Validate checks every key.
func (c Config) Validate() error {
	var e valid.Errors
	if c.DB == "" {
		e.Add("db", `"": want a SQLite file, or ":memory:"`)
	}
	for _, k := range []struct {
		key string
		v   int
	}{{"max_turns", c.MaxTurns}, {"parallel", c.Parallel}, {"window", c.Window}, {"chunking.tokens", c.Chunking.Tokens}} {
		if k.v < 1 {
			e.Add(k.key, "%d: want at least 1", k.v)
		}
	}
	ch := c.Chunking
	e.OneOf("chunking.kind", ch.Kind, "llm", "fixed", "semantic")
	if !(ch.Overlap >= 0 && ch.Overlap < 1) {
		e.Add("chunking.overlap", "%g: want the share of a chunk the next repeats, in [0, 1)", ch.Overlap)
	}
	if !(ch.Percentile >= 0 && ch.Percentile <= 100) {
		e.Add("chunking.percentile", "%g: want a percentile in [0, 100]", ch.Percentile)
	}
	return e.Err()
}

// Extractor is the chunking's extractor on m (emb measures the semantic
// chunking's similarity), and the suffix its pages' namespace gets: a
// database keeps each chunking's pages apart.
func (c Chunking) Extractor(m llm.Model, emb embed.Embedder) (Extractor, string) {
	switch c.Kind {
	case "fixed":
		return ChunkExtractor(m, FixedChunks(c.Tokens, c.Overlap, Words)), fmt.Sprintf("/fixed-%d-%g", c.Tokens, c.Overlap)
	case "semantic":
		return ChunkExtractor(m, SemanticChunks(emb, c.Percentile)), fmt.Sprintf("/semantic-%g", c.Percentile)
	}
	return ModelExtractor(m), ""
}
