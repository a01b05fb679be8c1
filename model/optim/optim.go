// Package optim holds the optimiser side of training: AdamW with decoupled
// weight decay, clipping by global norm and learning-rate schedules, as
// pure functions over parameter and gradient slices (float32 master
// weights).
package optim

import (
	"fmt"
	"math"
	"runtime"
	"strings"
	"sync"

	"github.com/agemem/agemem/kernels"
	"github.com/agemem/agemem/kernels/cpu"
)

// Param is one trainable tensor with its gradient.
type Param struct {
	Name  string
	W     []float32 // master weights
	G     []float32 // gradient, same length
	Decay bool      // weight decay applies (not to norms and biases)
}

// DecayFor reports whether weight decay should apply to a parameter of
// this name: not to normalisation weights or biases, the usual choice.
func DecayFor(name string) bool {
	return !strings.Contains(name, "norm") && !strings.HasSuffix(name, ".bias")
}

// AdamWConfig are the optimiser's hyperparameters.
type AdamWConfig struct {
	Beta1, Beta2 float64 // 0.9, 0.999
	Eps          float64 // 1e-8
	WeightDecay  float64 // decoupled, e.g. 0.01
}

// AdamW is Loshchilov & Hutter's AdamW as PyTorch implements it:
//
//	w ← w − lr·wd·w                       (decoupled decay, if Decay)
//	m ← β1·m + (1−β1)·g,  v ← β2·v + (1−β2)·g²
//	w ← w − lr · (m / (1−β1ᵗ)) / (sqrt(v / (1−β2ᵗ)) + ε)
type AdamW struct {
	Config AdamWConfig
	StepN  int                  // steps taken
	M, V   map[string][]float32 // moments by parameter name
}

// NewAdamW returns an optimiser with empty moments.
func NewAdamW(c AdamWConfig) *AdamW {
	return &AdamW{Config: c, M: map[string][]float32{}, V: map[string][]float32{}}
}

// Step applies one update with learning rate lr.
func (a *AdamW) Step(params []Param, lr float64) error {
	a.StepN++
	for _, p := range params {
		if len(p.W) != len(p.G) {
			return fmt.Errorf("parameter %s: %d weights, %d gradients", p.Name, len(p.W), len(p.G))
		}
		m, v := a.M[p.Name], a.V[p.Name]
		if m == nil {
			m, v = make([]float32, len(p.W)), make([]float32, len(p.W))
			a.M[p.Name], a.V[p.Name] = m, v
		}
		cpu.AdamWUpdate(p.W, p.G, m, v, 1, a.Config.Step(a.StepN, lr, p.Decay))
	}
	return nil
}

// Step returns the scalars of update number stepN (1-based) at rate lr:
// the bias corrections, and the decoupled decay when decay applies.
func (c AdamWConfig) Step(stepN int, lr float64, decay bool) kernels.AdamWStep {
	s := kernels.AdamWStep{LR: lr, Beta1: c.Beta1, Beta2: c.Beta2, Eps: c.Eps, Decay: 1,
		BC1: 1 - math.Pow(c.Beta1, float64(stepN)), BC2: 1 - math.Pow(c.Beta2, float64(stepN))}
	if decay {
		s.Decay = 1 - lr*c.WeightDecay
	}
	return s
}

// chunks runs f(c, lo, hi) over [0, n) split into at most GOMAXPROCS
// chunks (c numbers them) across the cores when n is large.
func chunks(n int, f func(c, lo, hi int)) {
	workers := runtime.GOMAXPROCS(0)
	if n < 1<<16 || workers == 1 {
		f(0, 0, n)
		return
	}
	per := (n + workers - 1) / workers
	var wg sync.WaitGroup
	for c, lo := 0, 0; lo < n; c, lo = c+1, lo+per {
		wg.Go(func() { f(c, lo, min(lo+per, n)) })
	}
	wg.Wait()
}

// GlobalNorm is the L2 norm of all gradients together.
func GlobalNorm(params []Param) float64 {
	// Partial sums land in fixed slots and are added in order, so the norm
	// (and a resumed run) does not depend on which core finished first.
	var s float64
	for _, p := range params {
		parts := make([]float64, runtime.GOMAXPROCS(0))
		chunks(len(p.G), func(c, lo, hi int) {
			var part float64
			for _, g := range p.G[lo:hi] {
				part += float64(g) * float64(g)
			}
			parts[c] = part
		})
		for _, v := range parts {
			s += v
		}
	}
	return math.Sqrt(s)
}

// ClipGlobalNorm scales every gradient by maxNorm/norm when the global norm
// exceeds maxNorm, and returns the norm before clipping.
func ClipGlobalNorm(params []Param, maxNorm float64) float64 {
	n := GlobalNorm(params)
	if maxNorm > 0 && n > maxNorm {
		Scale(params, maxNorm/(n+1e-6))
	}
	return n
}

// Scale multiplies every gradient by f (1/k after accumulating k
// micro-batches).
func Scale(params []Param, f float64) {
	for _, p := range params {
		for i := range p.G {
			p.G[i] = float32(float64(p.G[i]) * f)
		}
	}
}

// ZeroGrad clears the gradients.
func ZeroGrad(params []Param) {
	for _, p := range params {
		clear(p.G)
	}
}

// Schedule is linear warmup, then constant or cosine decay to MinRatio of
// the base rate at Total steps.
type Schedule struct {
	Warmup   int
	Total    int
	Cosine   bool
	MinRatio float64
}

// LR returns the learning rate at step (0-based).
func (s Schedule) LR(base float64, step int) float64 {
	if s.Warmup > 0 && step < s.Warmup {
		return base * float64(step+1) / float64(s.Warmup)
	}
	if !s.Cosine || s.Total <= s.Warmup {
		return base
	}
	progress := math.Min(1, float64(step-s.Warmup)/float64(s.Total-s.Warmup))
	return base * (s.MinRatio + (1-s.MinRatio)*0.5*(1+math.Cos(math.Pi*progress)))
}
