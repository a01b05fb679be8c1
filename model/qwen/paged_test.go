package qwen

import (
	"errors"
	"slices"
	"testing"

	"github.com/agemem/agemem/kernels"
	"github.com/agemem/agemem/kernels/cpu"
	"github.com/agemem/agemem/model/safetensors"
)

// TestPagedCacheMatchesContiguous: a sequence whose keys and values live
// in a pool's blocks gets the contiguous cache's logits bit for bit, fed in
// chunks across block boundaries and a token at a time; clones of a paged
// prompt share its blocks until they write (then the partly filled block
// is copied, and neither sees the other's tokens); releasing every cache
// gives every block back; a pool too small fails with ErrPoolFull and
// takes nothing; Fill carries a prefix between the layouts.
// Both ways a backend attends over a paged cache are held to it: the CPU
// backend's block-table attention (kernels.PagedAttender) and, with that
// hidden, gathering the rows first (what backends without one do).
func TestPagedCacheMatchesContiguous(t *testing.T) {
	t.Run("block table", func(t *testing.T) { checkPaged(t, cpu.New()) })
	t.Run("gathered", func(t *testing.T) { checkPaged(t, gatherOnly{cpu.New()}) })
}

// gatherOnly is a backend without PagedAttention.
type gatherOnly struct{ kernels.Backend }

func checkPaged(t *testing.T, be kernels.Backend) {
	cfg := Presets["tiny-qwen3"]
	m, err := FromTensors(be, cfg, MapOf(RandomTensors(cfg, safetensors.BF16, 3)))
	if err != nil {
		t.Fatal(err)
	}
	ids := func(lo, hi int) []int {
		out := make([]int, hi-lo)
		for i := range out {
			out[i] = ((lo+i)*7919 + 13) % cfg.VocabSize
		}
		return out
	}
	same := func(what string, a, b *Cache, toks []int) {
		t.Helper()
		la, err := m.ForwardBatch([][]int{toks}, []*Cache{a})
		if err != nil {
			t.Fatal(what, err)
		}
		la[0] = slices.Clone(la[0]) // the next forward may reuse the buffer
		lb, err := m.ForwardBatch([][]int{toks}, []*Cache{b})
		if err != nil {
			t.Fatal(what, err)
		}
		if !slices.Equal(la[0], lb[0]) {
			t.Fatalf("%s: the paged cache's logits differ from the contiguous cache's", what)
		}
	}
	const bs, maxT = 8, 200
	pool, err := m.NewPool(40, bs)
	if err != nil {
		t.Fatal(err)
	}
	paged, flat := m.NewPagedCache(pool, maxT), m.NewCache(maxT)
	same("a 13-token prompt", paged, flat, ids(0, 13))
	same("a 20-token chunk", paged, flat, ids(13, 33))
	for p := 33; p < 45; p++ {
		same("a token at a time", paged, flat, ids(p, p+1))
	}
	if want := (45 + bs - 1) / bs; len(paged.blocks) != want || pool.Free() != 40-want {
		t.Fatalf("45 positions hold %d blocks (%d free), want %d", len(paged.blocks), pool.Free(), want)
	}

	// Two clones share all 6 blocks; writing copies the partly filled one.
	a, b := paged.Clone(), paged.Clone()
	if pool.Free() != 40-6 || a.BlocksNeeded(1) != 1 || a.BlocksNeeded(3) != 1 || a.BlocksNeeded(4) != 2 {
		t.Fatalf("clones: %d free, need %d/%d/%d blocks for 1/3/4 positions (want 34 free, 1, 1, 2)", pool.Free(), a.BlocksNeeded(1), a.BlocksNeeded(3), a.BlocksNeeded(4))
	}
	fa, fb := flat.Clone(), flat.Clone()
	same("clone a", a, fa, ids(100, 102))
	same("clone b", b, fb, ids(200, 205))
	same("clone a again", a, fa, ids(102, 103))
	same("the original after its clones wrote", paged, flat, ids(45, 46))
	a.Release()
	b.Release()
	paged.Release()
	if pool.Free() != 40 || pool.Peak() < 9 {
		t.Fatalf("after releasing every cache %d of 40 blocks are free (peak %d)", pool.Free(), pool.Peak())
	}

	small, _ := m.NewPool(2, bs)
	c := m.NewPagedCache(small, maxT)
	same("a sequence filling the small pool", c, m.NewCache(maxT), ids(0, 16))
	if _, err := m.ForwardLast([][]int{ids(16, 17)}, []*Cache{c}); !errors.Is(err, ErrPoolFull) {
		t.Fatalf("a 17th position in a pool of 16: %v, want ErrPoolFull", err)
	}
	if c.Len != 16 || small.Free() != 0 || len(c.blocks) != 2 {
		t.Fatalf("the refused forward changed the cache: %d positions, %d blocks, %d free", c.Len, len(c.blocks), small.Free())
	}

	// A contiguous prefix continued paged, and back.
	src := m.NewCache(maxT)
	if _, err := m.ForwardLast([][]int{ids(0, 30)}, []*Cache{src}); err != nil {
		t.Fatal(err)
	}
	p2 := m.NewPagedCache(pool, maxT)
	if err := p2.Fill(src, 21); err != nil {
		t.Fatal(err)
	}
	f2 := m.NewCache(maxT)
	if err := f2.Fill(p2, 21); err != nil {
		t.Fatal(err)
	}
	ref := m.NewCache(maxT)
	if _, err := m.ForwardLast([][]int{ids(0, 21)}, []*Cache{ref}); err != nil {
		t.Fatal(err)
	}
	same("paged from a contiguous prefix", p2, ref.Clone(), ids(21, 30))
	same("contiguous from a paged prefix", f2, ref, ids(21, 30))
	if err := f2.Fill(src, 3); err == nil {
		t.Fatal("filling a cache that holds positions: no error")
	}
}
