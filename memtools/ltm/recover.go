package ltm

// Reading a damaged store page by page, as the file format lays it out
// (https://sqlite.org/fileformat2.html), rather than through SQLite's
// b-tree walks: a SQL scan stops at the first page it cannot read, and one
// damaged interior page hides every row below it though the rows' own
// pages are intact. Here every page of the database (the file, with the
// log's committed frames over it) that is not on the free list is read on
// its own: b-tree pages cell by cell, overflow chains followed as far as
// they hold, and pages whose header is destroyed searched for the records
// of memories their cells still hold.

import (
	"bytes"
	"encoding/binary"
	"unicode/utf8"
)

// dbImage is the database as a repair reads it.
type dbImage struct {
	file     []byte
	wal      map[uint32][]byte // committed page images of the log
	pageSize int
	usable   int // page size less the reserved bytes at each page's end
	nPages   uint32
}

var sqliteMagic = []byte("SQLite format 3\x00")

// newImage lays the log's committed frames over file. pageSize 0 takes
// the page size from the file's header, else from the log's; 0 comes back
// when neither says.
func newImage(file, walRaw []byte, pageSize int) *dbImage {
	d := &dbImage{file: file}
	w := parseWAL(walRaw)
	var walPages uint32
	if w.headerOK {
		d.wal, walPages = w.committedPages()
	}
	hdr := file
	if p1, ok := d.wal[1]; ok {
		hdr = p1
	}
	validHeader := len(hdr) >= 100 && bytes.HasPrefix(hdr, sqliteMagic)
	switch {
	case pageSize != 0:
	case validHeader:
		pageSize = int(binary.BigEndian.Uint16(hdr[16:]))
		if pageSize == 1 {
			pageSize = 65536
		}
	case w.headerOK:
		pageSize = w.pageSize
	}
	if pageSize < 512 || pageSize > 65536 || pageSize&(pageSize-1) != 0 {
		return d
	}
	d.pageSize, d.usable = pageSize, pageSize
	if validHeader && int(hdr[20]) < pageSize-480 {
		d.usable -= int(hdr[20])
	}
	d.nPages = uint32(len(file) / pageSize)
	switch {
	case walPages > 0:
		d.nPages = walPages
	case validHeader && binary.BigEndian.Uint32(hdr[24:]) == binary.BigEndian.Uint32(hdr[92:]):
		// The in-header size is valid when its change counter matches.
		if n := binary.BigEndian.Uint32(hdr[28:]); n > 0 {
			d.nPages = n
		}
	}
	return d
}

// page is page n (1-based), or nil.
func (d *dbImage) page(n uint32) []byte {
	if n == 0 || n > d.nPages {
		return nil
	}
	if p, ok := d.wal[n]; ok {
		return p
	}
	off := int(n-1) * d.pageSize
	if off+d.pageSize > len(d.file) {
		return nil
	}
	return d.file[off : off+d.pageSize]
}

// freePages is the free list: pages that hold nothing live (freed pages
// keep their old content, deleted memories included). complete says the
// list was read to its end with the length the header gives.
func (d *dbImage) freePages() (free map[uint32]bool, complete bool) {
	free = map[uint32]bool{}
	p1 := d.page(1)
	if len(p1) < 100 || !bytes.HasPrefix(p1, sqliteMagic) {
		return free, false
	}
	be := binary.BigEndian
	total := be.Uint32(p1[36:])
	for trunk := be.Uint32(p1[32:]); trunk != 0; {
		pg := d.page(trunk)
		if pg == nil || free[trunk] {
			return free, false
		}
		free[trunk] = true
		n := int(be.Uint32(pg[4:]))
		if n > d.usable/4-2 {
			return free, false
		}
		for i := range n {
			if leaf := be.Uint32(pg[8+4*i:]); leaf != 0 && leaf <= d.nPages {
				free[leaf] = true
			}
		}
		trunk = be.Uint32(pg)
	}
	return free, uint32(len(free)) == total
}

// varint is SQLite's big-endian variable-length integer; n is 0 when b
// ends inside it.
func varint(b []byte) (v int64, n int) {
	var u uint64
	for i := 0; i < 9 && i < len(b); i++ {
		if i == 8 {
			return int64(u<<8 | uint64(b[i])), 9
		}
		u = u<<7 | uint64(b[i]&0x7f)
		if b[i] < 0x80 {
			return int64(u), i + 1
		}
	}
	return 0, 0
}

// local is how much of a payload of p bytes a cell holds on its own page
// (the rest goes to overflow pages).
func (d *dbImage) local(p int, table bool) int {
	u := d.usable
	x := u - 35
	if !table {
		x = (u-12)*64/255 - 23
	}
	if p <= x {
		return p
	}
	m := (u-12)*32/255 - 23
	if k := m + (p-m)%(u-4); k <= x {
		return k
	}
	return m
}

// cell is a b-tree cell's payload, as much of it as could be read.
type cell struct {
	payload []byte
	size    int   // the payload's declared size
	rowid   int64 // a table leaf's key
	// ends are where each page's part of the payload ends (the cell's own
	// page first, then each overflow page): an overflow page overwritten
	// by something else spoils every column it holds, so a column proven
	// unreadable condemns its neighbours on the same page.
	ends     []int
	overflow []uint32 // the overflow pages followed
	off      int      // where the payload starts on its page
	page     uint32   // its page, once known
}

