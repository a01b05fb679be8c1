package vec

import (
	"github.com/agemem/agemem/kernels/half"
	"math"
	"math/rand/v2"
	"slices"
	"testing"
)

func TestDotAndSumMatchFloat64(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for _, n := range []int{1, 3, 7, 8, 9, 31, 32, 33, 63, 64, 100, 384, 1000, 4097} {
		a := make([]float32, n)
		b := make([]float32, n)
		var want, wantSum float64
		for i := range a {
			a[i] = float32(r.NormFloat64())
			b[i] = float32(r.NormFloat64())
			want += float64(a[i]) * float64(b[i])
			wantSum += float64(a[i])
		}
		tol := 1e-5 * math.Sqrt(float64(n)) * 4
		if got := Dot(a, b); math.Abs(float64(got)-want) > tol {
			t.Errorf("Dot n=%d: got %g want %g", n, got, want)
		}
		if got := dotGeneric(a, b); math.Abs(float64(got)-want) > tol {
			t.Errorf("dotGeneric n=%d: got %g want %g", n, got, want)
		}
		if got := Sum(a); math.Abs(float64(got)-wantSum) > tol {
			t.Errorf("Sum n=%d: got %g want %g", n, got, wantSum)
		}
	}
	if Dot(nil, nil) != 0 || Sum(nil) != 0 {
		t.Error("empty input must give 0")
	}
}

func TestDotPanicsWhenBShorter(t *testing.T) {
	defer func() {
		if recover() == nil {
			t.Error("Dot with a shorter b must panic, not read past it")
		}
	}()
	Dot(make([]float32, 8), make([]float32, 4))
}

func TestDotBF16(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	for _, n := range []int{1, 7, 8, 9, 31, 32, 33, 100, 896, 4864} {
		x := make([]float32, n)
		w := make([]uint16, n)
		var want float64
		for i := range x {
			x[i] = float32(r.NormFloat64())
			w[i] = uint16(math.Float32bits(float32(r.NormFloat64())) >> 16)
			want += float64(x[i]) * float64(math.Float32frombits(uint32(w[i])<<16))
		}
		tol := 1e-5 * math.Sqrt(float64(n)) * 4
		if got := DotBF16(x, w); math.Abs(float64(got)-want) > tol {
			t.Errorf("DotBF16 n=%d: got %g want %g", n, got, want)
		}
		if got := dotBF16Generic(x, w); math.Abs(float64(got)-want) > tol {
			t.Errorf("generic n=%d: got %g want %g", n, got, want)
		}
	}
}

// DotF16 against float64 over normal values, subnormals, zeros and the
// largest halves, at every tail length.
// The row kernels equal the one-row dots bit for bit (same order of
// operations), bf16 and f16, on widths they take and widths they leave to
// the per-row loop.
func TestDot16Rows(t *testing.T) {
	r := rand.New(rand.NewPCG(13, 14))
	for _, k := range []int{32, 96, 100, 896, 4864} {
		const rows = 7
		x, w := make([]float32, k), make([]uint16, rows*k)
		for i := range x {
			x[i] = float32(r.NormFloat64())
		}
		for _, f16 := range []bool{false, true} {
			for i := range w {
				if f16 {
					w[i] = half.F32ToF16(float32(r.NormFloat64()))
				} else {
					w[i] = half.F32ToBF16(float32(r.NormFloat64()))
				}
			}
			y := make([]float32, rows)
			DotBF16Rows(y, x, w, f16)
			for j := range rows {
				want := DotBF16(x, w[j*k:(j+1)*k])
				if f16 {
					want = DotF16(x, w[j*k:(j+1)*k])
				}
				if y[j] != want {
					t.Errorf("k=%d f16=%v row %d: %g, want %g", k, f16, j, y[j], want)
				}
			}
		}
	}
}

func TestDotF16(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 8))
	special := []uint16{0x0000, 0x8000, 0x0001, 0x83ff, 0x7bff, 0xfbff, 0x3c00}
	for _, n := range []int{1, 7, 8, 9, 31, 32, 33, 100, 896, 4864} {
		x := make([]float32, n)
		w := make([]uint16, n)
		var want, mag float64
		for i := range x {
			x[i] = float32(r.NormFloat64())
			w[i] = half.F32ToF16(float32(r.NormFloat64()))
			if i%13 == 5 {
				w[i] = special[i%len(special)]
			}
			wf := float64(half.F16ToF32(w[i]))
			want += float64(x[i]) * wf
			mag += math.Abs(float64(x[i]) * wf)
		}
		tol := 1e-6 * mag
		if got := DotF16(x, w); math.Abs(float64(got)-want) > tol {
			t.Errorf("DotF16 n=%d: got %g want %g", n, got, want)
		}
		if got := dotF16Generic(x, w); math.Abs(float64(got)-want) > tol {
			t.Errorf("generic n=%d: got %g want %g", n, got, want)
		}
	}
}

