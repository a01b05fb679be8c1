// Package ltm is AgeMem's long-term memory M: entries with content, an
// embedding, metadata and a type, and cosine top-k retrieval (Eq. 8-13).
package ltm

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"time"
	"unicode/utf8"
)

// Entry is one memory m_i = (c, enc(c), metadata) of Eq. 10. Stores keep the
// embedding L2-normalised.
type Entry struct {
	ID         string         `json:"memory_id"`
	Content    string         `json:"content"`
	Embedding  []float32      `json:"embedding,omitempty"`
	Metadata   map[string]any `json:"metadata,omitempty"`
	MemoryType string         `json:"memory_type,omitempty"`
	Created    time.Time      `json:"created"`
	Updated    time.Time      `json:"updated"`
}

// Scored is a retrieved entry with its cosine similarity to the query.
type Scored struct {
	Entry
	Score float64 `json:"score"`
}

// Store is one namespace of long-term memory.
type Store interface {
	// Add stores e under a new id (e.ID is ignored) and returns it as stored.
	// A namespace of a DB holds a content once (see DB).
	Add(ctx context.Context, e Entry) (Entry, error)
	// Update replaces the content and embedding of id; a nil metadata keeps
	// the old metadata (Eq. 12).
	Update(ctx context.Context, id, content string, embedding []float32, metadata map[string]any) (Entry, error)
	// Delete removes id (Eq. 13).
	Delete(ctx context.Context, id string) error
	Get(ctx context.Context, id string) (Entry, error)
	// Retrieve returns the topK entries most similar to query (Eq. 8-9)
	// among those whose metadata matches every key of filter exactly.
	Retrieve(ctx context.Context, query []float32, topK int, filter map[string]any) ([]Scored, error)
	// List returns every entry, oldest first.
	List(ctx context.Context) ([]Entry, error)
	Count(ctx context.Context) (int, error)
}

// DB is a durable store of many namespaces (one per user): SQLite on one
// machine, PostgreSQL for any number of replicas. Its namespaces, which
// concurrent requests and retried ones write to, keep two rules the
// in-memory store of a rollout does not need:
//
//   - A namespace holds a content once: when it already holds an entry of
//     exactly e.Content, Add returns that entry (the oldest, if updates made
//     several) unchanged and stores nothing, so identical adds, concurrent
//     or retried, leave one memory (Import, which restores, keeps what it
//     is given).
//   - Text is what every store can keep as it is: content valid UTF-8
//     without NUL, metadata without NUL (PostgreSQL's text and jsonb hold
//     neither), so a namespace moves between stores unchanged.
type DB interface {
	// Namespace returns the Store of one user; namespaces never see each
	// other.
	Namespace(ns string) (Store, error)
	// Namespaces lists the namespaces that hold at least one entry.
	Namespaces(ctx context.Context) ([]string, error)
	// Import writes entries into namespace ns in one transaction: all of
	// them or none. An entry whose ID is a valid id keeps it (and its
	// timestamps), replacing the entry of that id if the namespace holds
	// one, so importing the same entries twice leaves one copy; others get
	// new ids. Embeddings must be set.
	Import(ctx context.Context, ns string, es []Entry) (added, replaced int, err error)
	// Ping checks that the database answers.
	Ping() error
	Close() error
}

// ErrNotFound is returned for an id the store does not hold.
var ErrNotFound = errors.New("memory not found")

// ErrUnavailable wraps an error of a database that cannot be reached (down,
// restarting, refusing connections, a connection cut mid-call): nothing was
// changed by the call unless its error says otherwise, and the same call
// may succeed later. A server answers it with 503 and Retry-After.
var ErrUnavailable = errors.New("the memory database is unavailable")

// checkNamespace is the rule every store applies to a namespace's name.
func checkNamespace(ns string) error {
	if ns == "" || len(ns) > 256 || strings.ContainsRune(ns, 0) || !utf8.ValidString(ns) {
		return fmt.Errorf("namespace %q: must be 1-256 bytes of UTF-8 without NUL", ns)
	}
	return nil
}

// checkText refuses text a DB cannot keep as it is: PostgreSQL's text
// holds neither NUL nor invalid UTF-8 (and a JSONL export would rewrite
// invalid UTF-8), its jsonb no U+0000. md is normalised metadata.
func checkText(content string, md map[string]any) error {
	if !utf8.ValidString(content) {
		return errors.New("content is not valid UTF-8")
	}
	if strings.ContainsRune(content, 0) {
		return errors.New("content contains a NUL character")
	}
	if hasNUL(md) {
		return errors.New("metadata contains a NUL character (U+0000)")
	}
	return nil
}

// unit returns v scaled to length 1, as every store keeps embeddings. A
// vector already of length 1 to within float32 rounding (one scaling leaves
// |v|^2 within about 3e-7 of 1) comes back as it is, so that copying an
// entry between stores keeps its bits and its checksum.
func unit(v []float32) []float32 {
	var s float64
	for _, x := range v {
		s += float64(x) * float64(x)
	}
	out := slices.Clone(v)
	if s == 0 || math.Abs(s-1) <= 1e-6 {
		return out
	}
	inv := float32(1 / math.Sqrt(s))
	for i := range out {
		out[i] *= inv
	}
	return out
}

