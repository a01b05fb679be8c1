package kernels

import "math"

// Dropout masks are counter-based: element i of a mask seeded seed is kept
// when DropoutBits(seed, i) >= DropoutThreshold(p). Any backend (and the
// tape) draws the same mask from (seed, i) alone, in any order and in
// parallel, so a device regenerates a mask in backward instead of storing
// it (a LoRA step at 10k tokens would otherwise keep gigabytes of masks).

// DropoutBits is splitmix64 of the element's counter.
func DropoutBits(seed, i uint64) uint64 {
	z := seed + (i+1)*0x9e3779b97f4a7c15
	z = (z ^ z>>30) * 0xbf58476d1ce4e5b9
	z = (z ^ z>>27) * 0x94d049bb133111eb
	return z ^ z>>31
}

// DropoutThreshold is p·2⁶⁴: a uniform 64-bit draw falls below it with
// probability p (0 ≤ p < 1).
func DropoutThreshold(p float64) uint64 {
	if p <= 0 {
		return 0
	}
	return uint64(math.Ldexp(p, 64))
}
