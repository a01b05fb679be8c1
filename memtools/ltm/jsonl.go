package ltm

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/agemem/agemem/internal/jsonerr"
)

// Record is one line of a JSONL export: an entry without its embedding,
// which an import recomputes with the importing side's encoder.
type Record struct {
	ID         string         `json:"memory_id"`
	Content    string         `json:"content"`
	Metadata   map[string]any `json:"metadata,omitempty"`
	MemoryType string         `json:"memory_type,omitempty"`
	Created    string         `json:"created"`
	Updated    string         `json:"updated"`
}

// Entry is the record as an entry to import (no embedding yet): its id
// and timestamps kept.
func (r Record) Entry() Entry {
	e := Entry{ID: r.ID, Content: r.Content, Metadata: r.Metadata, MemoryType: r.MemoryType}
	e.Created, _ = time.Parse(time.RFC3339Nano, r.Created)
	e.Updated, _ = time.Parse(time.RFC3339Nano, r.Updated)
	return e
}

const stamp = "2006-01-02T15:04:05.999999999Z07:00"

// WriteJSONL writes entries, one Record per line.
func WriteJSONL(w io.Writer, es []Entry) error {
	bw := bufio.NewWriter(w)
	enc := json.NewEncoder(bw)
	enc.SetEscapeHTML(false)
	for _, e := range es {
		r := Record{e.ID, e.Content, e.Metadata, e.MemoryType, e.Created.UTC().Format(stamp), e.Updated.UTC().Format(stamp)}
		if err := enc.Encode(r); err != nil {
			return err
		}
	}
	return bw.Flush()
}

// ReadJSONL reads a whole export and checks every line (unknown fields,
// empty content) before returning any, so an import of a malformed file
// writes nothing. name prefixes errors as name:line.
func ReadJSONL(r io.Reader, name string) ([]Record, error) {
	var out []Record
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 64<<20)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" {
			continue
		}
		var rec Record
		dec := json.NewDecoder(strings.NewReader(line))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&rec); err != nil {
			if _, msg, ok := jsonerr.Type(err); ok {
				return nil, fmt.Errorf("%s:%d: %s", name, n, msg)
			}
			return nil, fmt.Errorf("%s:%d: %w", name, n, err)
		}
		if dec.More() {
			return nil, fmt.Errorf("%s:%d: more than one JSON value on the line", name, n)
		}
		if strings.TrimSpace(rec.Content) == "" {
			return nil, fmt.Errorf("%s:%d: empty content", name, n)
		}
		for _, ts := range []string{rec.Created, rec.Updated} {
			if ts == "" {
				continue
			}
			if _, err := time.Parse(time.RFC3339Nano, ts); err != nil {
				return nil, fmt.Errorf("%s:%d: timestamp %q is not RFC 3339", name, n, ts)
			}
		}
		out = append(out, rec)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	return out, nil
}
