package qwen

import (
	"slices"
	"testing"

	"github.com/agemem/agemem/kernels/cpu"
	"github.com/agemem/agemem/model/safetensors"
)

// TestCacheGrowsAsUsed: a cache holds room for what its sequence used (a
// power-of-two multiple of 256 positions, never more than Max), and a
// sequence fed across the growth points, in chunks and a token at a time,
// gets the same logits, bit for bit, as one whose cache had its full room
// from the start. A clone holds what is filled, and grows on its own.
func TestCacheGrowsAsUsed(t *testing.T) {
	cfg := Presets["tiny-qwen3"]
	m, err := FromTensors(cpu.New(), cfg, MapOf(RandomTensors(cfg, safetensors.BF16, 3)))
	if err != nil {
		t.Fatal(err)
	}
	const maxT = 1500
	grow, full := m.NewCache(maxT), m.NewCache(maxT)
	full.Reserve(maxT)
	if grow.Cap() != 256 || full.Cap() != maxT {
		t.Fatalf("room: new %d (want 256), reserved %d (want %d)", grow.Cap(), full.Cap(), maxT)
	}
	ids := func(lo, hi int) []int {
		out := make([]int, hi-lo)
		for i := range out {
			out[i] = ((lo+i)*7919 + 13) % cfg.VocabSize
		}
		return out
	}
	// A 200-token prompt, a 300-token chunk (past 256), then single tokens
	// past 512 and 1024.
	steps := [][2]int{{0, 200}, {200, 500}}
	for p := 500; p < 1100; p++ {
		steps = append(steps, [2]int{p, p + 1})
	}
	for _, st := range steps {
		a, err := m.ForwardLast([][]int{ids(st[0], st[1])}, []*Cache{grow})
		if err != nil {
			t.Fatal(err)
		}
		b, err := m.ForwardLast([][]int{ids(st[0], st[1])}, []*Cache{full})
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(a[0], b[0]) {
			t.Fatalf("positions %d-%d: logits differ between a growing and a full cache", st[0], st[1])
		}
		if want := 256; grow.Len > 256 {
			for want < grow.Len {
				want *= 2
			}
			if want = min(want, maxT); grow.Cap() != want {
				t.Fatalf("after %d positions the cache has room for %d, want %d", grow.Len, grow.Cap(), want)
			}
		}
	}
	c := grow.Clone()
	if c.Len != grow.Len || c.Cap() != grow.Len {
		t.Fatalf("clone: %d filled, room %d; want %d and %d", c.Len, c.Cap(), grow.Len, grow.Len)
	}
	a, _ := m.ForwardLast([][]int{{5}}, []*Cache{c})
	b, _ := m.ForwardLast([][]int{{5}}, []*Cache{full})
	if !slices.Equal(a[0], b[0]) || c.Cap() != maxT {
		t.Fatalf("the clone's next token: logits equal %v, room %d (want %d)", slices.Equal(a[0], b[0]), c.Cap(), maxT)
	}
	if _, err := m.ForwardLast([][]int{ids(0, maxT)}, []*Cache{c}); err == nil {
		t.Fatal("feeding past Max: no error")
	}
}
