package ltm

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// FuzzReadJSONL: any input is refused with an error or read into records
// that each have content; it never panics.
func FuzzReadJSONL(f *testing.F) {
	f.Add([]byte(`{"memory_id":"mem_00000001","content":"a","created":"2026-01-02T03:04:05Z"}` + "\n"))
	f.Add([]byte("{\"content\":\"a\"}\n\n{\"content\":\"b\",\"metadata\":{\"k\":[1,2]}}\n"))
	f.Add([]byte(`{"content":""}`))
	f.Fuzz(func(t *testing.T, in []byte) {
		recs, err := ReadJSONL(bytes.NewReader(in), "in")
		if err != nil {
			return
		}
		for i, r := range recs {
			if strings.TrimSpace(r.Content) == "" {
				t.Fatalf("record %d read with empty content from %q", i, in)
			}
		}
	})
}

// FuzzCheckWAL: any bytes as a write-ahead log are read without a panic,
// and the counts are consistent.
func FuzzCheckWAL(f *testing.F) {
	hdr := []byte{0x37, 0x7f, 0x06, 0x82, 0, 0x2d, 0xe2, 0x18, 0, 0, 0x02, 0}
	f.Add(append(hdr, make([]byte, 600)...))
	f.Add([]byte{})
	dir := f.TempDir()
	f.Fuzz(func(t *testing.T, wal []byte) {
		p := filepath.Join(dir, "m.db")
		if err := os.WriteFile(p+"-wal", wal, 0o644); err != nil {
			t.Fatal(err)
		}
		rep, err := CheckWAL(p)
		if err != nil {
			t.Fatal(err)
		}
		if rep.Valid > rep.Frames || rep.Lost > rep.Frames+1 || rep.Valid+rep.Lost > rep.Frames+1 {
			t.Fatalf("inconsistent report %+v", rep)
		}
	})
}
