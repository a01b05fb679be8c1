package ltm

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// atStart is the seed of damage to the file's first bytes.
const atStart = 99

// damage overwrites n bytes of the file at path at a random place with
// random bytes and returns where.
func damage(t *testing.T, path string, n int, seed uint64) (from, to int) {
	t.Helper()
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	r := rand.New(rand.NewPCG(seed, 3))
	from = r.IntN(len(raw) - n)
	if seed == atStart {
		from = 0 // the header, the schema and the free list's start
	}
	for i := from; i < from+n; i++ {
		raw[i] = byte(r.Uint32())
	}
	if err := os.WriteFile(path, raw, 0o644); err != nil {
		t.Fatal(err)
	}
	return from, from + n
}

// readable is how many memories a page-by-page read must get back after
// bytes [from, to) of the file clean were overwritten: those whose cell's
// local part is outside the damage, and whose page's header and cell
// pointers are too, or else whose index entry is (a record found without
// its page's pointers counts only when an index lists it). Where each
// cell lies is read from the clean file through its pointers, the one
// reading the repair's own result is checked against (all of a clean
// store read back, below).
func readable(t *testing.T, clean []byte, from, to int) int {
	t.Helper()
	d := newImage(clean, nil, 0)
	free, _ := d.freePages()
	hit := func(a, b int) bool { return a < to && b > from }
	type where struct{ cell, header bool } // the cell intact; its page's pointers intact
	rows := map[string]where{}
	index := map[string]bool{} // the index entry intact
	for p := uint32(1); p <= d.nPages; p++ {
		img := d.page(p)
		base, h := int(p-1)*d.pageSize, 0
		if p == 1 {
			h = 100
		}
		cells, ok := d.btreeCells(img, h, free)
		if !ok {
			continue
		}
		ncell := int(binary.BigEndian.Uint16(img[h+3:]))
		header := !hit(base, base+h+12+2*ncell)
		for _, c := range cells {
			cols, ok := record(c.payload, c.size)
			if !ok {
				continue
			}
			intact := !hit(base+c.off-12, base+c.off+c.ends[0])
			switch shape(cols) {
			case shapeRowV1, shapeRowV2:
				rows[string(cols[1].data)] = where{intact, header}
			case shapeIndexV1:
				index[string(cols[2].data)] = intact && header
			case shapeIndexV2:
				index[string(cols[1].data)] = intact && header
			}
		}
	}
	n := 0
	for id, w := range rows {
		if w.cell && (w.header || index[id]) {
			n++
		}
	}
	return n
}

// The case: 16 KiB of random bytes in a store of 4,000 memories
// (about 4,600 pages of the old layout). A repair reads every page on its
// own, so it keeps every memory whose own record survived, rebuilds what
// the damage took from a memory whose content survived (the embedding
// recomputed), names every memory it lost, and the rebuilt store holds
// exactly what it says, each memory as it was.
func TestRepairKeepsEveryReadableMemory(t *testing.T) {
	ms := corpus(4000, 40, 3)
	byID := map[string]stored{}
	pos := map[string]int{}
	for i, m := range ms {
		byID[m.e.ID], pos[m.e.ID] = m, i
	}
	for _, layout := range []string{"schema1", "current"} {
		for _, seed := range []uint64{0, 1, 2, atStart} {
			t.Run(fmt.Sprintf("%s/seed%d", layout, seed), func(t *testing.T) {
				path := filepath.Join(t.TempDir(), "m.db")
				if layout == "schema1" {
					oldStore(t, path, ms)
				} else {
					newStore(t, path, ms)
				}
				clean, _ := os.ReadFile(path)
				from, to := damage(t, path, 16<<10, seed)
				want := readable(t, clean, from, to)
				if _, err := OpenSQLite(path, SQLiteOptions{}); !errors.Is(err, ErrDamaged) {
					t.Fatalf("a damaged file opens: %v", err)
				}
				rr, err := Repair(context.Background(), path, RepairOptions{Embed: embedder})
				if err != nil {
					t.Fatal(err)
				}
				t.Logf("16 KiB at %d of %d bytes: kept %d of %d (%d had fields rebuilt: %v), lost %d; %d were readable",
					from, len(clean), rr.Kept, len(ms), rebuiltCount(t, path, rr), rr.Rebuilt, len(rr.Lost), want)
				// With the header destroyed, the free list is unreadable: a
				// memory that neither an index nor an interior page vouches
				// for might be one deleted before, and is listed (with its
				// content) rather than restored.
				withContent := 0
				for _, l := range rr.Lost {
					if l.Content != "" {
						withContent++
					}
				}
				if rr.Kept < want && (from > 100 || rr.Kept+withContent < want) {
					t.Fatalf("repair kept %d (and listed %d with their content), %d were readable", rr.Kept, withContent, want)
				}
				if rr.Kept+len(rr.Lost) != len(ms) {
					t.Fatalf("kept %d + lost %d: %d memories unaccounted for", rr.Kept, len(rr.Lost), len(ms)-rr.Kept-len(rr.Lost))
				}
				s, err := OpenSQLite(path, SQLiteOptions{})
				if err != nil {
					t.Fatal(err)
				}
				defer s.Close()
				total := 0
				for _, ns := range []string{"tenant0", "tenant1", "tenant2"} {
					st, _ := s.Namespace(ns)
					all, _ := st.List(context.Background())
					total += len(all)
					last := -1
					for _, e := range all {
						m, ok := byID[e.ID]
						if !ok || m.ns != ns || m.e.Content != e.Content || !slices.Equal(decodeVec(encodeVec(m.e.Embedding)), e.Embedding) {
							t.Fatalf("%s: repaired memory %s %q is not what was stored", ns, e.ID, e.Content)
						}
						// The stored order survives.
						if pos[e.ID] < last {
							t.Fatalf("%s: %s listed out of order", ns, e.ID)
						}
						last = pos[e.ID]
					}
				}
				if total != rr.Kept {
					t.Fatalf("the repaired store holds %d, repair said %d", total, rr.Kept)
				}
				if len(rr.Lost) > 0 {
					raw, _ := os.ReadFile(rr.LostFile)
					if n := strings.Count(string(raw), "\n"); n != len(rr.Lost) {
						t.Fatalf("%s lists %d, repair lost %d", rr.LostFile, n, len(rr.Lost))
					}
				}
			})
		}
	}
}

