package cpu

import "math"

// Reference forwards: the plain, generic versions of the ops, written for
// clarity rather than speed. The finite-difference checks run them in
// float64, and the autodiff tape uses them for float64 graphs; float32
// training runs the fast kernels instead, which the tests compare with
// these.

// MatMulTRef returns y[m,n] = x[m,k]·w[n,k]ᵀ + b[n] (b may be nil).
func MatMulTRef[T Float](x, w, b []T, m, k, n int) []T {
	y := make([]T, m*n)
	for i := range m {
		for j := range n {
			var s T
			if b != nil {
				s = b[j]
			}
			for c := range k {
				s += x[i*k+c] * w[j*k+c]
			}
			y[i*n+j] = s
		}
	}
	return y
}

// RMSNormRef returns y = x / sqrt(mean(x²)+eps) · w over rows of width d.
func RMSNormRef[T Float](x, w []T, d int, eps float64) []T {
	y := make([]T, len(x))
	for r := 0; r < len(x)/d; r++ {
		var ss float64
		for _, v := range x[r*d : (r+1)*d] {
			ss += float64(v) * float64(v)
		}
		inv := 1 / math.Sqrt(ss/float64(d)+eps)
		for i := range d {
			y[r*d+i] = T(float64(x[r*d+i]) * inv * float64(w[i]))
		}
	}
	return y
}

// RopeRef returns x[t, heads·hd] rotated (rotate-half pairs, token i at
// position pos[i]).
func RopeRef[T Float](x []T, pos []int, heads, hd int, theta float64) []T {
	y := append([]T(nil), x...)
	half := hd / 2
	for ti, p := range pos {
		for h := range heads {
			v := y[(ti*heads+h)*hd : (ti*heads+h+1)*hd]
			for i := range half {
				a := float64(p) * math.Pow(theta, -2*float64(i)/float64(hd))
				c, s := T(math.Cos(a)), T(math.Sin(a))
				x0, x1 := v[i], v[i+half]
				v[i] = x0*c - x1*s
				v[i+half] = x1*c + x0*s
			}
		}
	}
	return y
}

// SiLUMulRef returns silu(g)·u elementwise.
func SiLUMulRef[T Float](g, u []T) []T {
	y := make([]T, len(g))
	for i := range g {
		y[i] = T(float64(g[i]) / (1 + math.Exp(-float64(g[i]))) * float64(u[i]))
	}
	return y
}

// AttentionRef is Attention (causal GQA over a cache, optional mask) in
// plain loops; shapes as Attention.
func AttentionRef[T Float](q, kc, vc []T, valid []bool, tn, start, heads, kvh, d int) []T {
	out := make([]T, tn*heads*d)
	for i := range tn {
		for h := range heads {
			g := h / (heads / kvh)
			n := start + i + 1
			sc := make([]float64, n)
			m := math.Inf(-1)
			for j := range n {
				sc[j] = math.Inf(-1)
				if valid != nil && !valid[j] {
					continue
				}
				s := 0.0
				for x := range d {
					s += float64(q[(i*heads+h)*d+x]) * float64(kc[(j*kvh+g)*d+x])
				}
				sc[j] = s / math.Sqrt(float64(d))
				m = math.Max(m, sc[j])
			}
			if math.IsInf(m, -1) {
				continue
			}
			z := 0.0
			for j := range sc {
				sc[j] = math.Exp(sc[j] - m)
				z += sc[j]
			}
			for j := range sc {
				for x := range d {
					out[(i*heads+h)*d+x] += T(sc[j] / z * float64(vc[(j*kvh+g)*d+x]))
				}
			}
		}
	}
	return out
}