// cellAt reads the cell at off of a page of type typ.
func (d *dbImage) cellAt(img []byte, off int, typ byte, free map[uint32]bool) (cell, bool) {
	i := off
	if typ == 0x02 {
		i += 4 // left child
	}
	size, n := varint(img[min(i, len(img)):])
	if n == 0 || size <= 0 || size > 1<<30 {
		return cell{}, false
	}
	i += n
	var c cell
	if typ == 0x0d {
		if c.rowid, n = varint(img[min(i, len(img)):]); n == 0 {
			return cell{}, false
		}
		i += n
	}
	return d.payloadAt(img, i, int(size), typ == 0x0d, free, c)
}

// payloadAt reads a payload of size bytes starting at off, following its
// overflow chain.
func (d *dbImage) payloadAt(img []byte, off, size int, table bool, free map[uint32]bool, c cell) (cell, bool) {
	local := d.local(size, table)
	if off+local > d.usable {
		return cell{}, false
	}
	c.size, c.off = size, off
	c.payload = append([]byte(nil), img[off:off+local]...)
	c.ends = []int{local}
	if local == size || off+local+4 > d.usable {
		return c, true
	}
	seen := map[uint32]bool{}
	for next := binary.BigEndian.Uint32(img[off+local:]); len(c.payload) < size; {
		pg := d.page(next)
		if pg == nil || seen[next] || free[next] {
			break
		}
		seen[next] = true
		take := min(d.usable-4, size-len(c.payload))
		link := binary.BigEndian.Uint32(pg)
		// The last page of a chain links to nothing and a middle one to a
		// page that exists: a page that does not is not the chain's (it
		// was overwritten), and what it holds is not this payload.
		if (len(c.payload)+take == size) != (link == 0) || (link != 0 && link > d.nPages) {
			break
		}
		c.payload = append(c.payload, pg[4:4+take]...)
		c.ends = append(c.ends, len(c.payload))
		c.overflow = append(c.overflow, next)
		next = link
	}
	return c, true
}

// children are the pages an interior b-tree page points to: each cell's
// left child and the right-most pointer (nil for a leaf).
func children(img []byte, h int) []uint32 {
	typ := img[h]
	if typ != 0x02 && typ != 0x05 {
		return nil
	}
	be := binary.BigEndian
	out := []uint32{be.Uint32(img[h+8:])}
	for i := range int(be.Uint16(img[h+3:])) {
		if p := h + 12 + 2*i; p+2 <= len(img) {
			if off := int(be.Uint16(img[p:])); off+4 <= len(img) {
				out = append(out, be.Uint32(img[off:]))
			}
		}
	}
	return out
}

// btreeCells reads a b-tree page's cells through its cell pointers; ok is
// false when the page is not a b-tree page (an overflow page, or one whose
// header is destroyed).
func (d *dbImage) btreeCells(img []byte, h int, free map[uint32]bool) (cells []cell, ok bool) {
	if h+12 > len(img) {
		return nil, false
	}
	typ := img[h]
	hdr := 8
	switch typ {
	case 0x02, 0x05:
		hdr = 12
	case 0x0a, 0x0d:
	default:
		return nil, false
	}
	be := binary.BigEndian
	n := int(be.Uint16(img[h+3:]))
	ptrEnd := h + hdr + 2*n
	content := int(be.Uint16(img[h+5:]))
	if content == 0 {
		content = 65536
	}
	if ptrEnd > d.usable || content < ptrEnd || content > d.usable {
		return nil, false
	}
	if typ == 0x05 {
		return nil, true // interior table cells hold only keys
	}
	for i := range n {
		off := int(be.Uint16(img[h+hdr+2*i:]))
		if off < ptrEnd || off >= d.usable {
			continue
		}
		if c, ok := d.cellAt(img, off, typ, free); ok {
			cells = append(cells, c)
		}
	}
	return cells, true
}

// column is one value of a record.
type column struct {
	serial   int64
	data     []byte
	whole    bool // all its bytes could be read
	from, to int  // its bytes in the payload
}

func serialLen(st int64) int {
	switch {
	case st >= 12:
		return int((st - 12) / 2)
	case st >= 1 && st <= 4:
		return int(st)
	case st == 5:
		return 6
	case st == 6, st == 7:
		return 8
	case st == 0, st == 8, st == 9:
		return 0
	}
	return -1 // 10 and 11 are reserved
}

// kind is a column's type as a letter: t text, b blob, i integer, f
// float, n null.
func (c column) kind() byte {
	switch {
	case c.serial >= 13 && c.serial%2 == 1:
		return 't'
	case c.serial >= 12:
		return 'b'
	case c.serial == 7:
		return 'f'
	case c.serial == 0:
		return 'n'
	}
	return 'i'
}

func (c column) text() (string, bool) {
	if !c.whole || c.kind() != 't' || !utf8.Valid(c.data) {
		return "", false
	}
	return string(c.data), true
}

