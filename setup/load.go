package setup

import (
	"fmt"
	"os"
	"reflect"
	"slices"
	"sort"
	"strings"
	"time"

	"gopkg.in/yaml.v3"
)

// Load reads path (empty for the defaults alone), applies the overrides
// ("key.path=value", as given to --set) and validates the result.
func Load(path string, overrides []string) (Config, error) {
	return load(path, overrides, nil)
}

// flagValue is a command-line flag's value for the config key it is
// bound to (Flags.Bind).
type flagValue struct {
	flag, key string
	value     *yaml.Node
}

// load is Load with the values of the flags that were set applied after
// the overrides; a problem with a flag's value is reported under the
// flag's name and its key's.
func load(path string, overrides []string, flags []flagValue) (Config, error) {
	var root yaml.Node
	name := path
	if path != "" {
		raw, err := os.ReadFile(path)
		if err != nil {
			return Config{}, fmt.Errorf("config: %w", err)
		}
		if err := yaml.Unmarshal(raw, &root); err != nil {
			return Config{}, fmt.Errorf("config %s: %w", path, err)
		}
	} else {
		name = "defaults"
	}
	doc := documentMapping(&root)
	for _, o := range overrides {
		if err := applySet(doc, o); err != nil {
			return Config{}, err
		}
	}
	for _, f := range flags {
		if err := setNode(doc, f.key, f.value); err != nil {
			return Config{}, fmt.Errorf("--%s: %w", f.flag, err)
		}
	}
	cfg := Default()
	if err := checkKeys(doc, reflect.TypeOf(cfg), "", name); err != nil {
		return Config{}, err
	}
	// checkKeys accepted every key and value above, so a plain decode is safe.
	if err := doc.Decode(&cfg); err != nil {
		return Config{}, fmt.Errorf("config %s: %w", name, err)
	}
	if e := cfg.problems(); len(e) > 0 {
		lines := make([]string, len(e))
		for i, p := range e {
			lines[i] = p.Key + ": " + p.Msg
			for _, f := range flags {
				// A flag's problem reads as its command line does: the
				// messages begin with the value.
				if p.Key == f.key || strings.HasPrefix(p.Key, f.key+"[") {
					lines[i] = "--" + f.flag + " " + p.Msg + " (" + p.Key + ")"
				}
			}
		}
		return Config{}, fmt.Errorf("config %s: invalid config:\n  %s", name, strings.Join(lines, "\n  "))
	}
	return cfg, nil
}

// documentMapping returns the top-level mapping of a parsed document,
// creating one for an empty document.
func documentMapping(root *yaml.Node) *yaml.Node {
	if root.Kind == yaml.DocumentNode && len(root.Content) == 1 {
		return root.Content[0]
	}
	m := &yaml.Node{Kind: yaml.MappingNode, Tag: "!!map"}
	*root = yaml.Node{Kind: yaml.DocumentNode, Content: []*yaml.Node{m}}
	return m
}

// checkKeys walks the YAML mapping beside the Go type and reports the first
// renamed are keys earlier versions read, with what replaced them, so an
// old config's error says what to write.
var renamed = map[string]string{
	"model.shard_optimizer": "model.zero_stage: 1 (moments split; 2 also splits gradients and f32 masters)",
}

// key that has no field, with its full path and the keys that are accepted.
func checkKeys(n *yaml.Node, t reflect.Type, prefix, file string) error {
	if n.Kind == yaml.AliasNode {
		n = n.Alias
	}
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	switch t.Kind() {
	case reflect.Struct:
		if n.Kind != yaml.MappingNode {
			if n.Kind == yaml.ScalarNode && n.Tag == "!!null" {
				return nil
			}
			return fmt.Errorf("config %s: %s must be a mapping", where(file, n), keyName(prefix))
		}
		fields := yamlFields(t)
		for i := 0; i+1 < len(n.Content); i += 2 {
			k, v := n.Content[i], n.Content[i+1]
			path := k.Value
			if prefix != "" {
				path = prefix + "." + k.Value
			}
			f, ok := fields[k.Value]
			if !ok {
				names := make([]string, 0, len(fields))
				for name := range fields {
					names = append(names, name)
				}
				sort.Strings(names)
				msg := fmt.Sprintf("config %s: unknown key %s", where(file, k), path)
				if s, ok := renamed[path]; ok {
					msg += fmt.Sprintf(" (replaced by %s)", s)
				} else if s := closest(k.Value, names); s != "" {
					msg += fmt.Sprintf(" (did you mean %s?)", s)
				}
				return fmt.Errorf("%s; accepted keys here: %s", msg, strings.Join(names, ", "))
			}
			if err := checkKeys(v, f.Type, path, file); err != nil {
				return err
			}
		}
	case reflect.Map:
		// Free-form keys (environment variables, HTTP headers): every key
		// is accepted, every value checked as the element type.
		if n.Kind != yaml.MappingNode {
			if n.Kind == yaml.ScalarNode && n.Tag == "!!null" {
				return nil
			}
			return fmt.Errorf("config %s: %s must be a mapping", where(file, n), keyName(prefix))
		}
		for i := 0; i+1 < len(n.Content); i += 2 {
			k, v := n.Content[i], n.Content[i+1]
			if err := checkKeys(k, t.Key(), prefix+"."+k.Value, file); err != nil {
				return err
			}
			if err := checkKeys(v, t.Elem(), prefix+"."+k.Value, file); err != nil {
				return err
			}
		}
	case reflect.Slice:
		if n.Kind != yaml.SequenceNode {
			return fmt.Errorf("config %s: %s must be a list", where(file, n), keyName(prefix))
		}
		for i, e := range n.Content {
			if err := checkKeys(e, t.Elem(), fmt.Sprintf("%s[%d]", prefix, i), file); err != nil {
				return err
			}
		}
	default:
		// A leaf: decode it alone so a type error names its key.
		if n.Kind != yaml.ScalarNode {
			return fmt.Errorf("config %s: %s must be a single %s value", where(file, n), keyName(prefix), t.Kind())
		}
		if err := n.Decode(reflect.New(t).Interface()); err != nil {
			kind := t.Kind().String()
			if t == reflect.TypeFor[time.Duration]() {
				kind = "duration (such as 30s, 5m or 1h)"
			}
			return fmt.Errorf("config %s: %s: %q is not a valid %s", where(file, n), keyName(prefix), n.Value, kind)
		}
	}
	return nil
}

