package console

import (
	"os"
	"path/filepath"
	"slices"
	"testing"
)

// TestOtherRanksAreNotRuns: a run across processes keeps its other ranks'
// metrics in ranks/rank-N; the runs list shows the run once, not each
// rank as a run still training.
func TestOtherRanksAreNotRuns(t *testing.T) {
	dir := t.TempDir()
	line := []byte(`{"step":1,"reward":0.5}` + "\n")
	for _, d := range []string{"dist", "dist/ranks/rank-1", "solo/ranks"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, d, "metrics.jsonl"), line, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	runs, _, err := newRunStore(dir).scan()
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, r := range runs {
		names = append(names, r.Name)
	}
	// solo/ranks is a run's own folder named ranks (no run above it).
	if want := []string{"dist", "solo/ranks"}; !slices.Equal(slices.Sorted(slices.Values(names)), want) {
		t.Fatalf("runs %v, want %v", names, want)
	}
}
