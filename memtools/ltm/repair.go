package ltm

import (
	"cmp"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"math"
	"os"
	"slices"
	"strings"
	"time"
)

// RepairOptions configure Repair.
type RepairOptions struct {
	// Embed recomputes the embedding of a memory whose content is intact
	// but whose stored embedding is not (nil: such a memory is lost).
	Embed func(ctx context.Context, texts []string) ([][]float32, error)
}

// LostMemory is a memory a repair knows existed, by its own record or by
// an index entry, and could not read back.
type LostMemory struct {
	Namespace string `json:"namespace"`
	ID        string `json:"memory_id"`
	Reason    string `json:"reason"`
	Content   string `json:"content,omitempty"` // when it could be read
}

// RepairReport is what a repair kept and lost.
type RepairReport struct {
	Kept int // memories in the rebuilt store
	// Rebuilt is how many kept memories had fields that could not be read
	// and were rebuilt, by field: "embedding" recomputed from the content;
	// "metadata" {}, "memory_type" "", "created"/"updated" the other
	// timestamp or the repair's time.
	Rebuilt map[string]int
	Lost    []LostMemory
	// LogMissing is committed frames the log no longer held (it was cut):
	// the memories they wrote are gone and cannot be counted.
	LogMissing int
	// FreeListDamaged: the list of free pages could not be read whole, so
	// pages freed before the damage were read too; an index entry is
	// still required for any memory found outside a readable b-tree page.
	FreeListDamaged bool
	Aside           string // the damaged files, kept: Aside, Aside-wal, Aside-shm
	LostFile        string // the lost memories as JSONL ("" when none)
}

// recovered is one memory read back from a damaged store.
type recovered struct {
	ns      string
	e       Entry
	order   int64    // seq (schema 1) or rowid (schema 2); 0 unknown
	rebuilt []string // fields that could not be read
	scanned bool     // found by searching a page whose header is destroyed
	page    uint32   // the page its record was read from
}

type memKey [2]string // namespace, id

// recovery is what a page-by-page read of a store found.
type recovery struct {
	rows  map[memKey]*recovered
	known map[memKey]int64 // ids the indexes list, with the order they give (seq or rowid)
	lost  map[memKey]LostMemory
	// freeComplete: the free list was read whole.
	freeComplete bool
}

// memories reads every memory of the image.
func (d *dbImage) memories() *recovery {
	rc := &recovery{rows: map[memKey]*recovered{}, known: map[memKey]int64{}, lost: map[memKey]LostMemory{}}
	free, complete := d.freePages()
	rc.freeComplete = complete
	overflow := map[uint32]bool{}
	linked := map[uint32]bool{} // pages an interior page points to
	var unreadable []uint32
	for p := uint32(1); p <= d.nPages; p++ {
		img := d.page(p)
		if img == nil || free[p] {
			continue
		}
		h := 0
		if p == 1 {
			h = 100
		}
		cells, ok := d.btreeCells(img, h, free)
		if !ok {
			unreadable = append(unreadable, p)
			continue
		}
		for _, ch := range children(img, h) {
			linked[ch] = true
		}
		for _, c := range cells {
			for _, o := range c.overflow {
				overflow[o] = true
			}
			c.page = p
			rc.add(c, false)
		}
	}
	// A page that is neither a b-tree page nor on a chain of one is a
	// b-tree page whose header is destroyed (or a chain page whose owner
	// is): its cells may still be there.
	for _, p := range unreadable {
		if !overflow[p] {
			for _, c := range d.scanRecords(d.page(p), free) {
				rc.add(c, true)
			}
		}
	}
	// Without the whole free list, a freed page that still looks like a
	// leaf may have been read: a memory on a page no interior page points
	// to and that no index lists may have been deleted. It is not
	// restored, but listed with its content.
	if !complete {
		for k, r := range rc.rows {
			if !rc.isKnown(k[0], k[1]) && !linked[r.page] {
				rc.lost[k] = LostMemory{Namespace: k[0], ID: k[1], Content: r.e.Content,
					Reason: "no index lists it and the free-page list is unreadable: it may have been deleted before the damage"}
				delete(rc.rows, k)
			}
		}
	}
	return rc
}

