package workbench

import (
	"slices"
	"strings"
	"testing"
)

// FuzzParseAction: any action string parses with an error or as a tool
// call whose keys and values pair up; an action whose values need no
// escaping reads back the same after String writes it, as WorkBench's
// eval reads what its agent wrote. `make test` runs the seeds; `make fuzz`
// explores.
func FuzzParseAction(f *testing.F) {
	f.Add(`calendar.delete_event.func(event_id="00000256")`)
	f.Add(`email.send_email.func(recipient="a@b.com", subject="Hi \"you\"", body="line\nnext \x41 \u00e9")`)
	f.Add(`analytics.get_visitor_information_by_id.func(visitor_id="000", )`)
	f.Add(`x.func(a="\U0010ffff\x", b='single')`)
	f.Fuzz(func(t *testing.T, s string) {
		a, err := ParseAction(s)
		if err != nil {
			return
		}
		if a.Tool == "" || len(a.Keys) != len(a.Vals) {
			t.Fatalf("%q: tool %q, %d keys, %d values", s, a.Tool, len(a.Keys), len(a.Vals))
		}
		for _, v := range a.Vals {
			if strings.ContainsAny(v, "\"\\\n\r") {
				return
			}
		}
		b, err := ParseAction(a.String())
		if err != nil || b.Tool != a.Tool || !slices.Equal(b.Keys, a.Keys) || !slices.Equal(b.Vals, a.Vals) {
			t.Fatalf("%q wrote %q, which reads %+v (%v)", s, a.String(), b, err)
		}
	})
}
