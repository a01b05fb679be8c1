package ltm

import (
	"cmp"
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"time"

	"github.com/agemem/agemem/embed"
)

// MemStore is an in-memory Store: one per rollout, created in microseconds.
// Ids come from a seeded generator, so a rollout replays exactly.
type MemStore struct {
	mu      sync.RWMutex
	entries []Entry // parallel to idx rows
	byID    map[string]int
	seq     map[string]uint64 // insertion order, for List
	next    uint64
	idx     *embed.Index
	rng     *rand.Rand
	now     func() time.Time
}

// NewMemStore returns an empty store whose ids derive from seed.
func NewMemStore(seed uint64) *MemStore {
	return &MemStore{byID: map[string]int{}, seq: map[string]uint64{}, rng: rand.New(rand.NewPCG(seed, 0x6167656d)), now: time.Now}
}

func (m *MemStore) newID() string {
	for {
		id := formatID(m.rng.Uint32())
		if _, taken := m.byID[id]; !taken {
			return id
		}
	}
}

// Add implements Store.
func (m *MemStore) Add(_ context.Context, e Entry) (Entry, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	dim := 0
	if m.idx != nil {
		dim = m.idx.Dim()
	}
	if err := checkEmbedding(e.Embedding, dim); err != nil {
		return Entry{}, fmt.Errorf("add memory: %w", err)
	}
	md, err := normalizeMetadata(e.Metadata)
	if err != nil {
		return Entry{}, fmt.Errorf("add memory: %w", err)
	}
	if m.idx == nil {
		m.idx = embed.NewIndex(len(e.Embedding))
	}
	e.ID = m.newID()
	e.Metadata = md
	e.Embedding = unit(e.Embedding)
	e.Created = m.now().UTC()
	e.Updated = e.Created
	if _, err := m.idx.Add(e.Embedding); err != nil {
		return Entry{}, err
	}
	m.byID[e.ID] = len(m.entries)
	m.seq[e.ID] = m.next
	m.next++
	m.entries = append(m.entries, e)
	return cloneEntry(e), nil
}

// Update implements Store.
func (m *MemStore) Update(_ context.Context, id, content string, embedding []float32, metadata map[string]any) (Entry, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	i, ok := m.byID[id]
	if !ok {
		return Entry{}, fmt.Errorf("update %s: %w", id, ErrNotFound)
	}
	if err := checkEmbedding(embedding, m.idx.Dim()); err != nil {
		return Entry{}, fmt.Errorf("update %s: %w", id, err)
	}
	e := m.entries[i]
	if metadata != nil {
		md, err := normalizeMetadata(metadata)
		if err != nil {
			return Entry{}, fmt.Errorf("update %s: %w", id, err)
		}
		e.Metadata = md
	}
	e.Content = content
	e.Embedding = unit(embedding)
	e.Updated = m.now().UTC()
	if err := m.idx.Set(i, e.Embedding); err != nil {
		return Entry{}, err
	}
	m.entries[i] = e
	return cloneEntry(e), nil
}

// Delete implements Store. The rows after id move up one, so that rows
// stay in insertion order: Retrieve breaks ties by row, and every store
// breaks them by insertion order.
func (m *MemStore) Delete(_ context.Context, id string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	i, ok := m.byID[id]
	if !ok {
		return fmt.Errorf("delete %s: %w", id, ErrNotFound)
	}
	for r := i; r+1 < len(m.entries); r++ {
		m.entries[r] = m.entries[r+1]
		m.byID[m.entries[r].ID] = r
		if err := m.idx.Set(r, m.entries[r].Embedding); err != nil {
			return err
		}
	}
	m.idx.SwapRemove(len(m.entries) - 1)
	m.entries = m.entries[:len(m.entries)-1]
	delete(m.byID, id)
	delete(m.seq, id)
	return nil
}

// Get implements Store.
func (m *MemStore) Get(_ context.Context, id string) (Entry, error) {
	m.mu.RLock()
	defer m.mu.RUnlock()
	i, ok := m.byID[id]
	if !ok {
		return Entry{}, fmt.Errorf("get %s: %w", id, ErrNotFound)
	}
	return cloneEntry(m.entries[i]), nil
}

// Retrieve implements Store.
func (m *MemStore) Retrieve(_ context.Context, query []float32, topK int, filter map[string]any) ([]Scored, error) {
	m.mu.RLock()
	defer m.mu.RUnlock()
	if m.idx == nil || len(m.entries) == 0 {
		return nil, nil
	}
	f, err := normalizeMetadata(filter)
	if err != nil {
		return nil, fmt.Errorf("retrieve: filter: %w", err)
	}
	var keep func(int) bool
	if len(f) > 0 {
		keep = func(r int) bool { return matchesNormalized(m.entries[r], f) }
	}
	hits, err := m.idx.Search(query, topK, keep)
	if err != nil {
		return nil, fmt.Errorf("retrieve: %w", err)
	}
	out := make([]Scored, len(hits))
	for i, h := range hits {
		out[i] = Scored{Entry: cloneEntry(m.entries[h.Row]), Score: float64(h.Score)}
	}
	return out, nil
}

// List implements Store.
func (m *MemStore) List(_ context.Context) ([]Entry, error) {
	m.mu.RLock()
	defer m.mu.RUnlock()
	out := make([]Entry, len(m.entries))
	for i, e := range m.entries {
		out[i] = cloneEntry(e)
	}
	slices.SortFunc(out, func(a, b Entry) int { return cmp.Compare(m.seq[a.ID], m.seq[b.ID]) })
	return out, nil
}

// Count implements Store.
func (m *MemStore) Count(_ context.Context) (int, error) {
	m.mu.RLock()
	defer m.mu.RUnlock()
	return len(m.entries), nil
}

func cloneEntry(e Entry) Entry {
	e.Embedding = slices.Clone(e.Embedding)
	if e.Metadata != nil {
		md := make(map[string]any, len(e.Metadata))
		for k, v := range e.Metadata {
			md[k] = v
		}
		e.Metadata = md
	}
	return e
}
