package cpu

import (
	"math/rand/v2"
	"testing"
)

// BenchmarkAttentionTrain is a training sequence's attention, forward and
// backward, in the tiny default's shape (4 heads over 2 kv heads of 24)
// at 1,024 tokens: the causal blocks skip the upper triangle's products,
// beside the anchor of the whole t×n products (one block of every row).
func BenchmarkAttentionTrain(b *testing.B) {
	const t, heads, kvh, d = 1024, 4, 2, 24
	rng := rand.New(rand.NewPCG(1, 1))
	f := func(n int) []float32 {
		o := make([]float32, n)
		for i := range o {
			o[i] = float32(rng.NormFloat64())
		}
		return o
	}
	q, kc, vc, dout := f(t*heads*d), f(t*kvh*d), f(t*kvh*d), f(t*heads*d)
	out, dq, dk, dv := make([]float32, len(q)), make([]float32, len(q)), make([]float32, len(kc)), make([]float32, len(vc))
	run := func() float64 {
		b.ResetTimer()
		for range b.N {
			AttentionMatMul(out, q, kc, vc, t, 0, heads, kvh, d)
			AttentionBackwardMatMul(dq, dk, dv, dout, q, kc, vc, t, 0, heads, kvh, d)
		}
		return b.Elapsed().Seconds() / float64(b.N)
	}
	blocked := run()
	old := attnBlock
	attnBlock = t
	defer func() { attnBlock = old }()
	whole := run()
	b.ReportMetric(blocked*1e3, "ms/seq")
	b.ReportMetric(whole*1e3, "whole-ms/seq")
	b.Logf("1,024 tokens, forward and backward: causal blocks %.1f ms, whole products %.1f ms (anchor): %.2fx", blocked*1e3, whole*1e3, whole/blocked)
}