func (c column) integer() (int64, bool) {
	if !c.whole || c.kind() != 'i' {
		return 0, false
	}
	switch c.serial {
	case 8:
		return 0, true
	case 9:
		return 1, true
	}
	var v int64
	if len(c.data) > 0 && c.data[0]&0x80 != 0 {
		v = -1
	}
	for _, b := range c.data {
		v = v<<8 | int64(b)
	}
	return v, true
}

// record decodes a payload of size bytes of which payload holds the
// first len(payload): columns past what was read are not whole.
func record(payload []byte, size int) ([]column, bool) {
	h, n := varint(payload)
	if n == 0 || int(h) < n || h > 512 || int(h) > len(payload) {
		return nil, false
	}
	var cols []column
	for i := n; i < int(h); {
		st, m := varint(payload[i:int(h)])
		if m == 0 || serialLen(st) < 0 {
			return nil, false
		}
		cols = append(cols, column{serial: st})
		i += m
	}
	body := int(h)
	for i := range cols {
		l := serialLen(cols[i].serial)
		cols[i].from, cols[i].to = body, body+l
		if body+l <= len(payload) {
			cols[i].data, cols[i].whole = payload[body:body+l], true
		} else if body < len(payload) {
			cols[i].data = payload[body:]
		}
		body += l
	}
	if body != size {
		return nil, false // the lengths do not add up to the cell's payload: not a record
	}
	return cols, true
}

func shape(cols []column) string {
	b := make([]byte, len(cols))
	for i, c := range cols {
		b[i] = c.kind()
	}
	return string(b)
}

// The records a store holds, by shape (the kinds of their columns).
const (
	shapeRowV1   = "tttbttiii" // namespace, id, content, embedding, metadata, memory_type, created, updated, seq
	shapeRowV2   = "tttiittb"  // namespace, id, memory_type, created, updated, metadata, content, embedding
	shapeIndexV1 = "tit"       // memories_ns_seq: namespace, seq, id
	shapeIndexV2 = "tti"       // memories_ns_id: namespace, id, rowid
)

// rowShape tells a memory's record from a look at its kinds, allowing an
// integer stored as 0 or 1 (serial types 8 and 9, no bytes).
func rowShape(s string) string {
	for _, want := range []string{shapeRowV1, shapeRowV2} {
		if s == want {
			return want
		}
	}
	return ""
}

// scanRecords searches a page that is not a readable b-tree page for the
// records of memories: each id ("mem_" and eight hex digits) is the second
// column of its record, right after the namespace, so the record's header
// sits just before the namespace and says how long each column is.
func (d *dbImage) scanRecords(img []byte, free map[uint32]bool) []cell {
	var out []cell
	limit := min(len(img), d.usable)
	for at := 0; at < limit; {
		k := bytes.Index(img[at:limit], []byte("mem_"))
		if k < 0 {
			break
		}
		o := at + k
		at = o + 1
		if o+12 > limit || !ValidID(string(img[o:o+12])) {
			continue
		}
		for s := o - 1; s >= 0 && s >= o-300; s-- {
			h, n := varint(img[s:limit])
			if n == 0 || h < 9 || h > 40 || s+int(h) > o {
				continue
			}
			var sts []int64
			okHdr := true
			for i := s + n; i < s+int(h); {
				st, m := varint(img[i : s+int(h)])
				if m == 0 || serialLen(st) < 0 {
					okHdr = false
					break
				}
				sts = append(sts, st)
				i += m
			}
			if !okHdr || len(sts) < 8 || sts[1] != 13+2*12 || sts[0] < 13 || sts[0]%2 == 0 || s+int(h)+serialLen(sts[0]) != o {
				continue
			}
			cols := make([]column, len(sts))
			size := int(h)
			for i, st := range sts {
				cols[i].serial = st
				size += serialLen(st)
			}
			sh := rowShape(shape(cols))
			if sh == "" {
				continue
			}
			c := cell{}
			if sh == shapeRowV2 {
				c.rowid = rowidBefore(img[:s], size)
			}
			if c, ok := d.payloadAt(img, s, size, sh == shapeRowV2, free, c); ok {
				out = append(out, c)
			}
			break
		}
	}
	return out
}

// rowidBefore reads the key of a table leaf cell whose record starts
// where b ends: the cell is the payload's size and the rowid, as varints,
// then the record. 0 when the bytes before do not read so.
func rowidBefore(b []byte, size int) int64 {
	want := putVarint(int64(size))
	for l := 1; l <= 9 && l+len(want) <= len(b); l++ {
		at := len(b) - l
		if v, n := varint(b[at:]); n == l && v > 0 && bytes.Equal(b[at-len(want):at], want) {
			return v
		}
	}
	return 0
}

// putVarint encodes v (below 2^56) as SQLite does.
func putVarint(v int64) []byte {
	var groups []byte
	for {
		groups = append([]byte{byte(v & 0x7f)}, groups...)
		v >>= 7
		if v == 0 {
			break
		}
	}
	for i := range len(groups) - 1 {
		groups[i] |= 0x80
	}
	return groups
}
