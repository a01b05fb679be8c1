package cpu

import (
	"math"
	"slices"
	"testing"

	"github.com/agemem/agemem/kernels"
)

// TestBackendTensorOps checks the memory ops model code relies on: row
// views alias their parent, CopyRows copies whole rows, weights upload as
// views, and row-wise softmax / log-softmax agree.
func TestBackendTensorOps(t *testing.T) {
	var be kernels.Backend = New()
	x := be.FromHost([]float32{1, 2, 3, 4, 5, 6}, 3, 2)
	view := be.Rows(x, 1, 3)
	be.Add(view, be.FromHost([]float32{10, 10, 10, 10}, 2, 2))
	if got := be.ToHost(x); got[1] != 2 || got[2] != 13 || got[5] != 16 {
		t.Fatalf("a row view must alias its tensor: %v", got)
	}
	dst := be.Zeros(4, 2)
	be.CopyRows(dst, 2, x, 1, 2)
	if got := be.ToHost(dst); got[3] != 0 || got[4] != 13 || got[7] != 16 {
		t.Fatalf("CopyRows: %v", got)
	}
	w := be.Upload(kernels.Weight{Rows: 3, Cols: 2, BF16: []uint16{0x3f80, 0, 0, 0x4000, 0xbf80, 0x3f80}})
	out := be.Zeros(2, 2)
	be.Embedding(out, w, []int{2, 1})
	if got := be.ToHost(out); got[0] != -1 || got[1] != 1 || got[2] != 0 || got[3] != 2 {
		t.Fatalf("bf16 embedding: %v", got)
	}
	sm, lsm := be.Zeros(3, 2), be.Zeros(3, 2)
	be.Softmax(sm, x)
	be.LogSoftmax(lsm, x)
	s, l := be.ToHost(sm), be.ToHost(lsm)
	for i := range s {
		if math.Abs(math.Log(float64(s[i]))-float64(l[i])) > 1e-6 {
			t.Fatalf("softmax and log-softmax disagree at %d: %g vs %g", i, s[i], l[i])
		}
	}
	if math.Abs(float64(s[0]+s[1])-1) > 1e-6 {
		t.Fatalf("softmax row does not sum to 1: %v", s)
	}
}

// TestDropoutVariants: DropoutOperand is Dropout into a new tensor (the
// CPU's GEMMs read float32), and DropoutAdd adds Dropout's output: the
// same mask, kept elements scaled by 1/(1−p), y untouched where dropped.
func TestDropoutVariants(t *testing.T) {
	b := New()
	x := []float32{1, -2, 3, 0.5, 8, -1, 2, 4, 7, -3}
	y := []float32{10, 10, 10, 10, 10, 10, 10, 10, 10, 10}
	xs := b.FromHost(x, len(x))
	d := b.Zeros(len(x))
	b.Dropout(d, xs, 0.5, 3)
	want := b.ToHost(d)
	kept := 0
	for i, v := range want {
		if v != 0 {
			kept++
			if v != 2*x[i] {
				t.Fatalf("Dropout kept element %d as %g, want %g", i, v, 2*x[i])
			}
		}
	}
	if kept == 0 || kept == len(x) {
		t.Fatalf("p 0.5 kept %d of %d: the case does not test the mask", kept, len(x))
	}
	if got := b.ToHost(b.DropoutOperand(xs, 0.5, 3)); !slices.Equal(got, want) {
		t.Fatalf("DropoutOperand %v, Dropout %v", got, want)
	}
	ys := b.FromHost(y, len(y))
	b.DropoutAdd(ys, xs, 0.5, 3)
	for i, v := range b.ToHost(ys) {
		if v != 10+want[i] {
			t.Fatalf("DropoutAdd element %d: %g, want %g", i, v, 10+want[i])
		}
	}
}
