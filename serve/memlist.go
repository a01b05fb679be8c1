package serve

import (
	"context"
	"slices"
	"sync"
	"time"

	"github.com/agemem/agemem/memtools/ltm"
)

// lists keeps each namespace's memories (without embeddings) in memory for
// the console's list pages: ltm.Store lists a namespace only whole, and
// reading 10,000 memories back from SQLite takes a few hundred
// milliseconds, far above what a page may. The server's own writes (the
// memory API, the console, the agent's tools in chat) patch the list as
// they happen; a page re-reads it when the namespace's count moved (another
// process added or deleted) and, in the background, serve.console.list_refresh
// after the last read (another process may have edited a memory).
type lists struct {
	mu  sync.Mutex
	m   map[string]*nsList
	ttl time.Duration
	now func() time.Time
}

// maxLists bounds the namespaces kept (the least recently viewed go).
const maxLists = 64

type nsList struct {
	mu      sync.Mutex
	entries []ltm.Entry // oldest first, as List returns them
	at      map[string]int
	loaded  time.Time
	viewed  time.Time
	valid   bool
	gen     uint64 // bumped by every patch: a reload that saw a write happen under it is discarded
	loading bool
}

func newLists(ttl time.Duration) *lists {
	return &lists{m: map[string]*nsList{}, ttl: ttl, now: time.Now}
}

func (ls *lists) get(ns string, create bool) *nsList {
	ls.mu.Lock()
	defer ls.mu.Unlock()
	l := ls.m[ns]
	if l == nil && create {
		if len(ls.m) >= maxLists {
			var oldest string
			var at time.Time
			for k, x := range ls.m {
				if v := x.viewedAt(); oldest == "" || v.Before(at) {
					oldest, at = k, v
				}
			}
			delete(ls.m, oldest)
		}
		l = &nsList{}
		ls.m[ns] = l
	}
	return l
}

func (l *nsList) viewedAt() time.Time {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.viewed
}

// page is ns's memories newest first from offset, at most limit, and how
// many there are.
func (ls *lists) page(ctx context.Context, st ltm.Store, ns string, offset, limit int) ([]ltm.Entry, int, error) {
	n, err := st.Count(ctx)
	if err != nil {
		return nil, 0, err
	}
	l := ls.get(ns, true)
	l.mu.Lock()
	fresh := l.valid && len(l.entries) == n
	l.mu.Unlock()
	if !fresh {
		if err := ls.load(ctx, st, l); err != nil {
			return nil, 0, err
		}
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.viewed = ls.now()
	if l.valid && !l.loading && ls.now().Sub(l.loaded) > ls.ttl {
		l.loading = true
		go func() {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			ls.load(ctx, st, l)
		}()
	}
	total := len(l.entries)
	var out []ltm.Entry
	for i := total - 1 - offset; i >= 0 && len(out) < limit; i-- {
		out = append(out, l.entries[i])
	}
	return out, total, nil
}

// load reads ns whole into l, unless a write patched l meanwhile.
func (ls *lists) load(ctx context.Context, st ltm.Store, l *nsList) error {
	l.mu.Lock()
	gen := l.gen
	l.mu.Unlock()
	all, err := st.List(ctx)
	l.mu.Lock()
	defer l.mu.Unlock()
	l.loading = false
	if err != nil {
		return err
	}
	for i := range all {
		all[i].Embedding = nil
	}
	if l.gen != gen && l.valid {
		return nil // a write landed during the read; the patched list stands
	}
	l.entries, l.at, l.loaded, l.valid = all, make(map[string]int, len(all)), ls.now(), true
	for i, e := range all {
		l.at[e.ID] = i
	}
	return nil
}

// patch applies one of the server's own writes to ns's list, if it is kept.
func (ls *lists) patch(ns string, f func(l *nsList)) {
	l := ls.get(ns, false)
	if l == nil {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.gen++
	if l.valid {
		f(l)
	}
}

// forget drops ns's list (an import wrote many memories at once).
func (ls *lists) forget(ns string) {
	ls.patch(ns, func(l *nsList) { l.valid = false })
}

// track wraps a namespace's store so that its writes patch the list.
func (ls *lists) track(ns string, st ltm.Store) ltm.Store { return tracked{st, ns, ls} }

type tracked struct {
	ltm.Store
	ns string
	ls *lists
}

func (t tracked) Add(ctx context.Context, e ltm.Entry) (ltm.Entry, error) {
	out, err := t.Store.Add(ctx, e)
	if err == nil {
		t.ls.patch(t.ns, func(l *nsList) {
			c := out
			c.Embedding = nil
			l.at[c.ID] = len(l.entries)
			l.entries = append(l.entries, c)
		})
	}
	return out, err
}

func (t tracked) Update(ctx context.Context, id, content string, embedding []float32, metadata map[string]any) (ltm.Entry, error) {
	out, err := t.Store.Update(ctx, id, content, embedding, metadata)
	if err == nil {
		t.ls.patch(t.ns, func(l *nsList) {
			i, ok := l.at[id]
			if !ok {
				l.valid = false
				return
			}
			c := out
			c.Embedding = nil
			l.entries[i] = c
		})
	}
	return out, err
}

func (t tracked) Delete(ctx context.Context, id string) error {
	err := t.Store.Delete(ctx, id)
	if err == nil {
		t.ls.patch(t.ns, func(l *nsList) {
			i, ok := l.at[id]
			if !ok {
				l.valid = false
				return
			}
			l.entries = slices.Delete(l.entries, i, i+1)
			delete(l.at, id)
			for j := i; j < len(l.entries); j++ {
				l.at[l.entries[j].ID] = j
			}
		})
	}
	return err
}
