package memtool

import (
	"encoding/json"
	"math"
	"regexp/syntax"
	"strconv"
	"strings"
)

// ExampleArguments are arguments that satisfy a tool's JSON Schema, as the
// oracle calls a tool: every required property given, from the schema's
// own example when it has one (StableToolBench's "example_value", "default",
// "examples", "const", the first of an "enum"), else the smallest value of
// its type within its bounds (a string matching its pattern). Optional
// properties are left out. A schema it cannot read gives "{}".
func ExampleArguments(schema json.RawMessage) string {
	var s map[string]any
	if json.Unmarshal(schema, &s) != nil || s == nil {
		return "{}"
	}
	v := sampleValue(s, 0)
	if _, ok := v.(map[string]any); !ok {
		v = map[string]any{}
	}
	b, err := json.Marshal(v)
	if err != nil {
		return "{}"
	}
	return string(b)
}

// sampleValue is a value of schema s; depth bounds recursive schemas.
func sampleValue(s map[string]any, depth int) any {
	typ, _ := s["type"].(string)
	if list, ok := s["type"].([]any); ok {
		for _, t := range list {
			if ts, _ := t.(string); ts != "null" && ts != "" {
				typ = ts
				break
			}
		}
	}
	if typ == "" {
		if _, ok := s["properties"]; ok {
			typ = "object"
		}
	}
	var examples []any
	for _, k := range []string{"example_value", "const", "default"} {
		if v, ok := s[k]; ok {
			examples = append(examples, v)
		}
	}
	if ex, ok := s["examples"].([]any); ok && len(ex) > 0 {
		examples = append(examples, ex[0])
	}
	if en, ok := s["enum"].([]any); ok && len(en) > 0 {
		examples = append(examples, en[0])
	}
	for _, v := range examples {
		if c, ok := coerce(v, typ); ok {
			return c
		}
	}
	for _, k := range []string{"anyOf", "oneOf", "allOf"} {
		if alts, ok := s[k].([]any); ok {
			for _, a := range alts {
				if as, ok := a.(map[string]any); ok && as["type"] != "null" {
					if k != "allOf" {
						return sampleValue(as, depth+1)
					}
					// allOf: the first part that says what the value is.
					if _, typed := as["type"]; typed {
						return sampleValue(as, depth+1)
					}
				}
			}
		}
	}
	num := func(key string) (float64, bool) {
		f, ok := s[key].(float64)
		return f, ok
	}
	switch typ {
	case "object":
		out := map[string]any{}
		if depth > 8 {
			return out
		}
		props, _ := s["properties"].(map[string]any)
		req, _ := s["required"].([]any)
		for _, r := range req {
			name, _ := r.(string)
			ps, _ := props[name].(map[string]any)
			if ps == nil {
				ps = map[string]any{"type": "string"}
			}
			out[name] = sampleValue(ps, depth+1)
		}
		return out
	case "array":
		n, _ := num("minItems")
		items, _ := s["items"].(map[string]any)
		if items == nil {
			items = map[string]any{"type": "string"}
		}
		out := []any{}
		for range max(int(n), 1) {
			out = append(out, sampleValue(items, depth+1))
		}
		return out
	case "integer", "number":
		v := 1.0
		if lo, ok := num("minimum"); ok {
			v = math.Max(v, lo)
		}
		if lo, ok := num("exclusiveMinimum"); ok && v <= lo {
			v = math.Floor(lo) + 1
		}
		if hi, ok := num("maximum"); ok {
			v = math.Min(v, hi)
		}
		if typ == "integer" {
			v = math.Ceil(v)
		}
		return v
	case "boolean":
		return true
	case "null":
		return nil
	}
	str := "example"
	if p, ok := s["pattern"].(string); ok {
		if m, ok := matching(p); ok {
			str = m
		}
	}
	if f, _ := s["format"].(string); f == "uri" || f == "url" {
		str = "https://example.com"
	}
	if lo, ok := num("minLength"); ok && len(str) < int(lo) {
		str += strings.Repeat("x", int(lo)-len(str))
	}
	if hi, ok := num("maxLength"); ok && len(str) > int(hi) {
		str = str[:int(hi)]
	}
	return str
}

// coerce is an example value as the schema's type wants it (ToolBench
// writes numbers' and booleans' examples as strings); ok is false for an
// empty or unfitting one.
func coerce(v any, typ string) (any, bool) {
	if v == nil || v == "" {
		return nil, false
	}
	str, isStr := v.(string)
	switch typ {
	case "integer", "number":
		if f, ok := v.(float64); ok {
			return f, typ == "number" || f == math.Trunc(f)
		}
		if isStr {
			f, err := strconv.ParseFloat(strings.TrimSpace(str), 64)
			return f, err == nil && (typ == "number" || f == math.Trunc(f))
		}
		return nil, false
	case "boolean":
		if b, ok := v.(bool); ok {
			return b, true
		}
		if b, err := strconv.ParseBool(strings.TrimSpace(str)); isStr && err == nil {
			return b, true
		}
		return nil, false
	case "string":
		if isStr {
			return str, true
		}
		if f, ok := v.(float64); ok {
			return strconv.FormatFloat(f, 'f', -1, 64), true
		}
		return nil, false
	case "array":
		_, ok := v.([]any)
		return v, ok
	case "object":
		_, ok := v.(map[string]any)
		return v, ok
	}
	return v, true
}

// matching is a short string that the regular expression p matches
// (unanchored patterns match it too): the first alternative, the fewest
// repeats, each class's first character.
func matching(p string) (string, bool) {
	re, err := syntax.Parse(p, syntax.Perl)
	if err != nil {
		return "", false
	}
	var b strings.Builder
	ok := true
	var walk func(r *syntax.Regexp)
	walk = func(r *syntax.Regexp) {
		switch r.Op {
		case syntax.OpLiteral:
			b.WriteString(string(r.Rune))
		case syntax.OpCharClass:
			if len(r.Rune) > 0 {
				b.WriteRune(r.Rune[0])
			}
		case syntax.OpAnyChar, syntax.OpAnyCharNotNL:
			b.WriteByte('a')
		case syntax.OpCapture:
			walk(r.Sub[0])
		case syntax.OpPlus:
			walk(r.Sub[0])
		case syntax.OpRepeat:
			for range r.Min {
				walk(r.Sub[0])
			}
		case syntax.OpConcat:
			for _, s := range r.Sub {
				walk(s)
			}
		case syntax.OpAlternate:
			walk(r.Sub[0])
		case syntax.OpStar, syntax.OpQuest, syntax.OpEmptyMatch, syntax.OpBeginLine, syntax.OpEndLine,
			syntax.OpBeginText, syntax.OpEndText, syntax.OpWordBoundary, syntax.OpNoWordBoundary:
		default:
			ok = false
		}
	}
	walk(re)
	return b.String(), ok
}
