package ring

import (
	"context"
	"math/rand/v2"
	"net"
	"strings"
	"sync"
	"testing"
	"time"
)

// rings connects n ranks on loopback, each in its own goroutine.
func rings(t testing.TB, n int, timeout time.Duration) []*Ring {
	t.Helper()
	lns := make([]net.Listener, n)
	addrs := make([]string, n)
	for i := range lns {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		lns[i], addrs[i] = ln, ln.Addr().String()
	}
	rs := make([]*Ring, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			rs[i], errs[i] = Dial(context.Background(), Options{Rank: i, Addrs: addrs, Listener: lns[i], RunID: "test", Timeout: timeout})
		})
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("rank %d: %v", i, err)
		}
	}
	t.Cleanup(func() {
		for _, r := range rs {
			r.Close()
		}
	})
	return rs
}

// sumAll runs SumFloat32 on every rank at once.
func sumAll(rs []*Ring, bufs [][]float32) []error {
	errs := make([]error, len(rs))
	var wg sync.WaitGroup
	for i, r := range rs {
		wg.Go(func() { errs[i] = r.SumFloat32(bufs[i]) })
	}
	wg.Wait()
	return errs
}

// TestSumMatchesTheRingOrder: every rank ends with the same sum, each
// chunk added in the ring's order from the chunk's own rank, for buffer
// lengths shorter than the ring, not dividing it, and spanning several
// segments; with two ranks that is the host reducer's a+b, bit for bit.
func TestSumMatchesTheRingOrder(t *testing.T) {
	for _, n := range []int{1, 2, 3, 4} {
		rs := rings(t, n, 5*time.Second)
		for _, size := range []int{1, 3, 1000, 3*segment/4 + 7} {
			rng := rand.New(rand.NewPCG(uint64(n), uint64(size)))
			in := make([][]float32, n)
			bufs := make([][]float32, n)
			for r := range n {
				in[r] = make([]float32, size)
				for i := range in[r] {
					in[r][i] = float32(rng.NormFloat64()) * 1e3
				}
				bufs[r] = append([]float32(nil), in[r]...)
			}
			for r, err := range sumAll(rs, bufs) {
				if err != nil {
					t.Fatalf("%d ranks, %d values: rank %d: %v", n, size, r, err)
				}
			}
			for i := range size {
				c := 0
				for c+1 < n && i >= (c+1)*size/n {
					c++
				}
				want := in[c][i]
				for k := 1; k < n; k++ {
					want += in[(c+k)%n][i]
				}
				for r := range n {
					if bufs[r][i] != want {
						t.Fatalf("%d ranks, %d values: rank %d value %d = %v, want %v", n, size, r, i, bufs[r][i], want)
					}
				}
				if n == 2 && bufs[0][i] != in[0][i]+in[1][i] {
					t.Fatalf("two ranks: value %d is not g0+g1", i)
				}
			}
		}
	}
}

// TestADeadPeerIsNamed: a rank that exits mid-run fails the others' next
// collective at once; the rank it fed names it (the others name the
// neighbour that gave up: the control plane's heartbeats name the dead
// rank to all of them).
func TestADeadPeerIsNamed(t *testing.T) {
	rs := rings(t, 3, 5*time.Second)
	rs[1].Close()
	start := time.Now()
	errs := make([]error, 2)
	var wg sync.WaitGroup
	for i, r := range []*Ring{rs[0], rs[2]} {
		wg.Go(func() { errs[i] = r.SumFloat32(make([]float32, 1000)) })
	}
	wg.Wait()
	if time.Since(start) > 4*time.Second {
		t.Fatalf("a closed peer took %v to notice: it should not wait for the timeout", time.Since(start))
	}
	if errs[0] == nil {
		t.Fatal("rank 0 ran a collective without rank 1")
	}
	if errs[1] == nil || !strings.Contains(errs[1].Error(), "from rank 1") || !strings.Contains(errs[1].Error(), "exited") {
		t.Fatalf("rank 2: %v, want an error naming rank 1 as exited", errs[1])
	}
}

// TestAHungPeerTimesOut: a rank that stays connected but never joins the
// collective fails the others after the timeout, named as hanging.
func TestAHungPeerTimesOut(t *testing.T) {
	rs := rings(t, 2, 300*time.Millisecond)
	err := rs[0].SumFloat32(make([]float32, 4*segment))
	if err == nil || !strings.Contains(err.Error(), "rank 1") || !strings.Contains(err.Error(), "hangs") {
		t.Fatalf("%v, want rank 1 named as hanging", err)
	}
	if err2 := rs[0].SumFloat32(make([]float32, 8)); err2 == nil {
		t.Fatal("a failed ring ran another collective")
	}
}

// TestAStrangerIsRefused: a connection from another run (or a port
// scanner) is dropped, and the right peer still joins.
func TestAStrangerIsRefused(t *testing.T) {
	lns := make([]net.Listener, 2)
	addrs := make([]string, 2)
	for i := range lns {
		lns[i], _ = net.Listen("tcp", "127.0.0.1:0")
		addrs[i] = lns[i].Addr().String()
	}
	c, err := net.Dial("tcp", addrs[1])
	if err != nil {
		t.Fatal(err)
	}
	writeHello(c, "another-run", 0)
	defer c.Close()
	rs := make([]*Ring, 2)
	var wg sync.WaitGroup
	for i := range 2 {
		wg.Go(func() {
			rs[i], err = Dial(context.Background(), Options{Rank: i, Addrs: addrs, Listener: lns[i], RunID: "mine", Timeout: 3 * time.Second})
		})
	}
	wg.Wait()
	if rs[0] == nil || rs[1] == nil {
		t.Fatalf("the ring did not form past a stranger: %v", err)
	}
	bufs := [][]float32{{1, 2}, {3, 4}}
	for _, err := range sumAll(rs, bufs) {
		if err != nil {
			t.Fatal(err)
		}
	}
	if bufs[1][0] != 4 || bufs[1][1] != 6 {
		t.Fatalf("sum %v", bufs[1])
	}
}
