package ltm

import (
	"database/sql"
	"errors"
	"fmt"
	"os"
	"strings"
)

// ErrDamaged is a store file or write-ahead log that fails its checks;
// OpenSQLite refuses it rather than serve from it or write into it.
var ErrDamaged = errors.New("the memory store is damaged")

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
	w := r.WAL
	switch {
	case w.Cut && w.BadHeader:
		parts = append(parts, fmt.Sprintf("the write-ahead log's header fails its checksum, and its index records %d committed frames not yet in the database file: those acknowledged writes are lost", w.Lost))
	case w.Cut:
		parts = append(parts, fmt.Sprintf("the write-ahead log was cut: its index records %d committed frames, the log holds %d that verify; the %d frames of acknowledged writes after them are gone",
			w.IndexFrames, w.Valid, w.Lost))
	case w.BadHeader:
		parts = append(parts, "the write-ahead log's header fails its checksum, so SQLite would ignore every write in it")
	case w.Lost > 0:
		parts = append(parts, fmt.Sprintf("the write-ahead log breaks at frame %d of %d: %d frames of acknowledged writes after it, %d committed transactions among them, would be dropped",
			w.BreakAt, w.Frames, w.Lost, w.LostCommits))
	}
	if len(parts) == 0 {
		return "ok"
	}
	return strings.Join(parts, "; ")
}

// Check examines the store at path without changing it: the log first
// (with its index, before SQLite rebuilds the index from the log), then
// quick_check on a read-only connection.
func Check(path string) (Report, error) {
	var rep Report
	if _, err := os.Stat(path); err != nil {
		return rep, err
	}
	if err := rollBackJournal(path); err != nil {
		return rep, err
	}
	wal, err := CheckWAL(path)
	if err != nil {
		return rep, err
	}
	rep.WAL = wal
	// Opening would run SQLite's recovery, which drops what the check
	// found lost and rewrites the index that proves it; a damaged log is
	// checked on the database file alone.
	rep.QuickCheck, err = quickCheck(path, wal.Lost > 0 || wal.BadHeader)
	return rep, err
}

// rollBackJournal lets SQLite roll back a hot rollback journal (left by a
// crash inside the one step that leaves WAL mode: the layout migration's
// VACUUM), which restores the file losslessly; the checks and a repair
// then read the file as it was before.
func rollBackJournal(path string) error {
	if st, err := os.Stat(path + "-journal"); err != nil || st.Size() == 0 {
		return nil
	}
	db, err := sql.Open("sqlite", "file:"+path)
	if err != nil {
		return err
	}
	defer db.Close()
	var n int
	if err := db.QueryRow("SELECT count(*) FROM sqlite_schema").Scan(&n); err != nil {
		return fmt.Errorf("roll back %s-journal: %w", path, err)
	}
	return nil
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
