package embed

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/agemem/agemem/kernels/cpu"
)

// TestIndexOnDeviceMatchesScan keeps two indexes through the same
// mutations, one searched on a device (the CPU backend, which selects the
// way the GPU does: one product, then top-k) and one scanned, and compares
// every search: plain, filtered, filtered so tightly the device's
// candidates run out, k beyond the kernel's limit, and after rows were
// replaced, removed and added past the device copy's capacity.
func TestIndexOnDeviceMatchesScan(t *testing.T) {
	const d = 64
	rows := DeviceMinFloats / d
	r := rand.New(rand.NewPCG(11, 12))
	vec := func() []float32 {
		v := make([]float32, d)
		for i := range v {
			v[i] = float32(r.NormFloat64())
		}
		return v
	}
	dev, host := NewIndex(d), NewIndex(d)
	dev.OnDevice(cpu.New())
	add := func(n int) {
		for range n {
			v := vec()
			dev.Add(v)
			host.Add(v)
		}
	}
	compare := func(what string, k int, keep func(int) bool) {
		t.Helper()
		q := vec()
		got, err := dev.Search(q, k, keep)
		if err != nil {
			t.Fatal(err)
		}
		want, _ := host.Search(q, k, keep)
		if len(got) != len(want) {
			t.Fatalf("%s: %d hits, the scan %d", what, len(got), len(want))
		}
		for i := range want {
			if got[i].Row != want[i].Row || math.Abs(float64(got[i].Score-want[i].Score)) > 1e-5 {
				t.Fatalf("%s: hit %d is %+v, the scan's %+v", what, i, got[i], want[i])
			}
		}
	}
	add(rows - 1)
	compare("below the device threshold", 5, nil) // scanned on both
	if dev.dev.rows != nil {
		t.Fatal("an index below DeviceMinFloats was copied to the device")
	}
	add(1)
	compare("plain", 10, nil)
	if dev.dev.synced != rows {
		t.Fatalf("device holds %d of %d rows after a search", dev.dev.synced, rows)
	}
	compare("filtered", 7, func(row int) bool { return row%2 == 0 })
	compare("filtered past the device's candidates", 20, func(row int) bool { return row%1000 == 0 })
	compare("k above kernels.MaxTopK", 100, nil)
	for _, row := range []int{3, rows / 2, rows - 1} {
		v := vec()
		dev.Set(row, v)
		host.Set(row, v)
	}
	dev.SwapRemove(17)
	host.SwapRemove(17)
	compare("after Set and SwapRemove", 10, nil)
	add(rows / 2) // beyond the device copy's capacity
	compare("after growing", 10, nil)
	// A query equal to a stored row finds it first, on the device.
	hits, _ := dev.Search(dev.Row(rows+5), 1, nil)
	if hits[0].Row != rows+5 || math.Abs(float64(hits[0].Score)-1) > 1e-5 {
		t.Fatalf("stored row as query: %+v", hits[0])
	}
}
