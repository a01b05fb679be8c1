package workbench

import (
	"encoding/json"
	"fmt"
	"regexp"
	"sort"
	"strconv"
	"strings"
)

// Action is one tool call as WorkBench writes and scores it:
// `calendar.delete_event.func(event_id="00000256")`, the arguments in
// their order.
type Action struct {
	Tool string
	Keys []string
	Vals []string
}

// Args are the action's arguments by name.
func (a Action) Args() Args {
	m := make(Args, len(a.Keys))
	for i, k := range a.Keys {
		m[k] = a.Vals[i]
	}
	return m
}

// String writes the action as WorkBench does
// (convert_agent_action_to_function_call): each value between double
// quotes as it stands.
func (a Action) String() string {
	var b strings.Builder
	b.WriteString(a.Tool + ".func(")
	for i, k := range a.Keys {
		if i > 0 {
			b.WriteString(", ")
		}
		fmt.Fprintf(&b, `%s="%s"`, k, a.Vals[i])
	}
	b.WriteString(")")
	return b.String()
}

var (
	actionRe = regexp.MustCompile(`^\s*([A-Za-z_][\w.]*)\.func\((.*)\)\s*$`)
	argRe    = regexp.MustCompile(`^\s*([A-Za-z_]\w*)\s*=\s*"((?:[^"\\]|\\.)*)"\s*(,|$)`)
)

// ParseAction reads an action string as WorkBench's eval would run it:
// keyword arguments of double-quoted Python strings (escapes
// interpreted). What eval could not run (a value with a bare double quote
// in it, anything but keyword strings) is an error: WorkBench skips such
// an action.
func ParseAction(s string) (Action, error) {
	m := actionRe.FindStringSubmatch(s)
	if m == nil {
		return Action{}, fmt.Errorf("not a tool call: %q", s)
	}
	a := Action{Tool: m[1]}
	rest := m[2]
	for strings.TrimSpace(rest) != "" {
		am := argRe.FindStringSubmatchIndex(rest)
		if am == nil {
			return Action{}, fmt.Errorf("%s: arguments %q are not keyword strings", a.Tool, rest)
		}
		v, err := unquotePython(rest[am[4]:am[5]])
		if err != nil {
			return Action{}, fmt.Errorf("%s: %w", a.Tool, err)
		}
		a.Keys = append(a.Keys, rest[am[2]:am[3]])
		a.Vals = append(a.Vals, v)
		rest = rest[am[1]:]
	}
	return a, nil
}

// unquotePython interprets the escapes of a Python string literal's body.
func unquotePython(s string) (string, error) {
	if !strings.Contains(s, `\`) {
		return s, nil
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] != '\\' || i+1 == len(s) {
			b.WriteByte(s[i])
			continue
		}
		i++
		switch c := s[i]; c {
		case 'n':
			b.WriteByte('\n')
		case 't':
			b.WriteByte('\t')
		case 'r':
			b.WriteByte('\r')
		case '\\', '\'', '"':
			b.WriteByte(c)
		case '\n':
		case 'x', 'u', 'U':
			n := map[byte]int{'x': 2, 'u': 4, 'U': 8}[c]
			if i+1+n > len(s) {
				return "", fmt.Errorf(`truncated \%c escape`, c)
			}
			r, err := strconv.ParseUint(s[i+1:i+1+n], 16, 32)
			if err != nil {
				return "", fmt.Errorf(`bad \%c escape`, c)
			}
			b.WriteRune(rune(r))
			i += n
		default:
			b.WriteByte('\\') // Python keeps unknown escapes as written
			b.WriteByte(c)
		}
	}
	return b.String(), nil
}

// PyValue is how WorkBench's agent writes an argument the model gave:
// Python's str() of the value (JSON's true is True, null None, 60 is 60).
func PyValue(v any) string {
	switch x := v.(type) {
	case string:
		return x
	case nil:
		return "None"
	case json.Number:
		return x.String() // as the model wrote it: 60 or 60.0
	case bool:
		if x {
			return "True"
		}
		return "False"
	case float64:
		if x == float64(int64(x)) && !strings.ContainsAny(strconv.FormatFloat(x, 'g', -1, 64), "e") {
			return strconv.FormatInt(int64(x), 10)
		}
		return strconv.FormatFloat(x, 'g', -1, 64)
	case []any:
		parts := make([]string, len(x))
		for i, e := range x {
			parts[i] = pyRepr(e)
		}
		return "[" + strings.Join(parts, ", ") + "]"
	case map[string]any:
		keys := make([]string, 0, len(x))
		for k := range x {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		parts := make([]string, len(keys))
		for i, k := range keys {
			parts[i] = pyRepr(k) + ": " + pyRepr(x[k])
		}
		return "{" + strings.Join(parts, ", ") + "}"
	}
	return fmt.Sprint(v)
}

func pyRepr(v any) string {
	if s, ok := v.(string); ok {
		return "'" + strings.ReplaceAll(strings.ReplaceAll(s, `\`, `\\`), "'", `\'`) + "'"
	}
	return PyValue(v)
}
