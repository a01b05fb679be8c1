package cpu

import (
	"math/rand/v2"
	"testing"
)

// BenchmarkLinearBackwardDX reports GFLOP/s of LinearBackward's input
// gradient beside the path it replaced for a layer's shapes (w transposed,
// then the dot kernels), measured in the same run, on the tiny recipe's
// shapes (hidden 96, MLP 256, vocabulary 2048; 6,000 tokens a step) and the
// GPU recipe's (hidden 512, MLP 1536).
func BenchmarkLinearBackwardDX(b *testing.B) {
	for _, s := range []struct {
		name    string
		m, n, k int // dy [m, n], w [n, k], dx [m, k]
	}{
		{"tiny_up_96x256", 6000, 256, 96},
		{"tiny_down_256x96", 6000, 96, 256},
		{"tiny_head_96x2048", 6000, 2048, 96},
		{"gpu_up_512x1536", 2000, 1536, 512},
		{"gpu_down_1536x512", 2000, 512, 1536},
	} {
		b.Run(s.name, func(b *testing.B) {
			r := rand.New(rand.NewPCG(1, 2))
			dy, w := randVec(r, s.m*s.n), randVec(r, s.n*s.k)
			dx := make([]float32, s.m*s.k)
			flops := 2 * float64(s.m) * float64(s.k) * float64(s.n)
			best := func(f func()) float64 { return bestGFLOPs(flops, 5, f) }
			var ours float64
			for b.Loop() {
				ours = best(func() { LinearBackward(dx, nil, nil, dy, nil, w, s.m, s.k, s.n) })
			}
			old := best(func() {
				tmp := make([]float32, s.m*s.k)
				MatMulT(tmp, dy, Transpose(w, s.n, s.k), nil, s.m, s.n, s.k)
				Add(dx, tmp)
			})
			b.ReportMetric(ours, "GFLOP/s")
			b.ReportMetric(old, "transpose_dot_GFLOP/s")
			b.ReportMetric(ours/old, "ratio")
		})
	}
}
