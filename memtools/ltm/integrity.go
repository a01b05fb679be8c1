package ltm

import (
	"context"
	"database/sql"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"time"
)

// ErrDamaged is a store file or write-ahead log that fails its checks;
// OpenSQLite refuses it rather than serve from it or write into it.
var ErrDamaged = errors.New("the memory store is damaged")

// WALReport is what a write-ahead log holds, read frame by frame with
// SQLite's own checksums (https://sqlite.org/fileformat2.html#walformat).
type WALReport struct {
	Frames int // frames of the log's current generation (its salts)
	Valid  int // frames SQLite's recovery will apply: the checksummed chain up to its last commit
	// Lost is frames of the current generation after the chain breaks:
	// writes that were acknowledged (or part of them) and that SQLite's
	// recovery would drop without a word.
	Lost int
	// BadHeader is a log whose header fails its checksum: SQLite ignores
	// the whole log.
	BadHeader bool
}

// CheckWAL reads path's -wal file (absent: an empty report).
func CheckWAL(path string) (WALReport, error) {
	var rep WALReport
	raw, err := os.ReadFile(path + "-wal")
	if errors.Is(err, os.ErrNotExist) {
		return rep, nil
	}
	if err != nil {
		return rep, err
	}
	if len(raw) < 32 {
		return rep, nil // an empty or truncated-to-nothing log holds no writes
	}
	magic := binary.BigEndian.Uint32(raw)
	if magic != 0x377f0682 && magic != 0x377f0683 {
		rep.BadHeader = true
		return rep, nil
	}
	var order binary.ByteOrder = binary.LittleEndian
	if magic&1 == 1 {
		order = binary.BigEndian
	}
	sum := func(s0, s1 uint32, b []byte) (uint32, uint32) {
		for i := 0; i+8 <= len(b); i += 8 {
			s0 += order.Uint32(b[i:]) + s1
			s1 += order.Uint32(b[i+4:]) + s0
		}
		return s0, s1
	}
	page := int(binary.BigEndian.Uint32(raw[8:]))
	salt1, salt2 := binary.BigEndian.Uint32(raw[16:]), binary.BigEndian.Uint32(raw[20:])
	s0, s1 := sum(0, 0, raw[:24])
	if s0 != binary.BigEndian.Uint32(raw[24:]) || s1 != binary.BigEndian.Uint32(raw[28:]) || page < 512 || page > 65536 || page&(page-1) != 0 {
		rep.BadHeader = true
		// Without a trustworthy header no frame can be checked; any
		// frame-sized content means writes SQLite will not apply.
		if len(raw) >= 32+24+512 {
			rep.Lost = 1
		}
		return rep, nil
	}
	frame := 24 + page
	badAt := -1 // the first frame whose checksum fails
	for off := 32; off+frame <= len(raw); off += frame {
		h := raw[off : off+24]
		if binary.BigEndian.Uint32(h[8:]) != salt1 || binary.BigEndian.Uint32(h[12:]) != salt2 {
			if badAt < 0 {
				break // a previous generation's frames: already checkpointed
			}
			continue
		}
		rep.Frames++
		if badAt >= 0 {
			continue
		}
		a, b := sum(s0, s1, h[:8])
		a, b = sum(a, b, raw[off+24:off+frame])
		if a != binary.BigEndian.Uint32(h[16:]) || b != binary.BigEndian.Uint32(h[20:]) {
			badAt = rep.Frames - 1
			continue
		}
		s0, s1 = a, b
		if binary.BigEndian.Uint32(h[4:]) != 0 { // a commit frame
			rep.Valid = rep.Frames
		}
	}
	// A bad last frame is a torn write whose transaction never committed;
	// a bad frame with frames of the same log after it is damage.
	if badAt >= 0 && badAt < rep.Frames-1 {
		rep.Lost = rep.Frames - badAt
	}
	return rep, nil
}

// Report is a store's integrity: SQLite's quick_check of the database
// file (with the log applied) and the log's own frames.
type Report struct {
	QuickCheck []string // "ok", or what SQLite found
	WAL        WALReport
}

// OK reports a store that is safe to open.
func (r Report) OK() bool {
	return len(r.QuickCheck) == 1 && r.QuickCheck[0] == "ok" && r.WAL.Lost == 0 && !r.WAL.BadHeader
}

func (r Report) String() string {
	var parts []string
	if !(len(r.QuickCheck) == 1 && r.QuickCheck[0] == "ok") {
		qc := r.QuickCheck
		if len(qc) > 3 {
			qc = append(qc[:3:3], fmt.Sprintf("and %d more", len(r.QuickCheck)-3))
		}
		parts = append(parts, "quick_check: "+strings.Join(qc, "; "))
	}
	if r.WAL.BadHeader {
		parts = append(parts, "the write-ahead log's header fails its checksum, so SQLite would ignore every write in it")
	} else if r.WAL.Lost > 0 {
		parts = append(parts, fmt.Sprintf("the write-ahead log breaks after %d of its %d frames: %d frames of acknowledged writes would be dropped",
			r.WAL.Valid, r.WAL.Frames, r.WAL.Lost))
	}
	if len(parts) == 0 {
		return "ok"
	}
	return strings.Join(parts, "; ")
}

