package cpu

import (
	"math"
	"math/rand/v2"
	"testing"
)

// TestLinearBackwardMatchesFloat64: the float32 LinearBackward (tiled
// kernels; dx from w's own layout for a layer's shapes, through the
// transpose for a vocabulary's) accumulates what the float64 reference
// computes, on both sides of the shape rule and ragged edges.
func TestLinearBackwardMatchesFloat64(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for _, s := range [][3]int{{37, 96, 96}, {130, 96, 256}, {130, 256, 96}, {65, 96, 2048}, {5, 7, 9}} {
		m, k, n := s[0], s[1], s[2]
		x, w, dy := randVec(r, m*k), randVec(r, n*k), randVec(r, m*n)
		dx, dw := randVec(r, m*k), randVec(r, n*k)
		x64, w64, dy64, dx64, dw64 := to64(x), to64(w), to64(dy), to64(dx), to64(dw)
		LinearBackward(dx, dw, nil, dy, x, w, m, k, n)
		MatMulTBackward(dx64, dw64, nil, dy64, x64, w64, m, k, n)
		for i := range dx {
			if math.Abs(float64(dx[i])-dx64[i]) > 1e-4*math.Max(1, math.Abs(dx64[i])) {
				t.Fatalf("%v dx[%d] %g want %g", s, i, dx[i], dx64[i])
			}
		}
		for i := range dw {
			if math.Abs(float64(dw[i])-dw64[i]) > 1e-4*math.Max(1, math.Abs(dw64[i])) {
				t.Fatalf("%v dw[%d] %g want %g", s, i, dw[i], dw64[i])
			}
		}
	}
}
