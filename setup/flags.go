package setup

import (
	"fmt"
	"reflect"
	"strconv"
	"strings"

	"github.com/spf13/pflag"
	"gopkg.in/yaml.v3"
)

// Flags are the --config, --set and --devices flags every agemem command
// shares, and the flags of a command that override config keys.
type Flags struct {
	Path    string
	Sets    []string
	Devices string
	bound   []binding
}

// binding is a flag of a command's flag set that overrides a config key.
type binding struct {
	fs        *pflag.FlagSet
	flag, key string
}

// Register adds the flags to fs.
func (f *Flags) Register(fs *pflag.FlagSet) {
	fs.StringVar(&f.Path, "config", "", "YAML config file (default: built-in defaults, documented in configs/tiny.yaml)")
	fs.StringArrayVar(&f.Sets, "set", nil, "override a config key, e.g. --set tools.filter_threshold=0.5 (repeatable)")
	fs.StringVar(&f.Devices, "devices", "", "train data-parallel on these devices (model.devices): GPU ordinals 0,1 or cuda:N / cpu entries")
}

// Bind makes the flag of fs an override of the config key: given on the
// command line, its value replaces the key's from the file and from
// --set, and a problem with it is reported under the flag's name and the
// key's. A flag that is not given leaves the key as it is. Bind may be
// called up to the Load it applies to (a command whose flag means one
// key or another binds it when it knows which).
func (f *Flags) Bind(fs *pflag.FlagSet, flag, key string) {
	if fs.Lookup(flag) == nil {
		panic(fmt.Sprintf("setup: bind --%s: no such flag", flag))
	}
	if _, ok := fieldAt(reflect.ValueOf(Default()), key); !ok {
		panic(fmt.Sprintf("setup: bind --%s: no config key %s", flag, key))
	}
	f.bound = append(f.bound, binding{fs, flag, key})
}

// Flag defines the flag of fs that overrides the config key and binds it:
// its type and default are the key's (Default()), its usage names the key.
// A list key takes a repeatable flag.
func (f *Flags) Flag(fs *pflag.FlagSet, flag, key, usage string) {
	v, ok := fieldAt(reflect.ValueOf(Default()), key)
	if !ok {
		panic(fmt.Sprintf("setup: flag --%s: no config key %s", flag, key))
	}
	usage += " (" + key + ")"
	switch x := v.Interface().(type) {
	case string:
		fs.String(flag, x, usage)
	case int:
		fs.Int(flag, x, usage)
	case float64:
		fs.Float64(flag, x, usage)
	case bool:
		fs.Bool(flag, x, usage)
	case []string:
		fs.StringArray(flag, x, usage)
	default:
		panic(fmt.Sprintf("setup: flag --%s: key %s is a %T", flag, key, x))
	}
	f.Bind(fs, flag, key)
}

// Load loads the config the flags name; --devices comes after --set, and
// the bound flags that were given last.
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
	var given []flagValue
	for _, b := range f.bound {
		if b.fs.Changed(b.flag) {
			given = append(given, flagValue{b.flag, b.key, valueNode(b.fs.Lookup(b.flag).Value)})
		}
	}
	return load(f.Path, sets, given)
}

// valueNode is a flag's value as the YAML it stands for: a string as a
// string, whatever it reads as; a list (repeated or comma-separated) as a
// sequence of strings; a number or a bool as written.
func valueNode(v pflag.Value) *yaml.Node {
	if l, ok := v.(pflag.SliceValue); ok {
		seq := &yaml.Node{Kind: yaml.SequenceNode, Tag: "!!seq"}
		for _, s := range l.GetSlice() {
			seq.Content = append(seq.Content, &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!str", Value: strings.TrimSpace(s)})
		}
		return seq
	}
	n := &yaml.Node{Kind: yaml.ScalarNode, Value: v.String()}
	if v.Type() == "string" {
		n.Tag = "!!str"
	}
	return n
}

// fieldAt is the field of a config value at a dotted key.
func fieldAt(v reflect.Value, key string) (reflect.Value, bool) {
	for _, p := range strings.Split(key, ".") {
		if v.Kind() != reflect.Struct {
			return v, false
		}
		f, ok := yamlFields(v.Type())[p]
		if !ok {
			return v, false
		}
		v = v.FieldByIndex(f.Index)
	}
	return v, true
}
