package ltm

// Moving memory between stores (SQLite to PostgreSQL and back): every
// namespace, its ids, timestamps and insertion order kept, checked by
// per-namespace counts and checksums on both sides. Copy writes only what
// the destination lacks, so a run cut off half-way is finished by running
// it again, and a finished one run again writes nothing.

import (
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
)

// Checksum is a namespace's memories as one SHA-256 (hex): every entry in
// id order, each field length-prefixed: id, content, the embedding's
// float32 bits, metadata as canonical JSON, type, and both timestamps to
// the nanosecond. Stores that hold the same memories give the same sum.
func Checksum(es []Entry) string {
	sorted := slices.Clone(es)
	slices.SortFunc(sorted, func(a, b Entry) int { return cmp.Compare(a.ID, b.ID) })
	h := sha256.New()
	for _, e := range sorted {
		h.Write(entrySum(e))
	}
	return hex.EncodeToString(h.Sum(nil))
}

// entrySum is one entry's digest.
func entrySum(e Entry) []byte {
	h := sha256.New()
	field := func(b []byte) {
		h.Write(binary.AppendUvarint(nil, uint64(len(b))))
		h.Write(b)
	}
	field([]byte(e.ID))
	field([]byte(e.Content))
	v := make([]byte, 4*len(e.Embedding))
	for i, x := range e.Embedding {
		binary.LittleEndian.PutUint32(v[4*i:], math.Float32bits(x))
	}
	field(v)
	md, _ := json.Marshal(orEmpty(e.Metadata)) // map keys sorted
	field(md)
	field([]byte(e.MemoryType))
	field(binary.LittleEndian.AppendUint64(nil, uint64(e.Created.UnixNano())))
	field(binary.LittleEndian.AppendUint64(nil, uint64(e.Updated.UnixNano())))
	return h.Sum(nil)
}

// CopyReport is one namespace after Copy.
type CopyReport struct {
	Namespace string `json:"namespace"`
	// Written is the memories this run wrote (0: the destination held them
	// all already).
	Written   int    `json:"written"`
	FromCount int    `json:"from_count"`
	ToCount   int    `json:"to_count"`
	FromSum   string `json:"from_checksum"`
	ToSum     string `json:"to_checksum"`
}

// Same reports a namespace both sides hold alike.
func (r CopyReport) Same() bool { return r.FromCount == r.ToCount && r.FromSum == r.ToSum }

// CopyOptions configure Copy.
type CopyOptions struct {
	// Batch is the memories written per transaction (0: 500).
	Batch int
	// Progress, if set, is told after each batch.
	Progress func(ns string, written, total int)
}

// ErrMismatch is a namespace the destination does not hold as the source
// does after Copy: it held memories of its own, changed since.
var ErrMismatch = errors.New("the stores differ")

// Copy copies every namespace of from into to: the memories to lacks or
// holds otherwise, in the source's insertion order, ids and timestamps
// kept (Import). It deletes nothing: a destination memory the source lacks
// is reported (ErrMismatch), not removed. The reports cover every
// namespace the source holds.
func Copy(ctx context.Context, from, to DB, opt CopyOptions) ([]CopyReport, error) {
	if opt.Batch <= 0 {
		opt.Batch = 500
	}
	names, err := from.Namespaces(ctx)
	if err != nil {
		return nil, fmt.Errorf("list the source's namespaces: %w", err)
	}
	var reports []CopyReport
	var bad []string
	for _, name := range names {
		r, err := copyNamespace(ctx, from, to, name, opt)
		if err != nil {
			return reports, fmt.Errorf("namespace %q: %w", name, err)
		}
		reports = append(reports, r)
		if !r.Same() {
			bad = append(bad, fmt.Sprintf("%q (%d memories and %s here, %d and %s there)", name, r.FromCount, r.FromSum[:12], r.ToCount, r.ToSum[:12]))
		}
	}
	if len(bad) > 0 {
		return reports, fmt.Errorf("%w after the copy in %d namespaces: %s; the destination keeps memories of its own (nothing is deleted), or one side was written during the copy",
			ErrMismatch, len(bad), strings.Join(bad, ", "))
	}
	return reports, nil
}

func copyNamespace(ctx context.Context, from, to DB, name string, opt CopyOptions) (CopyReport, error) {
	r := CopyReport{Namespace: name}
	src, err := list(ctx, from, name)
	if err != nil {
		return r, fmt.Errorf("read the source: %w", err)
	}
	dst, err := list(ctx, to, name)
	if err != nil {
		return r, fmt.Errorf("read the destination: %w", err)
	}
	have := make(map[string]string, len(dst))
	for _, e := range dst {
		have[e.ID] = string(entrySum(e))
	}
	var todo []Entry
	for _, e := range src {
		if have[e.ID] != string(entrySum(e)) {
			todo = append(todo, e)
		}
	}
	for i := 0; i < len(todo); i += opt.Batch {
		batch := todo[i:min(i+opt.Batch, len(todo))]
		if _, _, err := to.Import(ctx, name, batch); err != nil {
			return r, fmt.Errorf("write memories %d-%d of %d: %w", i+1, i+len(batch), len(todo), err)
		}
		r.Written += len(batch)
		if opt.Progress != nil {
			opt.Progress(name, r.Written, len(todo))
		}
	}
	if r.Written > 0 {
		if dst, err = list(ctx, to, name); err != nil {
			return r, fmt.Errorf("read the destination back: %w", err)
		}
	}
	r.FromCount, r.FromSum = len(src), Checksum(src)
	r.ToCount, r.ToSum = len(dst), Checksum(dst)
	return r, nil
}

func list(ctx context.Context, db DB, name string) ([]Entry, error) {
	st, err := db.Namespace(name)
	if err != nil {
		return nil, err
	}
	return st.List(ctx)
}
