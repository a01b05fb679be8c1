package memtoolagent

import (
	"fmt"
	"math"
	"strings"
	"testing"
)

// TestFindPeaksAsScipy: scipy.signal.find_peaks(y, prominence=1e-5) on
// hand-worked curves.
func TestFindPeaksAsScipy(t *testing.T) {
	for _, c := range []struct {
		y    []float64
		want []int
	}{
		{[]float64{0, 1, 0}, []int{1}},
		{[]float64{0, 1, 1, 0}, []int{1}},       // a plateau of two: its middle rounded down
		{[]float64{0, 1, 1, 1, 0}, []int{2}},    // a plateau of three: its middle
		{[]float64{1, 0, 1}, nil},               // the edges are never peaks
		{[]float64{0, 1, 1}, nil},               // a plateau running into the edge
		{[]float64{2, 2, 2, 2}, nil},            // flat
		{[]float64{0, 2, 1, 3, 0}, []int{1, 3}}, // two peaks
		{[]float64{0, 1, 0.5, 0.5, 2, 0}, []int{1, 4}},
		{[]float64{0, 1e-6, 0, 5e-6, 0}, nil},              // prominences 1e-6 and 5e-6 < 1e-5
		{[]float64{0, 2e-5, 1.5e-5, 3e-5, 0}, []int{3}},    // the first: 2e-5 − max(0, 1.5e-5) = 5e-6 < 1e-5
		{[]float64{0, 3e-5, 1.5e-5, 4e-5, 0}, []int{1, 3}}, // 3e-5 − 1.5e-5 = 1.5e-5
		{nil, nil},
		{[]float64{5}, nil},
	} {
		if got := FindPeaks(c.y, 1e-5); fmt.Sprint(got) != fmt.Sprint(c.want) {
			t.Errorf("FindPeaks(%v) = %v, want %v", c.y, got, c.want)
		}
	}
}

func TestSlope(t *testing.T) {
	// A line falling by 0.1 a step has slope −0.1: y = 0.1 everywhere.
	x := []float64{1, 0.9, 0.8, 0.7, 0.6, 0.5, 0.4}
	for _, v := range Slope(x, 2) {
		if math.Abs(v-0.1) > 1e-12 {
			t.Fatalf("slope of a line: %v", Slope(x, 2))
		}
	}
	// By hand, R = 1: y(1) = −(−1·x0 + 1·x2)/2.
	y := Slope([]float64{0.9, 0.8, 0.2, 0.1}, 1)
	if len(y) != 2 || math.Abs(y[0]-0.35) > 1e-12 || math.Abs(y[1]-0.35) > 1e-12 {
		t.Fatalf("R = 1: %v", y)
	}
}

// TestCount: the decisions the paper leaves open, and a memory whose
// similarities fall off a cliff after the first group.
func TestCount(t *testing.T) {
	a := Adaptive{R: 2, PeakNumber: 1, Fallback: 3}
	if n := a.Count([]float64{0.9, 0.8, 0.7}); n != 3 {
		t.Fatalf("fewer than 2R+1 entries: %d, want all 3", n)
	}
	// Four similar entries, then a drop, then a flat tail.
	x := []float64{0.95, 0.94, 0.93, 0.92, 0.40, 0.39, 0.38, 0.37, 0.36, 0.35}
	y := Slope(x, 2)
	peaks := FindPeaks(y, 1e-5)
	if len(peaks) != 1 {
		t.Fatalf("y %v, peaks %v", y, peaks)
	}
	// The steepest point is between x[3] and x[4]: y peaks at x index 3
	// or 4 (a plateau of two, its middle rounded down: index 3).
	if n := a.Count(x); n != peaks[0]+2+1 || n != 4 {
		t.Fatalf("n = %d (peak at y index %d): want the 4 entries above the drop", n, peaks[0])
	}
	flat := []float64{0.9, 0.8, 0.7, 0.6, 0.5, 0.4, 0.3}
	if n := a.Count(flat); n != 3 {
		t.Fatalf("no peak: %d, want the fallback 3", n)
	}
	if n := (Adaptive{R: 2, PeakNumber: 1}).Count(flat); n != len(flat) {
		t.Fatalf("no peak, no fallback: %d", n)
	}
	// Three groups of five: drops after the 5th and the 10th entries.
	two := []float64{0.95, 0.94, 0.93, 0.92, 0.91, 0.5, 0.49, 0.48, 0.47, 0.46, 0.1, 0.09, 0.08, 0.07, 0.06}
	if n1, n2, n9 := (Adaptive{R: 2, PeakNumber: 1}).Count(two), (Adaptive{R: 2, PeakNumber: 2}).Count(two), (Adaptive{R: 2, PeakNumber: 9}).Count(two); n1 != 5 || n2 != 10 || n9 != 10 {
		t.Fatalf("peak 1: %d, peak 2: %d, peak 9 (the last one): %d", n1, n2, n9)
	}
}

// TestAdaptiveCheck: the paper's settings pass; a window, peak number or
// fallback no recall can follow is named.
func TestAdaptiveCheck(t *testing.T) {
	if err := DefaultAdaptive().Check(); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		a    Adaptive
		want string
	}{
		{Adaptive{R: 0, PeakNumber: 1}, "half window R 0"},
		{Adaptive{R: -2, PeakNumber: 1}, "half window R -2"},
		{Adaptive{R: 10, PeakNumber: 0}, "peak number 0"},
		{Adaptive{R: 10, PeakNumber: 1, Fallback: -1}, "fallback -1"},
	} {
		if err := c.a.Check(); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v: %v, want %q", c.a, err, c.want)
		}
	}
}

// The baselines of the paper's Figure 5, hand-worked: a fixed top-k, and
// Adaptive-k, which cuts at the largest drop between neighbours (the
// first of equal drops).
func TestBaselineCounters(t *testing.T) {
	x := []float64{0.9, 0.85, 0.5, 0.45, 0.1}
	if got := (Gap{}).Count(x); got != 2 {
		t.Errorf("gap: %d, want 2 (0.85 → 0.5 is the first drop of 0.35)", got)
	}
	if got := (Gap{}).Count([]float64{0.9, 0.8, 0.7, 0.2}); got != 3 {
		t.Errorf("gap: %d, want 3", got)
	}
	if (Gap{}).Count(x[:1]) != 1 || (Gap{}).Count(nil) != 0 {
		t.Error("gap on one or no entry")
	}
	if TopK(3).Count(x) != 3 || TopK(10).Count(x) != 5 || TopK(0).Count(x) != 0 {
		t.Error("top-k")
	}
}
