package memtoolagent

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"testing"

	"github.com/agemem/agemem/embed"
	"github.com/agemem/agemem/memtools/ltm"
)

// TestMemoryRecallsTheSimilarEntries: entries survive the SQLite store
// (actions, feedback, reflection), Recall ranks them by their query's
// similarity and recalls the group above the steepest drop, and Render
// writes them as the paper's prompts do.
func TestMemoryRecallsTheSimilarEntries(t *testing.T) {
	ctx := context.Background()
	db, err := ltm.OpenSQLite(filepath.Join(t.TempDir(), "m.db"), ltm.SQLiteOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	st, _ := db.Namespace("alice")
	// R 2: a group of five is narrower than the paper's R = 10 can place
	// (with R = 10 a peak is never before index 10, so n >= 11).
	m := &Memory{Store: st, Embedder: embed.NewHashing(256, []int{3}), Count: Adaptive{R: 2, PeakNumber: 1, Fallback: 3}}
	for i := range 5 {
		e := Entry{Query: fmt.Sprintf("Plot total visits since November %d as a bar chart", i+1), Actions: []string{fmt.Sprintf(`analytics.create_plot.func(time_min="2023-11-%02d")`, i+1)}, Feedback: 1}
		if i == 0 {
			e.Feedback, e.Reflection = 0, "End on 2023-11-29."
		}
		if err := m.Add(ctx, e); err != nil {
			t.Fatal(err)
		}
	}
	for i := range 30 {
		m.Add(ctx, Entry{Query: fmt.Sprintf("Delete my last email from person number %d please", i), Actions: []string{"email.delete_email.func()"}, Feedback: 1})
	}
	got, err := m.Recall(ctx, "Plot total visits since November 20 as a bar chart")
	if err != nil {
		t.Fatal(err)
	}
	if len(got) < 5 || len(got) > 6 { // the steepest point may be the first entry below the drop
		t.Fatalf("recalled %d entries: %+v", len(got), got)
	}
	var reflected bool
	for _, e := range got[:5] {
		if !strings.HasPrefix(e.Query, "Plot total visits") {
			t.Fatalf("an email entry ranked among the plots: %+v", got)
		}
		if e.Feedback == 0 && e.Reflection == "End on 2023-11-29." && len(e.Actions) == 1 {
			reflected = true
		}
	}
	if !reflected {
		t.Fatalf("the failed entry lost its reflection: %+v", got)
	}
	r := Render(got[:1])
	if !strings.HasPrefix(r, "Query: Plot total visits") || !strings.Contains(r, "Answer (Tool Calls): [analytics.create_plot.func(") {
		t.Fatalf("render:\n%s", r)
	}
	if !strings.Contains(Render([]Entry{{Query: "q", Feedback: 0, Reflection: "why"}}), "User Feedback: Incorrect\nReflection: why") {
		t.Fatal("a failure renders its reflection")
	}
	if err := m.Add(ctx, Entry{Query: "q", Feedback: 2}); err == nil {
		t.Fatal("feedback 2 accepted")
	}
	if p := AgentPrompt("Base.", nil); p != "Base." {
		t.Fatalf("no memories: %q", p)
	}
}
