package kernels

import (
	"math"
	"testing"
)

// TestDropoutBitsKeepTheRightFraction: over a million elements the kept
// fraction is 1−p within four standard deviations, for small and large p,
// and p = 0 keeps everything; two seeds give different masks.
func TestDropoutBitsKeepTheRightFraction(t *testing.T) {
	const n = 1 << 20
	for _, p := range []float64{0, 0.05, 0.5, 0.9} {
		thr, kept := DropoutThreshold(p), 0
		for i := range uint64(n) {
			if DropoutBits(7, i) >= thr {
				kept++
			}
		}
		got, sd := float64(kept)/n, math.Sqrt(p*(1-p)/n)
		if math.Abs(got-(1-p)) > 4*sd+1e-12 {
			t.Errorf("p %.2f: kept %.5f, want %.5f ± %.5f", p, got, 1-p, 4*sd)
		}
	}
	same, thr := 0, DropoutThreshold(0.5)
	for i := range uint64(1000) {
		if (DropoutBits(1, i) >= thr) == (DropoutBits(2, i) >= thr) {
			same++
		}
	}
	if same > 600 || same < 400 {
		t.Errorf("seeds 1 and 2 agree on %d of 1000 elements: masks are not independent", same)
	}
}