func (rc *recovery) add(c cell, scanned bool) {
	cols, ok := record(c.payload, c.size)
	if !ok {
		return
	}
	switch sh := shape(cols); sh {
	case shapeIndexV1, shapeIndexV2:
		idCol, orderCol := 2, 1
		if sh == shapeIndexV2 {
			idCol, orderCol = 1, 2
		}
		ns, ok1 := cols[0].text()
		id, ok2 := cols[idCol].text()
		order, _ := cols[orderCol].integer()
		if ok1 && ok2 && ValidID(id) {
			rc.known[memKey{ns, id}] = order
		}
	case shapeRowV1, shapeRowV2:
		r, lost := memoryFrom(cols, sh, c)
		if r != nil {
			r.page = c.page
		}
		// A record found by searching counts only when an index lists it
		// (the index pages were all read before any search): a page's free
		// space keeps deleted cells, whose index entries are gone.
		if scanned && (r != nil && !rc.isKnown(r.ns, r.e.ID) || lost != nil && !rc.isKnown(lost.Namespace, lost.ID)) {
			return
		}
		switch {
		case r != nil:
			r.scanned = scanned
			k := memKey{r.ns, r.e.ID}
			if old := rc.rows[k]; old == nil || better(r, old) {
				rc.rows[k] = r
			}
			delete(rc.lost, k)
		case lost != nil:
			if k := (memKey{lost.Namespace, lost.ID}); rc.rows[k] == nil {
				rc.lost[k] = *lost
			}
		}
	}
}

func (rc *recovery) isKnown(ns, id string) bool {
	_, ok := rc.known[memKey{ns, id}]
	return ok
}

// better prefers a memory read from a b-tree page, then one with fewer
// rebuilt fields, then the later update.
func better(a, b *recovered) bool {
	if a.scanned != b.scanned {
		return !a.scanned
	}
	if len(a.rebuilt) != len(b.rebuilt) {
		return len(a.rebuilt) < len(b.rebuilt)
	}
	return a.e.Updated.After(b.e.Updated)
}

// memoryFrom reads a memory's record. A column whose bytes prove
// unreadable (text that is not UTF-8, an embedding that is not the unit
// vector the store writes, metadata that is not a JSON object) condemns
// the page it sits on, and with it the integers on that page, which have
// no such check.
func memoryFrom(cols []column, sh string, c cell) (*recovered, *LostMemory) {
	var ns, id, content, emb, md, typ, created, updated column
	var order int64
	if sh == shapeRowV1 {
		ns, id, content, emb, md, typ, created, updated = cols[0], cols[1], cols[2], cols[3], cols[4], cols[5], cols[6], cols[7]
	} else {
		ns, id, typ, created, updated, md, content, emb = cols[0], cols[1], cols[2], cols[3], cols[4], cols[5], cols[6], cols[7]
		order = c.rowid
	}
	nsS, ok1 := ns.text()
	idS, ok2 := id.text()
	if !ok1 || !ok2 || !ValidID(idS) || nsS == "" || len(nsS) > 256 || strings.ContainsRune(nsS, 0) {
		return nil, nil // not a memory that can be named
	}
	text, ok := content.text()
	if !ok || strings.TrimSpace(text) == "" {
		return nil, &LostMemory{Namespace: nsS, ID: idS, Reason: "its content is unreadable"}
	}
	r := &recovered{ns: nsS, order: order, e: Entry{ID: idS, Content: text}}
	// An integer has no check of its own. It is taken as unreadable when a
	// column proven unreadable shares a page of the payload with it and no
	// column proven readable (eight bytes or more) lies between them: the
	// damage is one run of bytes, or a whole overflow page.
	var bad, good []column
	condemn := func(col column) { bad = append(bad, col) }
	page := func(off int) int {
		i, _ := slices.BinarySearch(c.ends, off+1)
		return i
	}
	spoiled := func(col column) bool {
		for _, b := range bad {
			if page(col.from) > page(b.to-1) || page(b.from) > page(col.to-1) {
				continue // no page in common
			}
			between := false
			for _, g := range good {
				if g.to-g.from >= 8 && (g.from >= col.to && g.to <= b.from || g.from >= b.to && g.to <= col.from) {
					between = true
					break
				}
			}
			if !between {
				return true
			}
		}
		return false
	}
	good = append(good, ns, id, content)
	if v, ok := embeddingOf(emb); ok {
		r.e.Embedding = v
		good = append(good, emb)
	} else {
		condemn(emb)
		r.rebuilt = append(r.rebuilt, "embedding")
	}
	if m, ok := metadataOf(md); ok {
		r.e.Metadata = m
		good = append(good, md)
	} else {
		condemn(md)
		r.rebuilt = append(r.rebuilt, "metadata")
	}
	if t, ok := typ.text(); ok {
		r.e.MemoryType = t
		good = append(good, typ)
	} else {
		condemn(typ)
		r.rebuilt = append(r.rebuilt, "memory_type")
	}
	ts := func(col column) (time.Time, bool) {
		v, ok := col.integer()
		if !ok || spoiled(col) {
			return time.Time{}, false
		}
		return time.Unix(0, v).UTC(), true
	}
	cr, okC := ts(created)
	up, okU := ts(updated)
	switch {
	case !okC && !okU:
		cr, up = time.Now().UTC(), time.Now().UTC()
		r.rebuilt = append(r.rebuilt, "created", "updated")
	case !okC:
		cr = up
		r.rebuilt = append(r.rebuilt, "created")
	case !okU:
		up = cr
		r.rebuilt = append(r.rebuilt, "updated")
	}
	r.e.Created, r.e.Updated = cr, up
	if sh == shapeRowV1 {
		if v, ok := cols[8].integer(); ok && !spoiled(cols[8]) {
			r.order = v
		}
	}
	return r, nil
}

