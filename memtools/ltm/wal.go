package ltm

// The write-ahead log and its index, read as SQLite specifies them
// (https://sqlite.org/fileformat2.html#walformat and #walindexformat).
//
// A log is a header and frames, each a page image with a cumulative
// checksum, so a frame verifies only if every frame before it was written
// whole and in order. A crash can leave at most the frames of the one
// transaction it interrupted unverified or partial, and only at the end
// of the log's current generation (its salts): a log whose chain breaks
// with committed frames of the same generation after the break was
// damaged afterwards. What the log cannot say is how far it reached
// before someone cut it; the wal-index (the -shm file) can: its header,
// kept by every writer and checksummed, records the last committed frame
// (mxFrame) and how many frames the database file already holds
// (nBackfill). SQLite trusts neither when it recovers: the first process
// to open the store rebuilds the index from whatever the log still holds,
// so OpenSQLite reads both before SQLite touches them.

import (
	"bytes"
	"encoding/binary"
	"errors"
	"os"
	"time"
)

const walIndexVersion = 3007000

// walFrame is one frame slot of a log file.
type walFrame struct {
	off    int    // offset of its header in the file
	page   uint32 // the page it holds
	commit uint32 // the database's size in pages after a commit frame; 0 otherwise
	// current: it carries the log header's salts (this generation's frame,
	// not a checkpointed one of an earlier generation).
	current bool
	// whole: the file holds all of it (false: the file ends inside it).
	whole bool
	// linked: its checksum follows from the previous frame's stored one
	// (the header's for the first), over its own header and page: it was
	// written whole and was not changed since.
	linked bool
}

// walLog is a parsed log.
type walLog struct {
	raw      []byte
	pageSize int
	salts    []byte // the header's salt-1 and salt-2, as stored
	headerOK bool   // magic, page size and header checksum hold
	frames   []walFrame
}

// walSum is SQLite's WAL checksum over b (a multiple of 8 bytes),
// continuing from (s0, s1).
func walSum(order binary.ByteOrder, s0, s1 uint32, b []byte) (uint32, uint32) {
	for i := 0; i+8 <= len(b); i += 8 {
		s0 += order.Uint32(b[i:]) + s1
		s1 += order.Uint32(b[i+4:]) + s0
	}
	return s0, s1
}

func parseWAL(raw []byte) *walLog {
	w := &walLog{raw: raw}
	if len(raw) < 32 {
		return w
	}
	be := binary.BigEndian
	magic := be.Uint32(raw)
	if magic != 0x377f0682 && magic != 0x377f0683 {
		return w
	}
	var order binary.ByteOrder = binary.LittleEndian
	if magic&1 == 1 {
		order = binary.BigEndian
	}
	page := int(be.Uint32(raw[8:]))
	s0, s1 := walSum(order, 0, 0, raw[:24])
	if s0 != be.Uint32(raw[24:]) || s1 != be.Uint32(raw[28:]) || page < 512 || page > 65536 || page&(page-1) != 0 {
		return w
	}
	w.headerOK, w.pageSize, w.salts = true, page, raw[16:24]
	frame := 24 + page
	for off := 32; off+24 <= len(raw); off += frame {
		h := raw[off : off+24]
		f := walFrame{off: off, page: be.Uint32(h), commit: be.Uint32(h[4:]),
			current: bytes.Equal(h[8:16], w.salts), whole: off+frame <= len(raw)}
		if f.whole {
			// The previous frame's stored checksum, whether or not that
			// frame verified: a frame damaged in its page still carries the
			// checksum its successor was computed from.
			p0, p1 := s0, s1
			if off > 32 {
				p0, p1 = be.Uint32(raw[off-frame+16:]), be.Uint32(raw[off-frame+20:])
			}
			a, b := walSum(order, p0, p1, h[:8])
			a, b = walSum(order, a, b, raw[off+24:off+frame])
			f.linked = a == be.Uint32(h[16:]) && b == be.Uint32(h[20:])
		}
		w.frames = append(w.frames, f)
	}
	return w
}

// chain is the length of the verified prefix SQLite's recovery reads
// (frames of this generation, whole, each linked to the one before) and
// the frames in it up to its last commit, which recovery applies.
func (w *walLog) chain() (verified, committed int) {
	for _, f := range w.frames {
		if !f.current || !f.whole || !f.linked {
			break
		}
		verified++
		if f.commit != 0 {
			committed = verified
		}
	}
	return verified, committed
}

// walIndex is what the header of a wal-index says.
type walIndex struct {
	ok        bool   // both copies of the header agree and its checksum holds
	mxFrame   uint32 // the last committed frame of the log
	nBackfill uint32 // frames already copied into the database file
	salts     []byte // the salts of the log it describes
}

// readWALIndex reads path's -shm header. Its integers are in the byte
// order of the machine that wrote it; the checksum tells which.
func readWALIndex(path string) walIndex {
	f, err := os.Open(path + "-shm")
	if err != nil {
		return walIndex{}
	}
	defer f.Close()
	raw := make([]byte, 136) // two 48-byte headers and the checkpoint info
	if n, _ := f.ReadAt(raw, 0); n < len(raw) {
		return walIndex{}
	}
	h := raw[:48]
	// SQLite writes the second copy first: copies that differ are a
	// header whose write was interrupted.
	if !bytes.Equal(h, raw[48:96]) || h[12] != 1 {
		return walIndex{}
	}
	for _, order := range []binary.ByteOrder{binary.LittleEndian, binary.BigEndian} {
		if order.Uint32(h) != walIndexVersion {
			continue
		}
		s0, s1 := walSum(order, 0, 0, h[:40])
		if s0 != order.Uint32(h[40:]) || s1 != order.Uint32(h[44:]) {
			return walIndex{}
		}
		return walIndex{ok: true, mxFrame: order.Uint32(h[16:]), nBackfill: order.Uint32(raw[96:]), salts: bytes.Clone(h[32:40])}
	}
	return walIndex{}
}

