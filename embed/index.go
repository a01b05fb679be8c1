package embed

import (
	"fmt"
	"runtime"
	"slices"
	"sync"

	"github.com/agemem/agemem/kernels"
	"github.com/agemem/agemem/kernels/vec"
)

// Hit is one search result: a row of the index and its cosine similarity.
type Hit struct {
	Row   int
	Score float32
}

// Index is an exact cosine top-k index (Eq. 8-9) over rows stored
// contiguously and L2-normalised, so a score is one dot product. Search
// splits the rows across cores; each worker keeps a bounded min-heap, so the
// scan allocates nothing. With OnDevice, large indexes are searched on a
// GPU instead. Index is not safe for concurrent mutation; Search may run
// concurrently with other Searches.
type Index struct {
	dim  int
	data []float32
	pool sync.Pool // *scratch
	dev  *mirror
}

// DeviceMinFloats is the index size (rows × dimension) from which Search
// runs on the device given to OnDevice: below it a core scans the rows in
// less time than a kernel launch and two copies take.
const DeviceMinFloats = 1 << 20

// mirror is the index's rows on a device that selects top-k there. Rows
// are copied lazily, before a search, and only those changed since the
// last one.
type mirror struct {
	mu     sync.Mutex
	be     kernels.TopKer
	rows   kernels.Tensor // [capacity, dim]
	synced int            // device rows [0, synced) equal the host's
}

// OnDevice makes Search select on be (cosine scores as one matrix product,
// then a top-k kernel) whenever the index holds at least DeviceMinFloats
// and k is at most kernels.MaxTopK.
func (x *Index) OnDevice(be kernels.TopKer) { x.dev = &mirror{be: be} }

// stale marks device rows from row on as out of date.
func (x *Index) stale(row int) {
	if x.dev != nil {
		x.dev.mu.Lock()
		x.dev.synced = min(x.dev.synced, row)
		x.dev.mu.Unlock()
	}
}

type scratch struct {
	q     []float32
	heaps [][]Hit
}

// NewIndex returns an empty index of dimension dim.
func NewIndex(dim int) *Index { return &Index{dim: dim} }

// Dim is the vector dimension.
func (x *Index) Dim() int { return x.dim }

// Len is the number of rows.
func (x *Index) Len() int { return len(x.data) / max(x.dim, 1) }

// Add appends v (normalised on the way in) and returns its row.
func (x *Index) Add(v []float32) (int, error) {
	if len(v) != x.dim {
		return 0, fmt.Errorf("index: vector has dimension %d, index has %d", len(v), x.dim)
	}
	row := x.Len()
	x.data = append(x.data, v...)
	Normalize(x.data[row*x.dim:])
	return row, nil
}

// Set replaces row's vector.
func (x *Index) Set(row int, v []float32) error {
	if len(v) != x.dim {
		return fmt.Errorf("index: vector has dimension %d, index has %d", len(v), x.dim)
	}
	dst := x.data[row*x.dim : (row+1)*x.dim]
	copy(dst, v)
	Normalize(dst)
	x.stale(row)
	return nil
}

// SwapRemove deletes row by moving the last row into its place, the same
// move a caller makes on its parallel slices.
func (x *Index) SwapRemove(row int) {
	last := x.Len() - 1
	copy(x.data[row*x.dim:(row+1)*x.dim], x.data[last*x.dim:])
	x.data = x.data[:last*x.dim]
	x.stale(row)
}

// Row returns row's stored (normalised) vector.
func (x *Index) Row(row int) []float32 { return x.data[row*x.dim : (row+1)*x.dim] }

// parallelMin is the number of floats below which one core scans alone:
// starting goroutines costs more than it saves.
const parallelMin = 1 << 18

