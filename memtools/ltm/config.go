package ltm

import "github.com/agemem/agemem/internal/valid"

// Config selects the long-term store M (config section "memory").
type Config struct {
	// Store is "sqlite" (durable, one namespace per user) or "memory".
	Store string `yaml:"store"`
	// Path is the SQLite file.
	Path string `yaml:"path"`
	// Namespace is the namespace commands use when none is given.
	Namespace string `yaml:"namespace"`
	// Sync is SQLite's synchronous mode: "normal" survives a killed process,
	// "full" also survives power loss at the cost of one fsync per write.
	Sync string `yaml:"sync"`
	// MaxMetadataBytes and MaxMetadataDepth bound a memory's metadata (its
	// JSON encoding; objects and arrays nested): every write beyond them
	// is refused, so no client stores what other clients cannot parse.
	MaxMetadataBytes int `yaml:"max_metadata_bytes"`
	MaxMetadataDepth int `yaml:"max_metadata_depth"`
}

// Limits are the metadata limits of the config.
func (c Config) Limits() MetadataLimits {
	return MetadataLimits{MaxBytes: c.MaxMetadataBytes, MaxDepth: c.MaxMetadataDepth}
}

// DefaultConfig is a SQLite file under data/.
func DefaultConfig() Config {
	return Config{Store: "sqlite", Path: "data/memory.db", Namespace: "default", Sync: "normal", MaxMetadataBytes: 16 << 10, MaxMetadataDepth: 16}
}

// Validate checks every key.
func (c Config) Validate() error {
	var e valid.Errors
	e.OneOf("store", c.Store, "sqlite", "memory")
	if c.Store == "sqlite" && c.Path == "" {
		e.Add("path", "must name a file when memory.store is sqlite")
	}
	if c.Namespace == "" {
		e.Add("namespace", "must not be empty")
	}
	e.OneOf("sync", c.Sync, "normal", "full")
	e.AtLeast("max_metadata_bytes", c.MaxMetadataBytes, 2)
	e.AtLeast("max_metadata_depth", c.MaxMetadataDepth, 1)
	return e.Err()
}