// embeddingOf is a stored embedding if it is one: float32s of unit length
// (the store normalises every vector it writes) or all zeros.
func embeddingOf(col column) ([]float32, bool) {
	if !col.whole || col.kind() != 'b' || len(col.data) == 0 || len(col.data)%4 != 0 {
		return nil, false
	}
	v := make([]float32, len(col.data)/4)
	var norm float64
	for i := range v {
		v[i] = math.Float32frombits(binary.LittleEndian.Uint32(col.data[4*i:]))
		x := float64(v[i])
		if math.IsNaN(x) || math.IsInf(x, 0) {
			return nil, false
		}
		norm += x * x
	}
	if norm != 0 && math.Abs(norm-1) > 1e-3 {
		return nil, false
	}
	return v, true
}

func metadataOf(col column) (map[string]any, bool) {
	s, ok := col.text()
	if !ok {
		return nil, false
	}
	if s == "" || s == "{}" {
		return nil, true
	}
	var m map[string]any
	if json.Unmarshal([]byte(s), &m) != nil {
		return nil, false
	}
	return m, true
}

// recoverFile reads the memories of a database file and its log. A file
// whose header is destroyed has its page size tried from the common ones.
func recoverFile(file, wal []byte) *recovery {
	if d := newImage(file, wal, 0); d.pageSize != 0 {
		return d.memories()
	}
	var best *recovery
	for _, ps := range []int{4096, 16384, 8192, 1024, 2048, 32768, 65536, 512} {
		rc := newImage(file, wal, ps).memories()
		if best == nil || len(rc.rows) > len(best.rows) {
			best = rc
		}
	}
	return best
}