// WALReport is what a store's write-ahead log holds and what SQLite's
// recovery would make of it.
type WALReport struct {
	Frames int // frames of the log's current generation, whole or not
	Valid  int // frames recovery applies: the verified chain up to its last commit
	// Torn is frames after Valid that a crash left: the unfinished
	// transaction it interrupted, never acknowledged, which recovery
	// rightly drops.
	Torn int
	// Lost is frames of committed writes that recovery would drop without
	// a word: the frames after a break in the chain, or the committed
	// frames the wal-index records beyond what the log still holds.
	Lost int
	// LostCommits is the committed transactions that can be seen among the
	// lost frames (a cut log's are gone, not seen: 0).
	LostCommits int
	// BreakAt is the 1-based frame at which the chain breaks with committed
	// frames after it (damage); 0 if it does not.
	BreakAt int
	// Cut: the wal-index records committed frames the log no longer holds.
	Cut bool
	// IndexFrames is the last committed frame the wal-index records, -1
	// when there is no usable index (absent, or its header torn).
	IndexFrames int
	// BadHeader is a log whose header fails its checksum: SQLite ignores
	// the whole log.
	BadHeader bool
}

// CheckWAL reads path's wal-index and then its log (absent: an empty
// report). The index is read first: a writer appends to the log before it
// records the frames in the index, so a live writer never makes the index
// claim frames this read of the log missed, except when a checkpoint
// restarts the log in between, which a second read tells apart.
func CheckWAL(path string) (WALReport, error) {
	var rep WALReport
	var err error
	for try := 0; try < 3; try++ {
		if rep, err = checkWAL(path); err != nil || rep.Lost == 0 {
			return rep, err
		}
		time.Sleep(50 * time.Millisecond)
	}
	return rep, err
}

func checkWAL(path string) (WALReport, error) {
	rep := WALReport{IndexFrames: -1}
	idx := readWALIndex(path)
	if idx.ok {
		rep.IndexFrames = int(idx.mxFrame)
	}
	raw, err := os.ReadFile(path + "-wal")
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return rep, err
	}
	w := parseWAL(raw)
	// Frames the index records as committed and not yet in the database
	// file: what the log must hold.
	unbackfilled := 0
	if idx.ok && idx.mxFrame > idx.nBackfill {
		unbackfilled = int(idx.mxFrame - idx.nBackfill)
	}
	if !w.headerOK {
		switch {
		case unbackfilled > 0:
			// The index describes a log that is gone or unreadable.
			rep.Lost, rep.Cut, rep.BadHeader = unbackfilled, true, len(raw) >= 32
		case !idx.ok && len(raw) >= 32+24+512:
			// Frame-sized content behind a header SQLite will not read:
			// without an index, how much of it was committed is unknown.
			rep.BadHeader, rep.Lost = true, 1
		}
		return rep, nil
	}
	verified, committed := w.chain()
	rep.Valid = committed
	last := -1 // the last frame of this generation in the file
	for i, f := range w.frames {
		if f.current {
			rep.Frames++
			last = i
		}
	}
	rep.Torn = last + 1 - committed
	if idx.ok && !bytes.Equal(idx.salts, w.salts) {
		// A writer records a generation's salts in the index before it
		// writes that generation's first frame, so an index of other salts
		// with committed frames not in the file describes another log.
		if unbackfilled > 0 {
			rep.Lost, rep.Cut, rep.Torn = unbackfilled, true, 0
			return rep, nil
		}
		idx.ok = false // it says nothing about this log
	}
	// Committed frames after the break, seen by their own links.
	lastCommit := -1
	for i := verified + 1; i <= last; i++ {
		if f := w.frames[i]; f.current && f.whole && f.linked && f.commit != 0 {
			lastCommit = i
			rep.LostCommits++
		}
	}
	switch {
	case idx.ok && int(idx.mxFrame) > committed:
		// The index is the writers' own record of what committed: the log
		// ends before it (cut), or a whole frame before it fails (damage).
		rep.Lost, rep.Torn = int(idx.mxFrame)-committed, max(0, last+1-int(idx.mxFrame))
		whole := 0
		for whole < len(w.frames) && w.frames[whole].whole {
			whole++
		}
		if whole < int(idx.mxFrame) {
			rep.Cut = true
		} else {
			rep.BreakAt = verified + 1
		}
	case idx.ok:
		// Everything committed verifies; frames past it are the torn tail.
		rep.LostCommits = 0
	case lastCommit >= 0:
		rep.BreakAt, rep.Lost, rep.Torn = verified+1, lastCommit+1-committed, last-lastCommit
	default:
		rep.LostCommits = 0
	}
	if rep.Lost == 0 {
		rep.LostCommits = 0
	}
	return rep, nil
}

// committedPages are the page images a repair reads from the log: every
// frame of this generation that verifies by its own link, up to the last
// such commit frame, in order (a later image of a page replaces an
// earlier one), and the database's size in pages after that commit.
func (w *walLog) committedPages() (pages map[uint32][]byte, dbPages uint32) {
	end := -1
	for i, f := range w.frames {
		if f.current && f.whole && f.linked && f.commit != 0 {
			end = i
		}
	}
	pages = map[uint32][]byte{}
	for _, f := range w.frames[:end+1] {
		if f.current && f.whole && f.linked {
			pages[f.page] = w.raw[f.off+24 : f.off+24+w.pageSize]
			if f.commit != 0 {
				dbPages = f.commit
			}
		}
	}
	return pages, dbPages
}
