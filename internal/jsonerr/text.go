package jsonerr

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strconv"
	"unicode/utf8"
)

// BadText finds the first string (a value or a key) of the JSON document
// raw whose text is not Unicode: bytes that are not UTF-8, or a \u escape
// of half a surrogate pair. encoding/json turns both into U+FFFD without a
// word, so text would be stored other than it was sent. path names the
// value as the document spells it (messages[0].content; a key is named by
// its object's path); ok is false when every string is text (or raw is
// not JSON, which the decoder reports itself).
func BadText(raw []byte) (path string, ok bool) {
	if utf8.Valid(raw) && !bytes.Contains(raw, []byte(`\u`)) && !bytes.Contains(raw, []byte(`\U`)) {
		return "", false
	}
	type level struct {
		array bool
		index int
		key   string
	}
	var stack []level
	where := func() string {
		var b bytes.Buffer
		for _, l := range stack {
			if l.array {
				fmt.Fprintf(&b, "[%d]", l.index-1)
			} else if l.key != "" {
				if b.Len() > 0 {
					b.WriteByte('.')
				}
				b.WriteString(l.key)
			}
		}
		return b.String()
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	expectKey := false
	for {
		start := int(dec.InputOffset())
		tok, err := dec.Token()
		if err != nil {
			return "", false
		}
		top := len(stack) - 1
		// An array's element or an object's value is about to be read.
		if top >= 0 && stack[top].array {
			if d, ok := tok.(json.Delim); !ok || d != ']' {
				stack[top].index++
			}
		}
		switch t := tok.(type) {
		case json.Delim:
			switch t {
			case '{':
				stack = append(stack, level{})
				expectKey = true
				continue
			case '[':
				stack = append(stack, level{array: true})
			case '}', ']':
				stack = stack[:top]
			}
		case string:
			end := int(dec.InputOffset())
			q := bytes.IndexByte(raw[start:end], '"')
			if q >= 0 && !isText(raw[start+q:end]) {
				return where(), true
			}
			if expectKey {
				stack[top].key = t
				expectKey = false
				continue
			}
		}
		if top := len(stack) - 1; top >= 0 && !stack[top].array {
			expectKey = true
		}
	}
}

// isText reports whether a JSON string literal, quotes included, is
// UTF-8 whose escapes pair every surrogate.
func isText(lit []byte) bool {
	if !utf8.Valid(lit) {
		return false
	}
	for i := 0; i+1 < len(lit); i++ {
		if lit[i] != '\\' {
			continue
		}
		if lit[i+1] != 'u' {
			i++ // an escaped character
			continue
		}
		r, ok := hex4(lit[i+2:])
		if !ok {
			return true // malformed: the decoder says so
		}
		switch {
		case r >= 0xdc00 && r <= 0xdfff:
			return false // a low half with no high half before it
		case r >= 0xd800 && r <= 0xdbff:
			lo, ok := rune(0), false
			if i+11 < len(lit) && lit[i+6] == '\\' && lit[i+7] == 'u' {
				lo, ok = hex4(lit[i+8:])
			}
			if !ok || lo < 0xdc00 || lo > 0xdfff {
				return false
			}
			i += 11
		default:
			i += 5
		}
	}
	return true
}

func hex4(b []byte) (rune, bool) {
	if len(b) < 4 {
		return 0, false
	}
	v, err := strconv.ParseUint(string(b[:4]), 16, 32)
	return rune(v), err == nil
}