// where names a node's place: file:line, or --set for a node an override made.
func where(file string, n *yaml.Node) string {
	if n.Line == 0 {
		return "--set"
	}
	return fmt.Sprintf("%s:%d", file, n.Line)
}

func keyName(p string) string {
	if p == "" {
		return "the document"
	}
	return p
}

// yamlFields maps a struct's YAML keys to their fields, the keys of
// inline fields (`yaml:",inline"`) included.
func yamlFields(t reflect.Type) map[string]reflect.StructField {
	out := map[string]reflect.StructField{}
	for i := 0; i < t.NumField(); i++ {
		f := t.Field(i)
		parts := strings.Split(f.Tag.Get("yaml"), ",")
		tag := parts[0]
		if slices.Contains(parts[1:], "inline") {
			for k, v := range yamlFields(f.Type) {
				v.Index = append([]int{i}, v.Index...) // from t, for FieldByIndex
				out[k] = v
			}
			continue
		}
		if tag == "-" || !f.IsExported() {
			continue
		}
		if tag == "" {
			tag = strings.ToLower(f.Name)
		}
		out[tag] = f
	}
	return out
}

// closest returns the accepted key nearest to k by edit distance, if close.
func closest(k string, names []string) string {
	best, bestD := "", 3
	for _, n := range names {
		if d := editDistance(k, n); d < bestD {
			best, bestD = n, d
		}
	}
	return best
}

func editDistance(a, b string) int {
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}

// applySet applies one "a.b.c=value" override to the document. The value is
// parsed as YAML, so "--set embed.char_ngrams=[3,5]" works.
func applySet(doc *yaml.Node, kv string) error {
	key, val, ok := strings.Cut(kv, "=")
	if !ok || key == "" {
		return fmt.Errorf("--set %q: want key.path=value", kv)
	}
	var v yaml.Node
	if err := yaml.Unmarshal([]byte(val), &v); err != nil {
		return fmt.Errorf("--set %s: value %q: %w", key, val, err)
	}
	var value *yaml.Node
	if len(v.Content) == 1 {
		value = v.Content[0]
		fromSet(value)
	} else {
		value = &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!str", Value: val}
	}
	if err := setNode(doc, key, value); err != nil {
		return fmt.Errorf("--set %s: %w", key, err)
	}
	return nil
}

// setNode puts value at the dotted key of the document, making the
// mappings on the way.
func setNode(doc *yaml.Node, key string, value *yaml.Node) error {
	parts := strings.Split(key, ".")
	n := doc
	for i, p := range parts {
		if n.Kind != yaml.MappingNode {
			return fmt.Errorf("%s is not a mapping", strings.Join(parts[:i], "."))
		}
		var next *yaml.Node
		for j := 0; j+1 < len(n.Content); j += 2 {
			if n.Content[j].Value == p {
				next = n.Content[j+1]
				if i == len(parts)-1 {
					n.Content[j+1] = value
				}
				break
			}
		}
		if i == len(parts)-1 {
			if next == nil {
				n.Content = append(n.Content, &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!str", Value: p}, value)
			}
			return nil
		}
		if next == nil {
			next = &yaml.Node{Kind: yaml.MappingNode, Tag: "!!map"}
			n.Content = append(n.Content, &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!str", Value: p}, next)
		}
		n = next
	}
	return nil
}

// fromSet marks n and what it holds as an override's (line 0), so that an
// error in them names --set, not line 1 of the file.
func fromSet(n *yaml.Node) {
	n.Line, n.Column = 0, 0
	for _, c := range n.Content {
		fromSet(c)
	}
}

// YAML renders the config, for `agemem-train config`.
func (c Config) YAML() string {
	out, err := yaml.Marshal(c)
	if err != nil {
		return err.Error()
	}
	return string(out)
}
