package tamem

import (
	"strings"
	"testing"
)

// FuzzParseNotes: any extractor reply gives an error or notes whose spans
// lie in the session, and pages built from them hold only its messages.
// `make test` runs the seeds; `make fuzz` explores.
func FuzzParseNotes(f *testing.F) {
	f.Add(`[{"start":0,"end":1,"summary":"s","facts":[{"person":"A","fact":"f"}],"persons":["A"]}]`, 3)
	f.Add(`Sure [0-2]: [{"start":1,"end":2}] done`, 3)
	f.Add(`[[[[`+strings.Repeat("[", 200), 2)
	f.Add(`[{"start":-1,"end":0}]`, 1)
	f.Fuzz(func(t *testing.T, reply string, n int) {
		if n < 1 || n > 64 {
			return
		}
		notes, err := ParseNotes(reply, n)
		if err != nil {
			return
		}
		lines := make([]Line, n)
		for i := range lines {
			lines[i] = Line{Speaker: "A", Text: strings.Repeat("x", i)}
		}
		for i, p := range Pages(0, "d", lines, notes) {
			if notes[i].Start < 0 || notes[i].End >= n || len(p.Dialogue) == 0 || len(p.Dialogue) > n {
				t.Fatalf("note %+v gives a page of %d messages of %d", notes[i], len(p.Dialogue), n)
			}
		}
	})
}
