package qwen

import (
	"errors"
	"fmt"

	"github.com/agemem/agemem/kernels"
)

// ErrPoolFull is a paged cache that needs a block its pool does not have.
var ErrPoolFull = errors.New("qwen: the KV block pool is full")

// Pool is a key/value store that many sequences' caches share in blocks of
// BlockSize positions (vLLM's PagedAttention layout): a paged cache holds
// the blocks its positions fill, so a batch of rollouts holds what its live
// sequences use, and caches cloned from one prompt share its blocks (a
// block is copied only when a clone writes into one it shares). The pool's
// size is the memory budget: a sequence that needs a block the pool does
// not have waits (decode's generation preempts it and recomputes it later).
type Pool struct {
	K, V      []kernels.Tensor // per layer [blocks·BlockSize, kvHeads·headDim]
	BlockSize int
	refs      []int32 // per block, the caches holding it (0: free)
	free      []int   // free blocks, a stack
	peak      int     // the most blocks in use at once
	be        kernels.Backend
}

// NewPool allocates blocks·blockSize positions of keys and values per layer.
func (m *Model) NewPool(blocks, blockSize int) (*Pool, error) {
	if blocks < 1 || blockSize < 1 {
		return nil, fmt.Errorf("a KV pool needs at least one block of one position, got %d of %d", blocks, blockSize)
	}
	p := &Pool{BlockSize: blockSize, refs: make([]int32, blocks), be: m.B,
		K: make([]kernels.Tensor, len(m.Layers)), V: make([]kernels.Tensor, len(m.Layers))}
	for i := range p.K {
		p.K[i], p.V[i] = m.B.Zeros(blocks*blockSize, m.KVHeads*m.HeadDim), m.B.Zeros(blocks*blockSize, m.KVHeads*m.HeadDim)
	}
	for b := blocks - 1; b >= 0; b-- {
		p.free = append(p.free, b)
	}
	return p, nil
}

// Blocks is the pool's size in blocks.
func (p *Pool) Blocks() int { return len(p.refs) }

// Free is how many blocks no cache holds.
func (p *Pool) Free() int { return len(p.free) }

// Peak is the most blocks held at once since the pool was made.
func (p *Pool) Peak() int { return p.peak }

func (p *Pool) take() int {
	b := p.free[len(p.free)-1]
	p.free = p.free[:len(p.free)-1]
	p.refs[b] = 1
	p.peak = max(p.peak, len(p.refs)-len(p.free))
	return b
}

func (p *Pool) drop(b int) {
	if p.refs[b]--; p.refs[b] == 0 {
		p.free = append(p.free, b)
	}
}

// NewPagedCache makes a cache for up to maxT positions whose keys and
// values live in p's blocks; it holds none until positions arrive.
// Release gives its blocks back.
func (m *Model) NewPagedCache(p *Pool, maxT int) *Cache {
	return &Cache{Max: maxT, be: m.B, pool: p}
}

// Paged says whether the cache's positions live in a pool's blocks.
func (c *Cache) Paged() bool { return c.pool != nil }

// BlocksNeeded is how many free blocks feeding n more positions takes: the
// blocks past those held, and a copy of the last one if it is shared and
// only partly filled (the new positions would write into it). 0 for a
// contiguous cache.
func (c *Cache) BlocksNeeded(n int) int {
	if c.pool == nil {
		return 0
	}
	bs := c.pool.BlockSize
	need := max((c.Len+n+bs-1)/bs-len(c.blocks), 0)
	if c.Len%bs != 0 && n > 0 && c.pool.refs[c.blocks[c.Len/bs]] > 1 {
		need++
	}
	return need
}

