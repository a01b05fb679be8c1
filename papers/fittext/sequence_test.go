package fittext

import (
	"math"
	"strings"
	"testing"
)

// SequenceRatio against Python's difflib.SequenceMatcher(None, a, b).ratio()
// (Python 3, values printed by it): short strings, code points, and strings
// of 200 characters or more, where autojunk makes the ratio asymmetric.
func TestSequenceRatioMatchesDifflib(t *testing.T) {
	longA := strings.Repeat("Search the email inbox for messages whose subject or body contains the given keywords and return their ids, senders and dates. ", 2)
	longB := strings.Repeat("Search emails in the inbox by a keyword in the subject or the body; returns each matching email's id, sender and date, newest first. ", 2)
	for _, c := range []struct {
		a, b string
		want float64
	}{
		{"", "", 1},
		{"abc", "", 0},
		{"abcd", "bcde", 0.75},
		{"get the weather forecast", "get weather forecast for a city", 0.7272727272727273},
		{"Retrieve the 5-day weather forecast for a city", "retrieve the five day forecast of a city's weather", 0.6875},
		{"qabxcd", "abycdf", 0.6666666666666666},
		{"private Thread currentThread;", "private volatile Thread currentThread;", 0.8656716417910447},
		{"héllo wörld", "hello world", 0.8181818181818182},
		{longA, longB, 0.06923076923076923},
		{longB, longA, 0.19230769230769232},
		{strings.Repeat("aaaa bbbb ", 30), strings.Repeat("aaab bbba ", 30), 0.01},
	} {
		if got := SequenceRatio(c.a, c.b); math.Abs(got-c.want) > 1e-12 {
			t.Errorf("SequenceRatio(%.30q, %.30q) = %v, difflib %v", c.a, c.b, got, c.want)
		}
	}
	m := Probes{{Intent: "private volatile Thread currentThread;"}, {Intent: "send an email to a recipient with a subject and a body"}}
	for d, want := range map[string]bool{
		"private Thread currentThread;": true,  // ratio 0.866
		"an email to a recipient":       true,  // contained
		"get the weather forecast":      false, // neither
	} {
		if _, dup := m.Duplicate(d); dup != want {
			t.Errorf("Duplicate(%q) = %v", d, dup)
		}
	}
}

// FuzzSequenceRatio: any two strings give a ratio in [0, 1], and a
// string under 200 code points matches itself entirely (autojunk can
// lower longer ones, as in difflib).
func FuzzSequenceRatio(f *testing.F) {
	f.Add("get the weather forecast", "get weather forecast for a city")
	f.Add("héllo wörld", "")
	f.Add(strings.Repeat("ab", 150), strings.Repeat("ba", 120))
	f.Fuzz(func(t *testing.T, a, b string) {
		r := SequenceRatio(a, b)
		if !(r >= 0 && r <= 1) {
			t.Fatalf("ratio %v", r)
		}
		if len([]rune(a)) < 200 && SequenceRatio(a, a) != 1 {
			t.Fatalf("%q against itself: %v", a, SequenceRatio(a, a))
		}
	})
}
