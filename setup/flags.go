package setup

import (
	"strconv"
	"strings"

	"github.com/spf13/pflag"
)

// Flags are the --config, --set and --devices flags every agemem command
// shares.
type Flags struct {
	Path    string
	Sets    []string
	Devices string
}

// Register adds the flags to fs.
func (f *Flags) Register(fs *pflag.FlagSet) {
	fs.StringVar(&f.Path, "config", "", "YAML config file (default: built-in defaults, documented in configs/tiny.yaml)")
	fs.StringArrayVar(&f.Sets, "set", nil, "override a config key, e.g. --set tools.filter_threshold=0.5 (repeatable)")
	fs.StringVar(&f.Devices, "devices", "", "train data-parallel on these devices (model.devices): GPU ordinals 0,1 or cuda:N / cpu entries")
}

// Load loads the config the flags name; --devices comes last.
func (f *Flags) Load() (Config, error) {
	sets := f.Sets
	if f.Devices != "" {
		var ds []string
		for _, d := range strings.Split(f.Devices, ",") {
			d = strings.TrimSpace(d)
			if _, err := strconv.Atoi(d); err == nil {
				d = "cuda:" + d
			}
			ds = append(ds, d)
		}
		sets = append(append([]string(nil), sets...), "model.devices=["+strings.Join(ds, ",")+"]")
	}
	return Load(f.Path, sets)
}
