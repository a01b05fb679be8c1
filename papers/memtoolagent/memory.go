package memtoolagent

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"

	"github.com/agemem/agemem/embed"
	"github.com/agemem/agemem/memtools/ltm"
)

// Entry is one memory m = (q, a, f, r): a query, the tool calls the agent
// made for it, the user's feedback (1 correct, 0 not) and, for a failure,
// the extractor's reflection on what went wrong.
type Entry struct {
	Query      string   `json:"query"`
	Actions    []string `json:"actions"`
	Feedback   int      `json:"feedback"`
	Reflection string   `json:"reflection,omitempty"`
	// Similarity is the entry's cosine similarity to the query it was
	// recalled for (set by Recall).
	Similarity float64 `json:"similarity,omitempty"`
}

// memoryType marks tool-use entries in a shared store.
const memoryType = "tool_use"

// Memory keeps entries in a long-term store (one namespace per user, in
// SQLite or in memory, as the rest of the toolkit): the query is the
// content and is what gets embedded; actions, feedback and reflection are
// metadata.
type Memory struct {
	Store    ltm.Store
	Embedder embed.Embedder
	Count    Counter // how many entries a query recalls (Adaptive: the paper's)
}

// Add stores e.
func (m *Memory) Add(ctx context.Context, e Entry) error {
	if e.Feedback != 0 && e.Feedback != 1 {
		return fmt.Errorf("toolmem: feedback %d: want 0 or 1", e.Feedback)
	}
	v, err := m.Embedder.Embed(ctx, []string{e.Query})
	if err != nil {
		return fmt.Errorf("toolmem: embedding the query: %w", err)
	}
	meta := map[string]any{"kind": memoryType, "actions": e.Actions, "feedback": e.Feedback}
	if e.Reflection != "" {
		meta["reflection"] = e.Reflection
	}
	_, err = m.Store.Add(ctx, ltm.Entry{Content: e.Query, Embedding: v[0], Metadata: meta, MemoryType: memoryType})
	return err
}

// Recall returns the entries to show for query: all tool-use entries
// ranked by the similarity of their query, as many as the Counter says
// (nil: the paper's adaptive count, DefaultAdaptive).
func (m *Memory) Recall(ctx context.Context, query string) ([]Entry, error) {
	n, err := m.Store.Count(ctx)
	if err != nil || n == 0 {
		return nil, err
	}
	v, err := m.Embedder.Embed(ctx, []string{query})
	if err != nil {
		return nil, fmt.Errorf("toolmem: embedding the query: %w", err)
	}
	hits, err := m.Store.Retrieve(ctx, v[0], n, map[string]any{"kind": memoryType})
	if err != nil {
		return nil, err
	}
	sims := make([]float64, len(hits))
	for i, h := range hits {
		sims[i] = h.Score
	}
	var count Counter = DefaultAdaptive()
	if m.Count != nil {
		count = m.Count
	}
	out := make([]Entry, 0, len(hits))
	for _, h := range hits[:count.Count(sims)] {
		e, err := entryOf(h.Entry)
		if err != nil {
			return nil, err
		}
		e.Similarity = h.Score
		out = append(out, e)
	}
	return out, nil
}

// entryOf reads an entry back from the store.
func entryOf(s ltm.Entry) (Entry, error) {
	raw, err := json.Marshal(s.Metadata)
	if err != nil {
		return Entry{}, err
	}
	var meta struct {
		Actions    []string `json:"actions"`
		Feedback   float64  `json:"feedback"`
		Reflection string   `json:"reflection"`
	}
	if err := json.Unmarshal(raw, &meta); err != nil {
		return Entry{}, fmt.Errorf("toolmem: entry %s: metadata %s: %w", s.ID, raw, err)
	}
	return Entry{Query: s.Content, Actions: meta.Actions, Feedback: int(meta.Feedback), Reflection: meta.Reflection}, nil
}

// Render writes entries as the paper's prompts show them (Figures 3, 7,
// 10): the query, the tool calls, the user's feedback and, for a failure,
// the reflection.
func Render(entries []Entry) string {
	var b strings.Builder
	for i, e := range entries {
		if i > 0 {
			b.WriteString("\n")
		}
		fmt.Fprintf(&b, "Query: %s\nAnswer (Tool Calls): [%s]\n", e.Query, strings.Join(e.Actions, ", "))
		if e.Feedback == 1 {
			b.WriteString("User Feedback: Correct\n")
		} else {
			b.WriteString("User Feedback: Incorrect\n")
			if e.Reflection != "" {
				fmt.Fprintf(&b, "Reflection: %s\n", e.Reflection)
			}
		}
	}
	return b.String()
}