// DotQ8 (assembly and generic) against float64 over every int8 value
// ggml's blocks hold (-127..127, the extremes included), odd and even block
// counts, and scales of mixed sign and size.
// DotQ8Rows equals the generic DotQ8 row by row (to float32 rounding) for
// widths of whole 8-block groups, a 4-block tail, and widths the row
// kernel leaves to the per-row path.
func TestDotQ8Rows(t *testing.T) {
	r := rand.New(rand.NewPCG(11, 12))
	for _, blocks := range []int{4, 8, 12, 24, 28, 33, 152} {
		n, rows := 32*blocks, 5
		xq, q := make([]int8, n), make([]int8, rows*n)
		xd, d, xs := make([]float32, blocks), make([]float32, rows*blocks), make([]int32, blocks)
		for i := range xq {
			xq[i] = int8(r.IntN(255) - 127)
		}
		for i := range q {
			q[i] = int8(r.IntN(255) - 127)
		}
		for b := range xd {
			xd[b] = float32(r.NormFloat64())
		}
		for b := range d {
			d[b] = float32(r.NormFloat64())
		}
		Q8Sums(xs, xq)
		y := make([]float32, rows)
		DotQ8Rows(y, xq, xd, xs, q, d)
		for j := range rows {
			want := dotQ8Generic(xq, xd, q[j*n:(j+1)*n], d[j*blocks:(j+1)*blocks])
			if got := y[j]; math.Abs(float64(got-want)) > 1e-5*math.Abs(float64(want))+1e-3 {
				t.Errorf("%d blocks, row %d: %g, want %g", blocks, j, got, want)
			}
		}
	}
}

func TestDotQ8(t *testing.T) {
	r := rand.New(rand.NewPCG(9, 10))
	for _, n := range []int{32, 64, 96, 256, 288, 896, 4864} {
		xq, q := make([]int8, n), make([]int8, n)
		xd, d := make([]float32, n/32), make([]float32, n/32)
		for i := range xq {
			xq[i], q[i] = int8(r.IntN(255)-127), int8(r.IntN(255)-127)
		}
		// The extremes Q8_0 quantizing produces (±127: never -128).
		xq[0], q[0], xq[1], q[1], xq[2], q[2] = 127, 127, -127, -127, 127, -127
		xs := make([]int32, n/32)
		Q8Sums(xs, xq)
		for b := range d {
			xd[b], d[b] = float32(r.NormFloat64())*0.01, float32(r.NormFloat64())*0.01
		}
		var want, mag float64
		for b := range d {
			var s int64
			for i := b * 32; i < (b+1)*32; i++ {
				s += int64(xq[i]) * int64(q[i])
			}
			p := float64(xd[b]) * float64(d[b]) * float64(s)
			want += p
			mag += math.Abs(p)
		}
		tol := 1e-6 * mag
		if got := DotQ8(xq, xd, xs, q, d); math.Abs(float64(got)-want) > tol {
			t.Errorf("DotQ8 n=%d: got %g want %g", n, got, want)
		}
		if got := dotQ8Generic(xq, xd, q, d); math.Abs(float64(got)-want) > tol {
			t.Errorf("generic n=%d: got %g want %g", n, got, want)
		}
	}
	defer func() {
		if recover() == nil {
			t.Error("DotQ8 of 33 values did not panic")
		}
	}()
	DotQ8(make([]int8, 33), make([]float32, 2), make([]int32, 2), make([]int8, 33), make([]float32, 2))
}

