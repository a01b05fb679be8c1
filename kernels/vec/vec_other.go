//go:build !amd64

package vec

// HasSIMD reports whether the assembly kernels are in use.
const HasSIMD = false

func dot(a, b []float32) float32 { return dotGeneric(a, b) }

func sum(a []float32) float32 { return sumGeneric(a) }

func dotBF16(x []float32, w []uint16) float32 { return dotBF16Generic(x, w) }
