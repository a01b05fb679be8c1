package jsonerr

import "testing"

// TestBadText names the first string that is not Unicode text, by its
// path, and passes documents whose strings all are.
func TestBadText(t *testing.T) {
	for _, c := range []struct {
		doc, path string
		bad       bool
	}{
		{`{"messages": [{"role": "user", "content": "ok"}]}`, "", false},
		{`{"a": "caf\u00e9 \ud83e\udde0 記憶"}`, "", false},
		{"{\"messages\": [{\"role\": \"user\", \"content\": \"hi \xff\"}]}", "messages[0].content", true},
		{"{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}, {\"role\": \"user\", \"content\": \"\xc3\"}]}", "messages[1].content", true},
		{`{"metadata": {"k": ["a", "\ud800"]}}`, "metadata.k[1]", true},
		{`{"content": "\udc00 alone"}`, "content", true},
		{`{"content": "\ud800\u0041"}`, "content", true},
		{"{\"metadata\": {\"\xfe\": 1}}", "metadata", true},
		{"[\"a\", \"\xff\"]", "[1]", true},
		{`{"a": {"b": 1}, "c": "\\ud800 is escaped text"}`, "", false},
	} {
		path, bad := BadText([]byte(c.doc))
		if bad != c.bad || path != c.path {
			t.Errorf("%q: %q %v, want %q %v", c.doc, path, bad, c.path, c.bad)
		}
	}
}
