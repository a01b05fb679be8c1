package nestful

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
)

// Args are a call's arguments in the order they were written: NESTFUL's
// scorer passes them to the functions by position in that order, and
// compares values as Python prints them, so numbers keep their literal
// (2 an int, 2.0 a float). Values are json.Number, string, bool, nil,
// []any and Object.
type Args []Arg

// Arg is one argument.
type Arg struct {
	Key   string
	Value any
}

// Object is a JSON object in the order it was written.
type Object []Arg

// Get returns the value of key.
func (a Args) Get(key string) (any, bool) {
	for _, x := range a {
		if x.Key == key {
			return x.Value, true
		}
	}
	return nil, false
}

// UnmarshalJSON reads an object in order; null is no arguments.
func (a *Args) UnmarshalJSON(b []byte) error {
	v, err := decodeOrdered(b)
	if err != nil {
		return err
	}
	switch o := v.(type) {
	case nil:
		*a = nil
	case Object:
		*a = Args(o)
	default:
		return fmt.Errorf("arguments are %s, not an object", kindOf(v))
	}
	return nil
}

// MarshalJSON writes the arguments in their order.
func (a Args) MarshalJSON() ([]byte, error) { return Object(a).MarshalJSON() }

// MarshalJSON writes the object in its order.
func (o Object) MarshalJSON() ([]byte, error) {
	var b bytes.Buffer
	b.WriteByte('{')
	for i, x := range o {
		if i > 0 {
			b.WriteByte(',')
		}
		k, _ := json.Marshal(x.Key)
		v, err := json.Marshal(x.Value)
		if err != nil {
			return nil, err
		}
		b.Write(k)
		b.WriteByte(':')
		b.Write(v)
	}
	b.WriteByte('}')
	return b.Bytes(), nil
}

// decodeOrdered decodes one JSON value keeping numbers as written and
// objects in order, refusing trailing data.
func decodeOrdered(b []byte) (any, error) {
	d := json.NewDecoder(bytes.NewReader(b))
	d.UseNumber()
	v, err := decodeValue(d)
	if err != nil {
		return nil, err
	}
	if _, err := d.Token(); err == nil {
		return nil, errors.New("data after the JSON value")
	}
	return v, nil
}

func decodeValue(d *json.Decoder) (any, error) {
	t, err := d.Token()
	if err != nil {
		return nil, err
	}
	switch t := t.(type) {
	case json.Delim:
		switch t {
		case '{':
			o := Object{}
			for d.More() {
				k, err := d.Token()
				if err != nil {
					return nil, err
				}
				v, err := decodeValue(d)
				if err != nil {
					return nil, err
				}
				o = append(o, Arg{Key: k.(string), Value: v})
			}
			_, err := d.Token()
			return o, err
		case '[':
			l := []any{}
			for d.More() {
				v, err := decodeValue(d)
				if err != nil {
					return nil, err
				}
				l = append(l, v)
			}
			_, err := d.Token()
			return l, err
		}
		return nil, fmt.Errorf("unexpected %v", t)
	}
	return t, nil
}

func kindOf(v any) string {
	switch v.(type) {
	case []any:
		return "a list"
	case string:
		return "a string"
	case json.Number:
		return "a number"
	case bool:
		return "a boolean"
	}
	return fmt.Sprintf("%T", v)
}

// isFloat reports whether a JSON number literal is a float to Python.
func isFloat(n json.Number) bool { return strings.ContainsAny(string(n), ".eE") }

// pyStr is str(v) in Python for a value json.loads made: what NESTFUL's
// scorer writes into "name(arg = value)".
func pyStr(v any) string {
	if s, ok := v.(string); ok {
		return s
	}
	return pyRepr(v)
}

// pyRepr is repr(v) in Python.
func pyRepr(v any) string {
	switch x := v.(type) {
	case nil:
		return "None"
	case bool:
		if x {
			return "True"
		}
		return "False"
	case json.Number:
		if !isFloat(x) {
			return pyInt(string(x))
		}
		f, err := x.Float64()
		if err != nil { // beyond float64: Python makes it inf
			if strings.HasPrefix(string(x), "-") {
				return "-inf"
			}
			return "inf"
		}
		return pyFloat(f)
	case float64:
		return pyFloat(x)
	case string:
		return pyQuote(x)
	case []any:
		parts := make([]string, len(x))
		for i, e := range x {
			parts[i] = pyRepr(e)
		}
		return "[" + strings.Join(parts, ", ") + "]"
	case Object:
		parts := make([]string, len(x))
		for i, e := range x {
			parts[i] = pyQuote(e.Key) + ": " + pyRepr(e.Value)
		}
		return "{" + strings.Join(parts, ", ") + "}"
	}
	return fmt.Sprint(v)
}

// pyInt is an integer literal as Python prints the int ("-0" is "0";
// JSON has no leading zeros or '+').
func pyInt(s string) string {
	if strings.Trim(strings.TrimPrefix(s, "-"), "0") == "" {
		return "0"
	}
	return s
}

// pyFloat is repr(float) in Python: the shortest digits that read back,
// in fixed notation from 1e-4 up to 1e16 (with ".0" when whole), else
// d.ddde±XX.
func pyFloat(f float64) string {
	switch {
	case math.IsInf(f, 1):
		return "inf"
	case math.IsInf(f, -1):
		return "-inf"
	case math.IsNaN(f):
		return "nan"
	}
	e := strconv.FormatFloat(f, 'e', -1, 64) // "-d.ddde±XX"
	sign := ""
	if e[0] == '-' {
		sign, e = "-", e[1:]
	}
	mant, exps, _ := strings.Cut(e, "e")
	exp, _ := strconv.Atoi(exps)
	digits := strings.Replace(mant, ".", "", 1)
	decpt := exp + 1 // digits[:decpt] before the point
	if decpt <= -4 || decpt > 16 {
		m := digits[:1]
		if len(digits) > 1 {
			m += "." + digits[1:]
		}
		es := "+"
		if exp < 0 {
			es, exp = "-", -exp
		}
		return fmt.Sprintf("%s%se%s%02d", sign, m, es, exp)
	}
	switch {
	case decpt <= 0:
		return sign + "0." + strings.Repeat("0", -decpt) + digits
	case decpt >= len(digits):
		return sign + digits + strings.Repeat("0", decpt-len(digits)) + ".0"
	}
	return sign + digits[:decpt] + "." + digits[decpt:]
}

// pyQuote is repr(str) in Python: single quotes unless the text holds one
// and no double quote; backslash, the quote and control characters
// escaped.
func pyQuote(s string) string {
	q := byte('\'')
	if strings.ContainsRune(s, '\'') && !strings.ContainsRune(s, '"') {
		q = '"'
	}
	var b strings.Builder
	b.WriteByte(q)
	for _, r := range s {
		switch {
		case r == '\\':
			b.WriteString(`\\`)
		case r == rune(q):
			b.WriteByte('\\')
			b.WriteByte(q)
		case r == '\n':
			b.WriteString(`\n`)
		case r == '\r':
			b.WriteString(`\r`)
		case r == '\t':
			b.WriteString(`\t`)
		case r < 0x20 || r == 0x7f:
			fmt.Fprintf(&b, `\x%02x`, r)
		default:
			b.WriteRune(r)
		}
	}
	b.WriteByte(q)
	return b.String()
}
