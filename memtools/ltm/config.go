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
}

// DefaultConfig is a SQLite file under data/.
func DefaultConfig() Config {
	return Config{Store: "sqlite", Path: "data/memory.db", Namespace: "default", Sync: "normal"}
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
	return e.Err()
}
