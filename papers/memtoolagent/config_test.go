package memtoolagent

import (
	"strings"
	"testing"

	"github.com/agemem/agemem/bench/nestful"
)

// TestConfig: the section's defaults validate; memory names the runs in
// order; recall names the counter a query recalls with; NESTFUL's memory
// is the samples after the test set, and a run with memory but none left
// is refused, naming the keys.
func TestConfig(t *testing.T) {
	c := DefaultConfig()
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	for memory, want := range map[string][]bool{"both": {false, true}, "on": {true}, "off": {false}} {
		c.Memory = memory
		if got := c.Modes(); len(got) != len(want) || got[0] != want[0] || got[len(got)-1] != want[len(want)-1] {
			t.Errorf("memory %s: runs %v, want %v", memory, got, want)
		}
	}
	x := []float64{0.9, 0.88, 0.5, 0.45, 0.1}
	for recall, want := range map[string]int{"top-2": 2, "top-9": 5, "gap": 2, "dynamic": 5} {
		c.Recall = recall
		if n := c.Counter().Count(x); n != want {
			t.Errorf("recall %s: %d of 5 recalled, want %d", recall, n, want)
		}
	}
	samples := make([]nestful.Sample, 10)
	c = DefaultConfig()
	c.MemorySize = 3
	if mem, err := c.NestfulMemory(samples[:4], samples[4:]); err != nil || len(mem) != 3 {
		t.Fatalf("memory of %d samples: %v", len(mem), err)
	}
	c.Memory = "off"
	if _, err := c.NestfulMemory(samples, nil); err != nil {
		t.Fatalf("a run without memory needs none: %v", err)
	}
	c.Memory = "both"
	if _, err := c.NestfulMemory(samples, nil); err == nil || !strings.Contains(err.Error(), "none left to populate the memory") || !strings.Contains(err.Error(), "memtoolagent.memory_size 3") {
		t.Fatalf("no samples left: %v", err)
	}
	c = DefaultConfig()
	c.Recall, c.Adaptive.Fallback, c.MaxSteps = "top-x", -1, 0
	err := c.Validate()
	for _, want := range []string{`recall: "top-x": top-K needs a count`, "adaptive.fallback: -1: a fallback -1 recalls nothing", "max_steps: 0: the model needs at least one turn"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("error %v lacks %q", err, want)
		}
	}
}