// Check examines the store at path without changing it: the log first (as
// SQLite would recover it), then quick_check on a read-only connection.
func Check(path string) (Report, error) {
	var rep Report
	if _, err := os.Stat(path); err != nil {
		return rep, err
	}
	wal, err := CheckWAL(path)
	if err != nil {
		return rep, err
	}
	rep.WAL = wal
	if wal.Lost > 0 || wal.BadHeader {
		// Opening would run SQLite's recovery, which may rewrite the log;
		// check a copy's database file alone instead.
		rep.QuickCheck, err = quickCheck(path, true)
		return rep, err
	}
	rep.QuickCheck, err = quickCheck(path, false)
	return rep, err
}

// quickCheck runs PRAGMA quick_check; immutable reads the file alone,
// ignoring (and never touching) its log.
func quickCheck(path string, immutable bool) ([]string, error) {
	dsn := "file:" + path + "?mode=ro"
	if immutable {
		dsn += "&immutable=1"
	}
	db, err := sql.Open("sqlite", dsn)
	if err != nil {
		return nil, err
	}
	defer db.Close()
	rows, err := db.Query("PRAGMA quick_check")
	if err != nil {
		return []string{err.Error()}, nil
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var s string
		if err := rows.Scan(&s); err != nil {
			return append(out, err.Error()), nil
		}
		out = append(out, s)
	}
	if err := rows.Err(); err != nil {
		out = append(out, err.Error())
	}
	return out, nil
}

// Repair rebuilds the store at path from what can still be read: the
// damaged files are moved aside to path.damaged-TIME (kept, never
// deleted), every row SQLite can read from them is written into a new
// store at path, and the counts are returned. What the broken part of a
// log held is not recoverable; Repair makes that loss explicit instead of
// silent.
func Repair(path string) (kept int, aside string, err error) {
	aside = fmt.Sprintf("%s.damaged-%s", path, time.Now().UTC().Format("20060102T150405Z"))
	for _, suf := range []string{"", "-wal", "-shm"} {
		if err := os.Rename(path+suf, aside+suf); err != nil && !errors.Is(err, os.ErrNotExist) {
			return 0, "", err
		}
	}
	// A copy of the damaged file is what SQLite reads (and recovers), so
	// the kept one stays as it was.
	work := aside + ".reading"
	if err := copyFile(aside, work); err != nil {
		return 0, aside, err
	}
	defer os.Remove(work)
	if err := copyFile(aside+"-wal", work+"-wal"); err != nil && !errors.Is(err, os.ErrNotExist) {
		return 0, aside, err
	}
	defer os.Remove(work + "-wal")
	defer os.Remove(work + "-shm")
	src, err := sql.Open("sqlite", "file:"+work)
	if err != nil {
		return 0, aside, err
	}
	defer src.Close()
	dst, err := OpenSQLite(path, SQLiteOptions{})
	if err != nil {
		return 0, aside, err
	}
	defer dst.Close()
	ctx := context.Background()
	// Each scan stops at the first unreadable page; scanning the table
	// from both ends and through the index reaches the rows on either side
	// of the damage.
	byNS := map[string][]Entry{}
	seen := map[[2]string]bool{}
	for _, q := range []string{
		"SELECT " + entryCols + ", namespace FROM memories NOT INDEXED",
		"SELECT " + entryCols + ", namespace FROM memories NOT INDEXED ORDER BY namespace DESC, id DESC",
		"SELECT " + entryCols + ", namespace FROM memories INDEXED BY memories_ns_seq ORDER BY namespace, seq",
	} {
		rows, err := src.QueryContext(ctx, q)
		if err != nil {
			continue
		}
		for rows.Next() {
			var ns string
			e, err := scanEntry(func(dst ...any) error { return rows.Scan(append(dst, &ns)...) })
			if err != nil {
				break // the rest of this scan is unreadable
			}
			if k := [2]string{ns, e.ID}; !seen[k] {
				seen[k] = true
				byNS[ns] = append(byNS[ns], e)
			}
		}
		rows.Close()
	}
	for ns, es := range byNS {
		added, replaced, err := dst.Import(ctx, ns, es)
		if err != nil {
			return kept, aside, err
		}
		kept += added + replaced
	}
	return kept, aside, nil
}

func copyFile(from, to string) error {
	in, err := os.Open(from)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.Create(to)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}
