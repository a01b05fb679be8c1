package jsonerr

import (
	"encoding/json"
	"errors"
	"testing"
)

type inner struct {
	Role string `json:"role"`
}

type doc struct {
	Temperature *float64 `json:"temperature"`
	N           int      `json:"n"`
	Stream      bool     `json:"stream"`
	Messages    []struct {
		inner
		Tags map[string]string `json:"tags"`
	} `json:"messages"`
}

// TestTypeNamesFieldAndKinds: each mistyped value is named by its path in
// the document, with the JSON it holds and the JSON that belongs there; an
// embedded struct's Go name is not in the path; other errors are not ours.
func TestTypeNamesFieldAndKinds(t *testing.T) {
	for _, c := range []struct{ body, field, msg string }{
		{`[1]`, "", "a JSON array stands where an object belongs"},
		{`{"temperature": "hot"}`, "temperature", "temperature is a JSON string where a number belongs"},
		{`{"n": 1.5}`, "n", "n is a JSON number 1.5 where an integer belongs"},
		{`{"stream": "yes"}`, "stream", "stream is a JSON string where true or false belongs"},
		{`{"messages": {}}`, "messages", "messages is a JSON object where an array belongs"},
		{`{"messages": [{"role": 3}]}`, "messages.role", "messages.role is a JSON number where a string belongs"},
		{`{"messages": [{"tags": []}]}`, "messages.tags", "messages.tags is a JSON array where an object belongs"},
	} {
		var d doc
		err := json.Unmarshal([]byte(c.body), &d)
		field, msg, ok := Type(err, "inner")
		if !ok || field != c.field || msg != c.msg {
			t.Errorf("%s: %q %q %v, want %q %q", c.body, field, msg, ok, c.field, c.msg)
		}
	}
	var d doc
	if _, _, ok := Type(json.Unmarshal([]byte(`{"n": `), &d)); ok {
		t.Error("a syntax error taken for a type error")
	}
	if _, _, ok := Type(errors.New("other")); ok {
		t.Error("another error taken for a type error")
	}
}

// TestExplain: a type error becomes Type's message; any other error passes
// through unchanged.
func TestExplain(t *testing.T) {
	var d doc
	if err := Explain(json.Unmarshal([]byte(`{"n": "2"}`), &d)); err == nil || err.Error() != "n is a JSON string where an integer belongs" {
		t.Errorf("type error: %v", err)
	}
	other := errors.New("other")
	if Explain(other) != other {
		t.Error("another error changed")
	}
}
