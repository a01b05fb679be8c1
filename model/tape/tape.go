// Package tape is reverse-mode automatic differentiation over the compute
// kernels. Model code calls the ops of a Tape as it would call the
// kernels; each op computes its output and records how to push gradients
// back to its inputs. Backward replays the records in reverse. Ops are
// coarse (a matmul, a normalisation, a whole attention), so the tape stays
// short and each backward is one hand-checked kernel from kernels/cpu.
//
// A Tape is generic over the element type: float32 for training (the fast
// kernels) and float64 for the finite-difference checks (the reference
// kernels), so the same model code is checked and trained.
package tape

import (
	"fmt"

	"github.com/agemem/agemem/kernels/cpu"
)

// Float is the element type of a tape.
type Float = cpu.Float

// Var is a value on the tape: a row-major [Rows, Cols] matrix and, once
// backward reaches it, its gradient.
type Var[T Float] struct {
	Val        []T
	Grad       []T
	Rows, Cols int
	// Requires is set when a gradient must flow to this value: it is a
	// trainable parameter or depends on one.
	Requires bool
}

// Mem counts the bytes of activations and gradients a tape holds (not the
// parameters or their gradients): what activation recomputation saves.
type Mem struct{ Live, Peak int64 }

func (m *Mem) add(n int64) {
	m.Live += n
	m.Peak = max(m.Peak, m.Live)
}

// Tape records ops for one forward and backward pass.
type Tape[T Float] struct {
	back []func()
	held int64 // bytes this tape allocated, returned to mem on Release
	mem  *Mem
	elem int64
}

// New returns an empty tape.
func New[T Float]() *Tape[T] {
	var z T
	return &Tape[T]{mem: &Mem{}, elem: int64(sizeof(z))}
}

func sizeof[T Float](T) int {
	var z any = T(0)
	if _, ok := z.(float32); ok {
		return 4
	}
	return 8
}

// Mem reports the tape's memory accounting.
func (t *Tape[T]) Mem() Mem { return *t.mem }

func (t *Tape[T]) sub() *Tape[T] { return &Tape[T]{mem: t.mem, elem: t.elem} }

func (t *Tape[T]) alloc(n int) []T {
	t.held += int64(n) * t.elem
	t.mem.add(int64(n) * t.elem)
	return make([]T, n)
}

// Release drops the tape's records and returns its memory to the count.
func (t *Tape[T]) Release() {
	t.back = nil
	t.mem.add(-t.held)
	t.held = 0
}

// Param wraps a parameter: trainable ones accumulate their gradient into
// Grad (allocated here if nil) across backward passes until zeroed.
func Param[T Float](val []T, rows, cols int, trainable bool) *Var[T] {
	if len(val) != rows*cols {
		panic(fmt.Sprintf("tape: parameter of %d values for shape [%d, %d]", len(val), rows, cols))
	}
	v := &Var[T]{Val: val, Rows: rows, Cols: cols, Requires: trainable}
	if trainable {
		v.Grad = make([]T, len(val))
	}
	return v
}

// Const wraps a value no gradient flows to.
func Const[T Float](val []T, rows, cols int) *Var[T] { return Param(val, rows, cols, false) }

func (t *Tape[T]) out(rows, cols int, requires bool) *Var[T] {
	return &Var[T]{Val: t.alloc(rows * cols), Rows: rows, Cols: cols, Requires: requires}
}

// grad returns v's gradient, allocating it on first use.
func (t *Tape[T]) grad(v *Var[T]) []T {
	if v.Grad == nil {
		v.Grad = t.alloc(len(v.Val))
	}
	return v.Grad
}

// gradIf is v's gradient when one must flow to v, else nil.
func (t *Tape[T]) gradIf(v *Var[T]) []T {
	if v == nil || !v.Requires {
		return nil
	}
	return t.grad(v)
}

func (t *Tape[T]) record(y *Var[T], f func()) {
	if y.Requires {
		t.back = append(t.back, f)
	}
}

// Backward sets y's gradient to dy and propagates it through every
// recorded op, newest first. The tape is released afterwards.
func (t *Tape[T]) Backward(y *Var[T], dy []T) {
	if len(dy) != len(y.Val) {
		panic(fmt.Sprintf("tape: gradient of %d values for an output of %d", len(dy), len(y.Val)))
	}
	if y.Requires {
		g := t.grad(y)
		for i, d := range dy {
			g[i] += d
		}
		for i := len(t.back) - 1; i >= 0; i-- {
			t.back[i]()
			t.back[i] = nil // let each op's saved values go as soon as it is done
		}
	}
	t.Release()
}

// Recompute runs f(x) without keeping its intermediate values: only the
// output is held, and during backward f runs again on a fresh tape to
// rebuild them. Activation checkpointing per decoder layer: memory drops
// from every intermediate of every layer to one layer's input, for about
// one extra forward pass of compute. f must be deterministic (dropout
// masks come from explicit seeds) and may read parameters, whose gradients
// accumulate as usual.
func (t *Tape[T]) Recompute(x *Var[T], f func(*Tape[T], *Var[T]) *Var[T]) *Var[T] {
	s := t.sub()
	in := &Var[T]{Val: x.Val, Rows: x.Rows, Cols: x.Cols, Requires: x.Requires}
	y0 := f(s, in)
	// Keep the output; give back everything else f allocated.
	y := t.out(y0.Rows, y0.Cols, y0.Requires)
	copy(y.Val, y0.Val)
	s.Release()
	t.record(y, func() {
		s := t.sub()
		in := &Var[T]{Val: x.Val, Rows: x.Rows, Cols: x.Cols, Requires: x.Requires}
		y1 := f(s, in)
		s.Backward(y1, y.Grad)
		if x.Requires && in.Grad != nil {
			addTo(t.grad(x), in.Grad)
		}
	})
	return y
}

func addTo[T Float](dst, src []T) {
	for i, v := range src {
		dst[i] += v
	}
}

func check(ok bool, format string, args ...any) {
	if !ok {
		panic("tape: " + fmt.Sprintf(format, args...))
	}
}