// Repair rebuilds the store at path from what can still be read. The
// damaged files are moved aside to path.damaged-TIME (kept, never
// deleted); every page of the database, with the log's committed frames
// over it, is read on its own (see recover.go), so damage costs the
// memories on the damaged pages and no others; a memory whose content is
// intact keeps it, with its unreadable fields rebuilt; and the new store
// at path is written in the current layout. Memories known to have
// existed (by their record or an index entry) that could not be read are
// listed in path.damaged-TIME.lost. Stop the server first.
func Repair(ctx context.Context, path string, opt RepairOptions) (RepairReport, error) {
	var rep RepairReport
	if _, err := os.Stat(path); err != nil {
		return rep, err
	}
	if err := rollBackJournal(path); err != nil {
		return rep, err
	}
	if w, err := CheckWAL(path); err == nil && w.Cut {
		rep.LogMissing = w.Lost
	}
	// Everything is read, and every embedding recomputed, before anything
	// changes: a repair that fails (an embedder that is down) leaves the
	// store as it found it.
	file, err := os.ReadFile(path)
	if err != nil {
		return rep, err
	}
	wal, err := os.ReadFile(path + "-wal")
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return rep, err
	}
	rc := recoverFile(file, wal)
	rep.FreeListDamaged = !rc.freeComplete
	for k := range rc.known {
		if rc.rows[k] == nil {
			if _, ok := rc.lost[k]; !ok {
				rc.lost[k] = LostMemory{Namespace: k[0], ID: k[1], Reason: "an index lists it; its record is unreadable"}
			}
		}
	}
	byNS := map[string][]*recovered{}
	for k, r := range rc.rows {
		if r.order == 0 {
			r.order = rc.known[k] // the order its index entry gives
		}
		byNS[r.ns] = append(byNS[r.ns], r)
	}
	rep.Rebuilt = map[string]int{}
	entries := map[string][]Entry{}
	for ns, rs := range byNS {
		// Insertion order: the stored order, then (unknown order) time.
		slices.SortFunc(rs, func(a, b *recovered) int {
			if (a.order == 0) != (b.order == 0) {
				return cmp.Compare(b.order, a.order) // known orders first
			}
			if c := cmp.Compare(a.order, b.order); c != 0 {
				return c
			}
			return a.e.Created.Compare(b.e.Created)
		})
		keep, lost, err := reembed(ctx, rs, opt.Embed)
		if err != nil {
			return rep, fmt.Errorf("%w; nothing was changed", err)
		}
		for _, l := range lost {
			rc.lost[memKey{l.Namespace, l.ID}] = l
		}
		for _, r := range keep {
			entries[ns] = append(entries[ns], r.e)
			for _, f := range r.rebuilt {
				rep.Rebuilt[f]++
			}
		}
	}
	rep.Lost = slices.SortedFunc(maps.Values(rc.lost), func(a, b LostMemory) int {
		return cmp.Or(cmp.Compare(a.Namespace, b.Namespace), cmp.Compare(a.ID, b.ID))
	})

	rep.Aside = fmt.Sprintf("%s.damaged-%s", path, time.Now().UTC().Format("20060102T150405Z"))
	for i := 2; ; i++ { // never over an earlier repair's files
		if _, err := os.Lstat(rep.Aside); errors.Is(err, os.ErrNotExist) {
			break
		}
		rep.Aside = fmt.Sprintf("%s.damaged-%s-%d", path, time.Now().UTC().Format("20060102T150405Z"), i)
	}
	for _, suf := range []string{"", "-wal", "-shm"} {
		if err := os.Rename(path+suf, rep.Aside+suf); err != nil && !errors.Is(err, os.ErrNotExist) {
			return rep, err
		}
	}
	if len(rep.Lost) > 0 {
		rep.LostFile = rep.Aside + ".lost"
		if err := writeLost(rep.LostFile, rep.Lost); err != nil {
			return rep, err
		}
	}
	dst, err := OpenSQLite(path, SQLiteOptions{})
	if err != nil {
		return rep, err
	}
	defer dst.Close()
	for _, ns := range slices.Sorted(maps.Keys(entries)) {
		if _, _, err := dst.importEntries(ctx, ns, entries[ns], false); err != nil {
			return rep, fmt.Errorf("write the rebuilt store (the damaged files are at %s): %w", rep.Aside, err)
		}
		rep.Kept += len(entries[ns])
	}
	return rep, nil
}

// reembed recomputes the embeddings of rs that could not be read. One
// that cannot be recomputed, or whose dimension is not the namespace's,
// is lost.
func reembed(ctx context.Context, rs []*recovered, embed func(context.Context, []string) ([][]float32, error)) (keep []*recovered, lost []LostMemory, err error) {
	dims := map[int]int{}
	var need []*recovered
	for _, r := range rs {
		if r.e.Embedding == nil {
			need = append(need, r)
		} else {
			dims[len(r.e.Embedding)]++
		}
	}
	for i := 0; i < len(need) && embed != nil; i += 64 {
		batch := need[i:min(i+64, len(need))]
		texts := make([]string, len(batch))
		for j, r := range batch {
			texts[j] = r.e.Content
		}
		vs, err := embed(ctx, texts)
		if err != nil {
			return nil, nil, fmt.Errorf("recompute embeddings: %w", err)
		}
		for j, r := range batch {
			r.e.Embedding = vs[j]
		}
	}
	dim := 0
	for d, n := range dims {
		if n > dims[dim] {
			dim = d
		}
	}
	for _, r := range rs {
		switch {
		case r.e.Embedding == nil:
			lost = append(lost, LostMemory{Namespace: r.ns, ID: r.e.ID, Content: r.e.Content,
				Reason: "its embedding is unreadable and no embedder was given to recompute it"})
		case dim != 0 && len(r.e.Embedding) != dim:
			lost = append(lost, LostMemory{Namespace: r.ns, ID: r.e.ID, Content: r.e.Content,
				Reason: fmt.Sprintf("its embedding is unreadable and the embedder gives dimension %d, the namespace's memories have %d", len(r.e.Embedding), dim)})
		default:
			dims[len(r.e.Embedding)]++
			if dim == 0 {
				dim = len(r.e.Embedding)
			}
			keep = append(keep, r)
		}
	}
	return keep, lost, nil
}

func writeLost(path string, lost []LostMemory) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	enc := json.NewEncoder(f)
	enc.SetEscapeHTML(false)
	for _, l := range lost {
		if err := enc.Encode(l); err != nil {
			f.Close()
			return err
		}
	}
	return f.Close()
}
