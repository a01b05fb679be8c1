package cpu

import (
	"math/rand/v2"
	"runtime"
	"testing"
	"time"

	"github.com/ebitengine/purego"
)

// sgemm is OpenBLAS's cblas_sgemm, loaded at run time (no cgo) as the
// anchor for our matmul. Install it with `apt-get install libopenblas0`.
var sgemm func(order, transA, transB, m, n, k int32, alpha float32, a *float32, lda int32, b *float32, ldb int32, beta float32, c *float32, ldc int32)

func loadOpenBLAS(b *testing.B) {
	if sgemm != nil {
		return
	}
	for _, name := range []string{"libopenblas.so.0", "libopenblas.so"} {
		lib, err := purego.Dlopen(name, purego.RTLD_NOW|purego.RTLD_GLOBAL)
		if err != nil {
			continue
		}
		purego.RegisterLibFunc(&sgemm, lib, "cblas_sgemm")
		if set, err := purego.Dlsym(lib, "openblas_set_num_threads"); err == nil {
			var f func(int32)
			purego.RegisterFunc(&f, set)
			f(int32(runtime.GOMAXPROCS(0)))
		}
		return
	}
	b.Skip("OpenBLAS not found (apt-get install libopenblas0): no anchor")
}

// BenchmarkMatMul reports GFLOP/s of MatMul (x W^T, the Linear layout)
// beside OpenBLAS sgemm on the same shapes in the same run: 1024³ and the
// projections of Qwen2.5-0.5B for a 128-token prefill.
func BenchmarkMatMul(b *testing.B) {
	loadOpenBLAS(b)
	for _, s := range []struct {
		name    string
		m, k, n int
	}{
		{"1024cubed", 1024, 1024, 1024},
		{"q05_qproj_896x896", 128, 896, 896},
		{"q05_kv_896x128", 128, 896, 128},
		{"q05_gateup_896x4864", 128, 896, 4864},
		{"q05_down_4864x896", 128, 4864, 896},
		// One decoding sequence, and three (an odd row in a batch).
		{"q05_gateup_decode1_896x4864", 1, 896, 4864},
		{"q05_gateup_decode3_896x4864", 3, 896, 4864},
	} {
		b.Run(s.name, func(b *testing.B) {
			r := rand.New(rand.NewPCG(1, 2))
			x, w := randVec(r, s.m*s.k), randVec(r, s.n*s.k)
			y := make([]float32, s.m*s.n)
			mat := Matrix{Rows: s.n, Cols: s.k, F32: w}
			flops := 2 * float64(s.m) * float64(s.k) * float64(s.n)
			best := func(f func()) float64 { return bestGFLOPs(flops, 10, f) }
			var ours float64
			for b.Loop() {
				ours = best(func() { MatMul(y, x, mat, nil, s.m) })
			}
			// Row-major C[m,n] = A[m,k] * B[n,k]^T.
			blas := best(func() {
				sgemm(101, 111, 112, int32(s.m), int32(s.n), int32(s.k), 1, &x[0], int32(s.k), &w[0], int32(s.k), 0, &y[0], int32(s.n))
			})
			b.ReportMetric(ours, "GFLOP/s")
			b.ReportMetric(blas, "openblas_GFLOP/s")
			b.ReportMetric(ours/blas, "ratio")
		})
	}
}

// bestGFLOPs runs f once to warm up, then runs times more, and returns
// flops over the fastest run in GFLOP/s: the figure least disturbed by the
// rest of the machine, for ours and its anchor alike.
func bestGFLOPs(flops float64, runs int, f func()) float64 {
	f()
	bestT := time.Duration(1 << 62)
	for range runs {
		start := time.Now()
		f()
		bestT = min(bestT, time.Since(start))
	}
	return flops / bestT.Seconds() / 1e9
}
