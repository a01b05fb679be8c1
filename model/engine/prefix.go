package engine

import (
	"slices"
	"sync"

	"github.com/agemem/agemem/model/qwen"
)

// PrefixCache keeps the key/value caches of sequences the model has
// already processed, so that a prompt that begins with one of them
// prefills only its new tokens. An agent's calls resend their whole context
// every time (the system prompt, every earlier turn, then the new one), so
// without it each call's prefill grows with the conversation; with it a
// call pays for what was added since the last. The idea of vLLM's automatic
// prefix caching and SGLang's radix cache, kept simple: a handful of live
// conversations, matched by a linear scan, least recently used out first.
//
// A cache belongs to one model's weights: after an update, make a new one.
type PrefixCache struct {
	mu      sync.Mutex
	entries []*prefixEntry // least recently used first
	rows    int            // positions held by all entries
	budget  int

	// Prompt tokens looked up and those served from the cache.
	Looked, Reused int64
}

type prefixEntry struct {
	ids   []int // the tokens whose keys and values cache holds
	cache *qwen.Cache
	// pinned entries are kept whatever the budget and shared by every
	// namespace (a system prompt); the others serve their namespace only.
	pinned    bool
	namespace string
}

// NewPrefixCache keeps entries up to budget cached positions (the
// positions their caches were allocated with, summed over entries; 0:
// 1<<16). Callers size it to the conversations they keep going at once.
func NewPrefixCache(budget int) *PrefixCache {
	if budget <= 0 {
		budget = 1 << 16
	}
	return &PrefixCache{budget: budget}
}

// Match returns the cache of namespace ns (or a pinned one) sharing the
// longest prefix with prompt and the length of that prefix, at most
// len(prompt)−1 so that the prompt keeps a token of its own to produce
// logits from; nil, 0 when nothing matches. The returned cache is shared:
// copy its rows, do not extend it.
func (pc *PrefixCache) Match(prompt []int, ns string) (*qwen.Cache, int) {
	if pc == nil {
		return nil, 0
	}
	pc.mu.Lock()
	defer pc.mu.Unlock()
	pc.Looked += int64(len(prompt))
	best, bestN := -1, 0
	for i, e := range pc.entries {
		if !e.pinned && e.namespace != ns {
			continue
		}
		n := 0
		for limit := min(len(e.ids), len(prompt)-1); n < limit && e.ids[n] == prompt[n]; n++ {
		}
		if n > bestN {
			best, bestN = i, n
		}
	}
	if best < 0 {
		return nil, 0
	}
	e := pc.entries[best]
	// Most recently used last.
	pc.entries = append(append(pc.entries[:best:best], pc.entries[best+1:]...), e)
	pc.Reused += int64(bestN)
	return e.cache, bestN
}

// Put keeps a finished sequence's cache for namespace ns, ids being the
// tokens whose keys and values it holds (c.Len of them). The caller gives
// c up. Entries of ns the new one extends are dropped: a conversation
// keeps one entry, its latest.
func (pc *PrefixCache) Put(ids []int, c *qwen.Cache, ns string) {
	pc.put(ids, c, false, ns)
}

// Pin keeps ids' cache whatever the budget, for every namespace (a system
// prompt every conversation starts with).
func (pc *PrefixCache) Pin(ids []int, c *qwen.Cache) { pc.put(ids, c, true, "") }

func (pc *PrefixCache) put(ids []int, c *qwen.Cache, pinned bool, ns string) {
	if pc == nil || len(ids) == 0 || c.Len != len(ids) {
		return
	}
	pc.mu.Lock()
	defer pc.mu.Unlock()
	kept := pc.entries[:0]
	for _, e := range pc.entries {
		if !e.pinned && e.namespace == ns && len(e.ids) <= len(ids) && slices.Equal(e.ids, ids[:len(e.ids)]) {
			pc.rows -= e.cache.Cap()
			continue
		}
		kept = append(kept, e)
	}
	pc.entries = append(kept, &prefixEntry{ids: slices.Clone(ids), cache: c, pinned: pinned, namespace: ns})
	pc.rows += c.Cap()
	for i := 0; pc.rows > pc.budget && i < len(pc.entries); {
		if e := pc.entries[i]; !e.pinned && e != pc.entries[len(pc.entries)-1] {
			pc.rows -= e.cache.Cap()
			pc.entries = append(pc.entries[:i], pc.entries[i+1:]...)
			continue
		}
		i++
	}
}

// fed is what a finished generation's cache holds: the prompt and every
// sampled token but the last (which was never fed back).
func fed(prompt []int, g Generation) []int {
	ids := slices.Clone(prompt)
	if len(g.Tokens) > 1 {
		ids = append(ids, g.Tokens[:len(g.Tokens)-1]...)
	}
	return ids
}
