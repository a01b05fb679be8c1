package stabletoolbench

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"
)

// TestSynthQuestionsKeepTheTools: questions from another seed come over
// the very tools of the world's seed (a policy trained there knows them)
// and are other questions; the same seeds give the same files.
func TestSynthQuestionsKeepTheTools(t *testing.T) {
	train, err := Synth(1, 20, 5, 300)
	if err != nil {
		t.Fatal(err)
	}
	held, err := SynthQuestions(1, 2, 20, 5, 300)
	if err != nil {
		t.Fatal(err)
	}
	again, _ := SynthQuestions(1, 2, 20, 5, 300)
	if !bytes.Equal(held.Queries, again.Queries) || !bytes.Equal(held.Collection, again.Collection) {
		t.Fatal("the same seeds gave other files")
	}
	if !bytes.Equal(train.Collection, held.Collection) {
		t.Fatal("another query seed changed the tools")
	}
	if same, _ := SynthQuestions(1, 0, 20, 5, 300); !bytes.Equal(same.Queries, train.Queries) {
		t.Fatal("query seed 0 is not the world's")
	}
	read := func(sb SynthBench) []Query {
		dir := t.TempDir()
		os.WriteFile(filepath.Join(dir, "q.json"), sb.Queries, 0o644)
		qs, err := LoadQueries(filepath.Join(dir, "q.json"))
		if err != nil {
			t.Fatal(err)
		}
		return qs
	}
	seen := map[string]bool{}
	for _, q := range read(train) {
		seen[q.Text] = true
	}
	repeated := 0
	for _, q := range read(held) {
		if seen[q.Text] {
			repeated++
		}
	}
	// One-tool questions share templates, so a few texts recur by chance;
	// most must be new.
	if repeated > 30 {
		t.Fatalf("%d of 300 questions from query seed 2 are training questions", repeated)
	}
	t.Logf("%d of 300 held-out questions repeat a training question's text", repeated)
}
