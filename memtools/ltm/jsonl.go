package ltm

import (
	"bufio"
	"cmp"
	"encoding/json"
	"errors"
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

// readErr remembers the first error of a reader other than io.EOF: a
// bufio.Scanner hands out the cut-off last line before it reports that the
// reading failed, and that line's parse error would hide why.
type readErr struct {
	r   io.Reader
	err error
}

func (e *readErr) Read(p []byte) (int, error) {
	n, err := e.r.Read(p)
	if err != nil && err != io.EOF && e.err == nil {
		e.err = err
	}
	return n, err
}

// ReadError is a failure to read an export (not a malformed line).
type ReadError struct {
	Name string
	Err  error
}

func (e *ReadError) Error() string { return e.Name + ": " + e.Err.Error() }
func (e *ReadError) Unwrap() error { return e.Err }

// ReadJSONL reads a whole export and checks every line (unknown fields,
// empty content, text that is not UTF-8, a memory_id that is not an id)
// before returning any, so an import of a malformed file writes nothing.
// name prefixes errors as name:line. A failure to read r is a *ReadError.
func ReadJSONL(r io.Reader, name string) ([]Record, error) {
	var out []Record
	src := &readErr{r: r}
	sc := bufio.NewScanner(src)
	sc.Buffer(make([]byte, 1<<20), 64<<20)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" {
			continue
		}
		if src.err != nil {
			return nil, &ReadError{name, src.err}
		}
		if path, bad := jsonerr.BadText([]byte(line)); bad {
			return nil, fmt.Errorf("%s:%d: %s holds text that is not UTF-8 (or an escape of half a surrogate pair)", name, n, cmp.Or(path, "the line"))
		}
		var rec Record
		dec := json.NewDecoder(strings.NewReader(line))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&rec); err != nil {
			if _, msg, ok := jsonerr.Type(err); ok {
				return nil, fmt.Errorf("%s:%d: %s", name, n, msg)
			}
			if errors.Is(err, io.ErrUnexpectedEOF) {
				return nil, fmt.Errorf("%s:%d: the line ends inside a JSON value", name, n)
			}
			// Not wrapped: only a failed read of r is returned as its error.
			return nil, fmt.Errorf("%s:%d: %v", name, n, err)
		}
		if rec.ID != "" && !ValidID(rec.ID) {
			return nil, fmt.Errorf("%s:%d: memory_id %q is not a memory id (mem_ and 8 lower-case hex digits); leave it out for a new one", name, n, rec.ID)
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
		return nil, &ReadError{name, err}
	}
	return out, nil
}
