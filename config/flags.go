package config

import "github.com/spf13/pflag"

// Flags are the --config and --set flags every agemem command shares.
type Flags struct {
	Path string
	Sets []string
}

// Register adds the flags to fs.
func (f *Flags) Register(fs *pflag.FlagSet) {
	fs.StringVar(&f.Path, "config", "", "YAML config file (default: built-in defaults, documented in configs/tiny.yaml)")
	fs.StringArrayVar(&f.Sets, "set", nil, "override a config key, e.g. --set tools.filter_threshold=0.5 (repeatable)")
}

// Load loads the config the flags name.
func (f *Flags) Load() (Config, error) { return Load(f.Path, f.Sets) }
