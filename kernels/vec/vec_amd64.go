package vec

import "golang.org/x/sys/cpu"

// HasSIMD reports whether the assembly kernels are in use.
var HasSIMD = cpu.X86.HasAVX2 && cpu.X86.HasFMA

//go:noescape
func dotAVX2(a, b *float32, n int) float32

//go:noescape
func sumAVX2(a *float32, n int) float32

func dot(a, b []float32) float32 {
	if HasSIMD {
		return dotAVX2(&a[0], &b[0], len(a))
	}
	return dotGeneric(a, b)
}

func sum(a []float32) float32 {
	if HasSIMD {
		return sumAVX2(&a[0], len(a))
	}
	return sumGeneric(a)
}

//go:noescape
func dotBF16AVX2(x *float32, w *uint16, n int) float32

func dotBF16(x []float32, w []uint16) float32 {
	if HasSIMD {
		return dotBF16AVX2(&x[0], &w[0], len(x))
	}
	return dotBF16Generic(x, w)
}