// Search returns the k rows most similar to q, best first (ties: lower row
// first). keep, if not nil, skips rows for which it returns false (the
// metadata filter of Retrieve_memory).
func (x *Index) Search(q []float32, k int, keep func(row int) bool) ([]Hit, error) {
	if len(q) != x.dim {
		return nil, fmt.Errorf("index: query has dimension %d, index has %d", len(q), x.dim)
	}
	n := x.Len()
	if k <= 0 || n == 0 {
		return nil, nil
	}
	k = min(k, n)
	if x.dev != nil && len(x.data) >= DeviceMinFloats && k <= kernels.MaxTopK {
		q = append([]float32(nil), q...)
		Normalize(q)
		if hits, ok, err := x.searchDevice(q, k, keep); ok || err != nil {
			return hits, err
		}
	}
	workers := 1
	if len(x.data) >= parallelMin {
		workers = min(runtime.GOMAXPROCS(0), n)
	}
	s, _ := x.pool.Get().(*scratch)
	if s == nil {
		s = &scratch{}
	}
	s.q = append(s.q[:0], q...)
	Normalize(s.q)
	for len(s.heaps) < workers {
		s.heaps = append(s.heaps, nil)
	}
	for w := range workers {
		if cap(s.heaps[w]) < k {
			s.heaps[w] = make([]Hit, 0, k)
		}
		s.heaps[w] = s.heaps[w][:0]
	}
	if workers == 1 {
		s.heaps[0] = x.scan(s.q, 0, n, k, keep, s.heaps[0])
	} else {
		var wg sync.WaitGroup
		chunk := (n + workers - 1) / workers
		for w := range workers {
			lo, hi := w*chunk, min((w+1)*chunk, n)
			wg.Go(func() { s.heaps[w] = x.scan(s.q, lo, hi, k, keep, s.heaps[w]) })
		}
		wg.Wait()
	}
	merged := make([]Hit, 0, k)
	for w := range workers {
		for _, h := range s.heaps[w] {
			merged = pushTopK(merged, k, h)
		}
	}
	x.pool.Put(s)
	sortHits(merged)
	return merged, nil
}

// searchDevice selects on the device. With a filter it asks for the most
// rows the kernel gives and filters them; ok is false when fewer than k
// pass and rows were left unseen, and the caller scans instead.
func (x *Index) searchDevice(q []float32, k int, keep func(row int) bool) (hits []Hit, ok bool, err error) {
	m, n, d := x.dev, x.Len(), x.dim
	m.mu.Lock()
	defer m.mu.Unlock()
	capacity := 0
	if m.rows != nil {
		capacity = m.rows.Shape()[0]
	}
	if capacity < n {
		m.rows, m.synced = m.be.Zeros(max(n, capacity+capacity/4), d), 0
	}
	if m.synced < n {
		m.be.CopyRows(m.rows, m.synced, m.be.FromHost(x.data[m.synced*d:n*d], n-m.synced, d), 0, n-m.synced)
		m.synced = n
	}
	want := k
	if keep != nil {
		want = min(n, kernels.MaxTopK)
	}
	rows, scores, err := m.be.TopK(m.be.Rows(m.rows, 0, n), m.be.FromHost(q, 1, d), want)
	if err != nil {
		return nil, false, err
	}
	for i, r := range rows[0] {
		if len(hits) < k && (keep == nil || keep(r)) {
			hits = append(hits, Hit{r, scores[0][i]})
		}
	}
	return hits, len(hits) == k || want == n, nil
}

// scan scores rows [lo, hi) into heap h (a min-heap of at most k hits).
func (x *Index) scan(q []float32, lo, hi, k int, keep func(int) bool, h []Hit) []Hit {
	d := x.dim
	for r := lo; r < hi; r++ {
		if keep != nil && !keep(r) {
			continue
		}
		s := vec.Dot(q, x.data[r*d:(r+1)*d])
		if len(h) == k && !better(Hit{r, s}, h[0]) {
			continue
		}
		h = pushTopK(h, k, Hit{r, s})
	}
	return h
}

// better orders hits: higher score first, then lower row.
func better(a, b Hit) bool {
	if a.Score != b.Score {
		return a.Score > b.Score
	}
	return a.Row < b.Row
}

// pushTopK inserts hit into the min-heap h bounded at k (root = worst kept).
func pushTopK(h []Hit, k int, hit Hit) []Hit {
	if len(h) < k {
		h = append(h, hit)
		for i := len(h) - 1; i > 0; {
			p := (i - 1) / 2
			if !better(h[p], h[i]) {
				break
			}
			h[p], h[i] = h[i], h[p]
			i = p
		}
		return h
	}
	if !better(hit, h[0]) {
		return h
	}
	h[0] = hit
	for i := 0; ; {
		l, r, w := 2*i+1, 2*i+2, i
		if l < len(h) && better(h[w], h[l]) {
			w = l
		}
		if r < len(h) && better(h[w], h[r]) {
			w = r
		}
		if w == i {
			break
		}
		h[i], h[w] = h[w], h[i]
		i = w
	}
	return h
}

func sortHits(h []Hit) {
	slices.SortFunc(h, func(a, b Hit) int {
		if better(a, b) {
			return -1
		}
		if better(b, a) {
			return 1
		}
		return 0
	})
}