// reservePaged makes the blocks of positions up to n the cache's own:
// new blocks past those held, and a private copy of the partly filled
// block it shares with a clone. It takes nothing if the pool cannot give
// it all.
func (c *Cache) reservePaged(n int) error {
	if need := c.BlocksNeeded(n - c.Len); need > c.pool.Free() {
		return fmt.Errorf("%w: %d positions need %d more blocks of %d, %d free", ErrPoolFull, n, need, c.pool.BlockSize, c.pool.Free())
	}
	p, bs := c.pool, c.pool.BlockSize
	if i := c.Len / bs; c.Len%bs != 0 && n > c.Len && p.refs[c.blocks[i]] > 1 {
		old, b := c.blocks[i], p.take()
		for l := range p.K {
			p.be.CopyRows(p.K[l], b*bs, p.K[l], old*bs, c.Len%bs)
			p.be.CopyRows(p.V[l], b*bs, p.V[l], old*bs, c.Len%bs)
		}
		p.drop(old)
		c.blocks[i] = b
	}
	for len(c.blocks)*bs < n {
		c.blocks = append(c.blocks, p.take())
	}
	return nil
}

// Release gives the cache's blocks back to its pool (a contiguous cache
// drops its tensors); the cache is empty afterwards.
func (c *Cache) Release() {
	if c.pool != nil {
		for _, b := range c.blocks {
			c.pool.drop(b)
		}
	}
	c.blocks, c.K, c.V, c.Len = nil, nil, nil, 0
}

// pagedRows are the pool rows of positions [0, n), in order.
func (c *Cache) pagedRows(n int) []int {
	bs := c.pool.BlockSize
	rows := make([]int, n)
	for j := range rows {
		rows[j] = c.blocks[j/bs]*bs + j%bs
	}
	return rows
}

// writePaged stores the keys and values of positions [c.Len, c.Len+n)
// (rows [row, row+n) of k and v) in layer li's blocks: one copy per block
// they touch.
func (c *Cache) writePaged(li int, k, v kernels.Tensor, row, n int) {
	p, bs := c.pool, c.pool.BlockSize
	for j := 0; j < n; {
		pos := c.Len + j
		m := min(n-j, bs-pos%bs)
		dst := c.blocks[pos/bs]*bs + pos%bs
		p.be.CopyRows(p.K[li], dst, k, row+j, m)
		p.be.CopyRows(p.V[li], dst, v, row+j, m)
		j += m
	}
}

// gatherPaged reads layer li's keys and values of positions rows (from
// pagedRows) into contiguous tensors for attention. The copy is what
// paging costs on a backend without a block-table attention kernel
// (kernels.PagedAttender; the CPU backend has one): one read of the
// sequence's keys and values per layer, as attention itself does.
func (c *Cache) gatherPaged(li int, rows []int) (kc, vc kernels.Tensor) {
	p := c.pool
	w := p.K[li].Shape()[1]
	kc, vc = p.be.Zeros(len(rows), w), p.be.Zeros(len(rows), w)
	p.be.Embedding(kc, p.K[li], rows)
	p.be.Embedding(vc, p.V[li], rows)
	return kc, vc
}

// Fill makes the empty cache c hold the first n positions of src (either
// kind, on the same backend and model): a prefix cached by one layout
// continued in the other.
func (c *Cache) Fill(src *Cache, n int) error {
	if c.Len != 0 {
		return fmt.Errorf("fill: the cache already holds %d positions", c.Len)
	}
	if n > src.Len {
		return fmt.Errorf("fill: %d positions asked of a cache holding %d", n, src.Len)
	}
	if err := c.Reserve(n); err != nil {
		return err
	}
	layers := len(src.K)
	var rows []int
	if src.pool != nil {
		layers, rows = len(src.pool.K), src.pagedRows(n)
	}
	for li := range layers {
		var sk, sv kernels.Tensor
		if src.pool != nil {
			sk, sv = src.gatherPaged(li, rows)
		} else {
			sk, sv = src.K[li], src.V[li]
		}
		if c.pool != nil {
			c.writePaged(li, sk, sv, 0, n)
		} else {
			c.be.CopyRows(c.K[li], 0, sk, 0, n)
			c.be.CopyRows(c.V[li], 0, sv, 0, n)
		}
	}
	c.Len = n
	return nil
}