func rebuiltCount(t *testing.T, _ string, rr RepairReport) int {
	t.Helper()
	n := 0
	for _, k := range rr.Rebuilt {
		n = max(n, k)
	}
	return n
}

// An undamaged store, in either layout, is read back whole by the
// page-by-page reader: every memory, nothing rebuilt, nothing lost.
func TestRepairOfAnUndamagedStoreKeepsAll(t *testing.T) {
	ms := corpus(2000, 300, 4)
	for _, layout := range []string{"schema1", "current"} {
		path := filepath.Join(t.TempDir(), "m.db")
		if layout == "schema1" {
			oldStore(t, path, ms)
		} else {
			newStore(t, path, ms)
		}
		rr, err := Repair(context.Background(), path, RepairOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if rr.Kept != len(ms) || len(rr.Lost) != 0 || len(rr.Rebuilt) != 0 {
			t.Fatalf("%s: kept %d of %d, lost %d, rebuilt %v", layout, rr.Kept, len(ms), len(rr.Lost), rr.Rebuilt)
		}
		s, _ := OpenSQLite(path, SQLiteOptions{})
		for _, ns := range []string{"tenant0", "tenant1", "tenant2"} {
			st, _ := s.Namespace(ns)
			all, _ := st.List(context.Background())
			i := 0
			for _, m := range ms {
				if m.ns != ns {
					continue
				}
				if !sameEntry(m.e, all[i]) {
					t.Fatalf("%s: %+v read back as %+v", layout, m.e, all[i])
				}
				i++
			}
		}
		s.Close()
	}
}

// A repair that needs the embedder and cannot reach it changes nothing:
// the damaged store stays where it was, with no files moved.
func TestRepairThatFailsChangesNothing(t *testing.T) {
	path := filepath.Join(t.TempDir(), "m.db")
	oldStore(t, path, corpus(2000, 40, 5))
	damage(t, path, 16<<10, 1)
	before, _ := os.ReadFile(path)
	down := func(context.Context, []string) ([][]float32, error) { return nil, errors.New("connection refused") }
	if _, err := Repair(context.Background(), path, RepairOptions{Embed: down}); err == nil || !strings.Contains(err.Error(), "nothing was changed") {
		t.Fatalf("a repair whose embedder is down: %v", err)
	}
	after, _ := os.ReadFile(path)
	matches, _ := filepath.Glob(path + ".damaged-*")
	if !bytes.Equal(before, after) || len(matches) != 0 {
		t.Fatalf("a failed repair changed the store (aside: %v)", matches)
	}
}