var idPattern = regexp.MustCompile(`^mem_[0-9a-f]{8}$`)

// ValidID reports whether id has the form mem_ + 8 lower-case hex digits.
func ValidID(id string) bool { return idPattern.MatchString(id) }

func formatID(x uint32) string { return fmt.Sprintf("mem_%08x", x) }

// ErrMetadata is metadata a store refuses: over its limits, or not JSON.
// Errors that wrap it are *MetadataError.
var ErrMetadata = errors.New("invalid metadata")

// MetadataError says why metadata was refused.
type MetadataError struct {
	Entry  int // the entry's 1-based place in an Import (0 elsewhere)
	Reason string
}

func (e *MetadataError) Error() string {
	if e.Entry > 0 {
		return fmt.Sprintf("entry %d: invalid metadata: %s", e.Entry, e.Reason)
	}
	return "invalid metadata: " + e.Reason
}

func (e *MetadataError) Is(target error) bool { return target == ErrMetadata }

// MetadataLimits bound a memory's metadata at the store, so that no path
// that writes (the API, MCP, the agent's tools, an import) stores what a
// reader cannot read back: JSON nested thousands deep parses in Go and
// breaks the recursion limits of other languages' parsers (Python's
// json: about 1,000).
type MetadataLimits struct {
	MaxBytes int // its JSON encoding (0: 16 KiB)
	MaxDepth int // objects and arrays nested, the metadata object itself 1 (0: 16)
}

func (l MetadataLimits) withDefaults() MetadataLimits {
	if l.MaxBytes == 0 {
		l.MaxBytes = 16 << 10
	}
	if l.MaxDepth == 0 {
		l.MaxDepth = 16
	}
	return l
}

// depth is how deeply v nests objects and arrays, counting no further
// than limit+1.
func depth(v any, limit int) int {
	if limit < 0 {
		return 0
	}
	deepest := 0
	switch x := v.(type) {
	case map[string]any:
		for _, e := range x {
			deepest = max(deepest, depth(e, limit-1))
		}
	case []any:
		for _, e := range x {
			deepest = max(deepest, depth(e, limit-1))
		}
	default:
		return 0
	}
	return deepest + 1
}

// normalize checks m against the limits and round-trips it through JSON
// so that stored and filter values compare as the same types (every
// number a float64).
func (l MetadataLimits) normalize(m map[string]any) (map[string]any, error) {
	if m == nil {
		return nil, nil
	}
	l = l.withDefaults()
	if d := depth(m, l.MaxDepth); d > l.MaxDepth {
		return nil, &MetadataError{Reason: fmt.Sprintf("it nests deeper than %d levels of objects and arrays (memory.max_metadata_depth)", l.MaxDepth)}
	}
	raw, err := json.Marshal(m)
	if err != nil {
		return nil, &MetadataError{Reason: fmt.Sprintf("not JSON: %v", err)}
	}
	if len(raw) > l.MaxBytes {
		return nil, &MetadataError{Reason: fmt.Sprintf("%d bytes of JSON exceed %d (memory.max_metadata_bytes)", len(raw), l.MaxBytes)}
	}
	var out map[string]any
	if err := json.Unmarshal(raw, &out); err != nil {
		return nil, err
	}
	return out, nil
}

// normalizeMetadata is normalize under the default limits.
func normalizeMetadata(m map[string]any) (map[string]any, error) {
	return MetadataLimits{}.normalize(m)
}

// hasNUL reports whether a value of decoded JSON holds a NUL (which
// PostgreSQL's text cannot).
func hasNUL(v any) bool {
	switch v := v.(type) {
	case string:
		return strings.ContainsRune(v, 0)
	case []any:
		return slices.ContainsFunc(v, hasNUL)
	case map[string]any:
		for k, x := range v {
			if strings.ContainsRune(k, 0) || hasNUL(x) {
				return true
			}
		}
	}
	return false
}

// Matches reports whether e satisfies filter: every key equals exactly. The
// key "memory_type" also matches the entry's MemoryType field.
func Matches(e Entry, filter map[string]any) bool {
	if len(filter) == 0 {
		return true
	}
	f, err := normalizeMetadata(filter)
	if err != nil {
		return false
	}
	return matchesNormalized(e, f)
}

func matchesNormalized(e Entry, f map[string]any) bool {
	for k, want := range f {
		got, ok := e.Metadata[k]
		if !ok && k == "memory_type" {
			got, ok = e.MemoryType, e.MemoryType != ""
		}
		if !ok || !reflect.DeepEqual(got, want) {
			return false
		}
	}
	return true
}

func checkEmbedding(v []float32, dim int) error {
	if len(v) == 0 {
		return errors.New("entry has no embedding")
	}
	if dim != 0 && len(v) != dim {
		return fmt.Errorf("embedding has dimension %d, the store holds dimension %d", len(v), dim)
	}
	return nil
}