func TestDot2x4(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 8))
	for _, k := range []int{1, 7, 8, 13, 64, 1000} {
		ldx, ldw := k+3, k+5
		x := make([]float32, 2*ldx)
		w := make([]float32, 4*ldw)
		for i := range x {
			x[i] = float32(r.NormFloat64())
		}
		for i := range w {
			w[i] = float32(r.NormFloat64())
		}
		var out [8]float32
		Dot2x4(x, ldx, w, ldw, k, &out)
		for i := range 2 {
			for j := range 4 {
				var want float64
				for c := range k {
					want += float64(x[i*ldx+c]) * float64(w[j*ldw+c])
				}
				if math.Abs(float64(out[i*4+j])-want) > 1e-4*math.Sqrt(float64(k)) {
					t.Fatalf("k=%d out[%d][%d] = %g want %g", k, i, j, out[i*4+j], want)
				}
			}
		}
	}
}

func TestGemm4x16(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 3))
	for _, k := range []int{1, 7, 24, 100} {
		const lda, ldb, ldc = 131, 37, 29
		a, b := make([]float32, 4*lda), make([]float32, k*ldb)
		for i := range a {
			a[i] = float32(r.NormFloat64())
		}
		for i := range b {
			b[i] = float32(r.NormFloat64())
		}
		c, want := make([]float32, 4*ldc), make([]float32, 4*ldc)
		for i := range c {
			c[i] = float32(i)
			want[i] = float32(i)
		}
		Gemm4x16(a, lda, b, ldb, k, c, ldc)
		gemm4x16Generic(a, lda, b, ldb, k, want, ldc)
		for i := range c {
			if math.Abs(float64(c[i]-want[i])) > 1e-4*math.Max(1, math.Abs(float64(want[i]))) {
				t.Fatalf("k=%d c[%d] = %g, want %g", k, i, c[i], want[i])
			}
		}
	}
}

func TestExpSub(t *testing.T) {
	r := rand.New(rand.NewPCG(4, 4))
	for _, n := range []int{1, 8, 13, 64, 1001} {
		x := make([]float32, n)
		for i := range x {
			x[i] = float32(r.NormFloat64() * 20)
		}
		x[0] = -200 // clamped, not NaN or a denormal surprise
		const m = 31.5
		want := make([]float64, n)
		var ws float64
		for i, v := range x {
			want[i] = math.Exp(math.Max(float64(v-m), -87)) // the float32 difference, as the kernel forms it
			ws += want[i]
		}
		s := ExpSub(x, m)
		for i := range x {
			if math.Abs(float64(x[i])-want[i]) > 5e-7*want[i] {
				t.Fatalf("n=%d exp[%d] = %g, want %g", n, i, x[i], want[i])
			}
		}
		if math.Abs(float64(s)-ws) > 1e-5*ws {
			t.Fatalf("n=%d sum %g, want %g", n, s, ws)
		}
	}
}

// ScaleMax, Scale and Axpy against float64, across the assembly's 8-value
// steps and the Go tail (n 1, 7: tail only; 8, 16: assembly only).
func TestScaleMaxScaleAxpy(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 5))
	for _, n := range []int{0, 1, 7, 8, 13, 16, 37, 1001} {
		x := make([]float32, n)
		y := make([]float32, n)
		for i := range x {
			x[i] = float32(r.NormFloat64() * 3)
			y[i] = float32(r.NormFloat64())
		}
		if n > 9 {
			x[9] = 50 // the maximum inside the assembly's part
		}
		if n > 2 {
			x[n-1] = float32(math.Inf(-1)) // a masked score stays masked
		}
		const s, a = 0.125, -1.75
		want := math.Inf(-1)
		for _, v := range x {
			want = math.Max(want, float64(v)*s)
		}
		sx := slices.Clone(x)
		if m := ScaleMax(sx, s); float64(m) != want {
			t.Fatalf("n=%d ScaleMax = %g, want %g", n, m, want)
		}
		scaled := slices.Clone(x)
		Scale(scaled, s)
		for i, v := range x {
			if float64(sx[i]) != float64(v)*s || scaled[i] != sx[i] {
				t.Fatalf("n=%d x[%d]: ScaleMax %g, Scale %g, want %g", n, i, sx[i], scaled[i], float64(v)*s)
			}
		}
		xs := x[:max(n-1, 0)] // no -Inf in an axpy
		ys := slices.Clone(y[:len(xs)])
		Axpy(ys, xs, a)
		for i := range ys {
			w := float64(y[i]) + a*float64(x[i])
			if math.Abs(float64(ys[i])-w) > 1e-6*(1+math.Abs(w)) {
				t.Fatalf("n=%d axpy[%d] = %g, want %g", n, i, ys[i], w)
			}
		}
	}
}
