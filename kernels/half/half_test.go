package half

import (
	"math"
	"math/big"
	"testing"
)

// nearest is the reference rounding: exact rational arithmetic picks the
// representable value nearest to f (ties to even) from a candidate list.
func nearest(f float32, cands []float32, evenMant func(float32) bool) float32 {
	x := new(big.Float).SetFloat64(float64(f))
	best := cands[0]
	var bestD *big.Float
	for _, c := range cands {
		d := new(big.Float).Sub(x, new(big.Float).SetFloat64(float64(c)))
		d.Abs(d)
		if bestD == nil || d.Cmp(bestD) < 0 || (d.Cmp(bestD) == 0 && evenMant(c)) {
			best, bestD = c, d
		}
	}
	return best
}

func TestF16AllValuesRoundTrip(t *testing.T) {
	for h := 0; h < 1<<16; h++ {
		f := F16ToF32(uint16(h))
		if math.IsNaN(float64(f)) {
			if !math.IsNaN(float64(F16ToF32(F32ToF16(f)))) {
				t.Fatalf("NaN %04x lost", h)
			}
			continue
		}
		if back := F32ToF16(f); back != uint16(h) {
			t.Fatalf("%04x -> %g -> %04x", h, f, back)
		}
	}
	// Known values.
	for _, c := range []struct {
		h uint16
		f float32
	}{{0x3c00, 1}, {0xc000, -2}, {0x7bff, 65504}, {0x0001, 5.960464477539063e-08}, {0x3555, 0.333251953125}} {
		if F16ToF32(c.h) != c.f {
			t.Errorf("F16ToF32(%04x) = %g, want %g", c.h, F16ToF32(c.h), c.f)
		}
	}
}

func TestF32ToF16RoundsToNearestEven(t *testing.T) {
	for _, f := range []float32{1.0009765625 / 2 * 2, 1 + 1.0/2048, 1 + 3.0/2048, 0.1, 1e-6, 3e-8, 70000, -0.0001, 65519, 65520} {
		got := F16ToF32(F32ToF16(f))
		// Candidates: the halves around f.
		var cands []float32
		for h := 0; h < 0x7c01; h++ {
			v := F16ToF32(uint16(h))
			if f < 0 {
				v = -v
			}
			cands = append(cands, v)
		}
		want := nearest(f, cands, func(c float32) bool { return F32ToF16(c)&1 == 0 })
		if math.Abs(float64(f)) >= 65520 {
			want = float32(math.Inf(1))
			if f < 0 {
				want = float32(math.Inf(-1))
			}
		}
		if got != want {
			t.Errorf("F32ToF16(%g) -> %g, want %g", f, got, want)
		}
	}
}

func TestBF16(t *testing.T) {
	for h := 0; h < 1<<16; h++ {
		f := BF16ToF32(uint16(h))
		if math.IsNaN(float64(f)) {
			continue
		}
		if F32ToBF16(f) != uint16(h) {
			t.Fatalf("bf16 %04x does not round-trip", h)
		}
	}
	// 1 + 2^-8 is a tie between 1 and 1 + 2^-7: to even (1).
	if F32ToBF16(1+1.0/256) != 0x3f80 || F32ToBF16(1+3.0/256) != 0x3f82 {
		t.Errorf("ties: %04x %04x", F32ToBF16(1+1.0/256), F32ToBF16(1+3.0/256))
	}
	if F32ToBF16(1+1.0/256+1.0/65536) != 0x3f81 {
		t.Error("above the tie must round up")
	}
	if !math.IsNaN(float64(BF16ToF32(F32ToBF16(float32(math.NaN()))))) {
		t.Error("NaN became a number")
	}
}
