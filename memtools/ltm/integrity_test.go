package ltm

import (
	"bufio"
	"context"
	"database/sql"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestMain runs the crash writer when a test starts this binary as one.
func TestMain(m *testing.M) {
	if path := os.Getenv("AGEMEM_LTM_WRITER"); path != "" {
		crashWriter(path)
		return
	}
	os.Exit(m.Run())
}

// crashWriter adds memories to path, printing each id once Add returned,
// then "done", and waits to be killed.
func crashWriter(path string) {
	db, err := OpenSQLite(path, SQLiteOptions{})
	if err != nil {
		fmt.Println("ERR", err)
		os.Exit(1)
	}
	ns, _ := db.Namespace("crash")
	var n int
	fmt.Sscan(os.Getenv("AGEMEM_LTM_WRITES"), &n)
	for i := range n {
		e, err := ns.Add(context.Background(), entry(fmt.Sprintf("fact number %d", i), map[string]any{"i": i}))
		if err != nil {
			fmt.Println("ERR", err)
			os.Exit(1)
		}
		fmt.Println(e.ID)
	}
	fmt.Println("done")
	time.Sleep(time.Hour)
}

// crashedStore is a store a process wrote n memories to, acknowledged
// each, and was killed with SIGKILL in: its file, log and wal-index as the
// crash left them.
func crashedStore(t *testing.T, n int) (path string, acked []string) {
	t.Helper()
	path = filepath.Join(t.TempDir(), "crash.db")
	cmd := exec.Command(os.Args[0])
	cmd.Env = append(os.Environ(), "AGEMEM_LTM_WRITER="+path, fmt.Sprint("AGEMEM_LTM_WRITES=", n))
	out, _ := cmd.StdoutPipe()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { cmd.Process.Signal(syscall.SIGKILL); cmd.Wait() }()
	sc := bufio.NewScanner(out)
	for sc.Scan() {
		line := sc.Text()
		switch {
		case strings.HasPrefix(line, "ERR"):
			t.Fatal(line)
		case line == "done":
			cmd.Process.Signal(syscall.SIGKILL)
			cmd.Wait()
			return path, acked
		case ValidID(line):
			acked = append(acked, line)
		}
	}
	t.Fatalf("the writer stopped after %d of %d", len(acked), n)
	return
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

// copyStore copies a store's file, log and wal-index (those present).
func copyStore(t *testing.T, from, to string) {
	t.Helper()
	for _, suf := range []string{"", "-wal", "-shm"} {
		if err := copyFile(from+suf, to+suf); err != nil && !errors.Is(err, os.ErrNotExist) {
			t.Fatal(err)
		}
	}
}

// sqliteCount is how many memories SQLite itself reads from path,
// recovering the log as it does (no check first).
func sqliteCount(t *testing.T, path string) int {
	t.Helper()
	db, err := sql.Open("sqlite", "file:"+path)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	var n int
	if err := db.QueryRow("SELECT count(*) FROM memories").Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

func walPageSize(t *testing.T, path string) int {
	raw, err := os.ReadFile(path + "-wal")
	if err != nil || len(raw) < 32 {
		t.Fatalf("no log at %s: %v", path, err)
	}
	return int(binary.BigEndian.Uint32(raw[8:]))
}

// The case: a log cut inside a frame, in the middle or inside
// its last frame. The log alone cannot tell that from a crash's torn
// tail; the wal-index that the killed writer left records the committed
// frames, so the check says the log was cut and how much, the store is
// refused, and SQLite's own recovery (what opening would do) is shown to
// lose acknowledged writes.
func TestCutLogIsRefusedWithWhatWasLost(t *testing.T) {
	crashed, acked := crashedStore(t, 800)
	rep, err := CheckWAL(crashed)
	if err != nil || rep.IndexFrames < 20 || rep.Valid != rep.IndexFrames || rep.Lost != 0 || rep.Cut {
		t.Fatalf("the killed writer's own log: %+v %v", rep, err)
	}
	frames, page := rep.IndexFrames, walPageSize(t, crashed)
	for _, c := range []struct {
		name string
		at   int // bytes of the log kept
	}{
		{"inside a middle frame", 32 + frames/2*(24+page) + 1000},
		{"inside the last frame", 32 + (frames-1)*(24+page) + 1000},
	} {
		t.Run(c.name, func(t *testing.T) {
			dir := t.TempDir()
			cut, raw := filepath.Join(dir, "cut.db"), filepath.Join(dir, "raw.db")
			copyStore(t, crashed, cut)
			if err := os.Truncate(cut+"-wal", int64(c.at)); err != nil {
				t.Fatal(err)
			}
			copyStore(t, cut, raw)
			r, err := Check(cut)
			if err != nil {
				t.Fatal(err)
			}
			if r.OK() || !r.WAL.Cut || r.WAL.Lost != frames-r.WAL.Valid || r.WAL.Lost == 0 {
				t.Fatalf("check of a cut log: %+v", r)
			}
			if !strings.Contains(r.String(), fmt.Sprintf("its index records %d committed frames", frames)) {
				t.Fatalf("the report does not say what was lost: %s", r)
			}
			if _, err := OpenSQLite(cut, SQLiteOptions{}); !errors.Is(err, ErrDamaged) || !strings.Contains(err.Error(), "was cut") {
				t.Fatalf("opening a cut log: %v", err)
			}
			// What SQLite's recovery would have served: acknowledged
			// memories missing, without a word.
			readable := sqliteCount(t, raw)
			if readable >= len(acked) {
				t.Fatalf("the cut kept all %d acknowledged memories: the case proves nothing", readable)
			}
			// The check changed nothing: a second one says the same.
			if again, _ := Check(cut); again.WAL != r.WAL {
				t.Fatalf("the check changed the evidence: %+v then %+v", r.WAL, again.WAL)
			}
			rr, err := Repair(context.Background(), cut, RepairOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if rr.LogMissing != r.WAL.Lost || rr.Kept < readable {
				t.Fatalf("repair: %+v; SQLite reads %d", rr, readable)
			}
			t.Logf("cut %s: %d of %d acknowledged memories gone with %d frames; repair kept %d and names the %d missing frames",
				c.name, len(acked)-readable, len(acked), r.WAL.Lost, rr.Kept, rr.LogMissing)
		})
	}
}

// A crash's torn tail, a frame the killed writer had begun and not
// finished (its transaction never acknowledged), is not damage: the
// store opens with every acknowledged memory, with or without the
// wal-index.
func TestTornTailIsACrashNotDamage(t *testing.T) {
	crashed, acked := crashedStore(t, 300)
	page := walPageSize(t, crashed)
	raw, _ := os.ReadFile(crashed + "-wal")
	rep, _ := CheckWAL(crashed)
	end := 32 + rep.Frames*(24+page)
	last := raw[end-(24+page) : end]
	// The next frame of the same generation, as a writer starts it: its
	// header (salts of this log), and a page the crash cut short or that
	// still holds an earlier generation's bytes.
	next := append([]byte(nil), last...)
	binary.BigEndian.PutUint32(next[4:], 0)
	next[24+7] ^= 0xff
	for _, c := range []struct {
		name     string
		tail     []byte
		keepShm  bool
		wantTorn int
	}{
		{"a partial frame", next[:24+600], true, 1},
		{"a whole frame that does not verify", next, true, 1},
		{"a whole frame that does not verify, no wal-index", next, false, 1},
	} {
		t.Run(c.name, func(t *testing.T) {
			p := filepath.Join(t.TempDir(), "m.db")
			copyStore(t, crashed, p)
			if !c.keepShm {
				os.Remove(p + "-shm")
			}
			w := append(append([]byte(nil), raw[:end]...), c.tail...)
			os.WriteFile(p+"-wal", w, 0o644)
			r, err := Check(p)
			if err != nil || !r.OK() || r.WAL.Torn != c.wantTorn {
				t.Fatalf("a torn tail: %+v %v", r, err)
			}
			s, err := OpenSQLite(p, SQLiteOptions{})
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			ns, _ := s.Namespace("crash")
			for _, id := range acked {
				if _, err := ns.Get(context.Background(), id); err != nil {
					t.Fatalf("acknowledged %s: %v", id, err)
				}
			}
		})
	}
}

// A log damaged in the middle would lose the committed writes after the
// damage in SQLite's recovery; the check names the frame and counts the
// commits after it, the store is refused, and repair reads those frames
// (each verifies by its own link) so the damage costs at most the rows of
// the damaged frame.
func TestDamagedLogIsRefusedAndRepairReadsPastTheBreak(t *testing.T) {
	crashed, acked := crashedStore(t, 400)
	page := walPageSize(t, crashed)
	rep, _ := CheckWAL(crashed)
	p := filepath.Join(t.TempDir(), "m.db")
	copyStore(t, crashed, p)
	raw, _ := os.ReadFile(p + "-wal")
	off := 32 + (rep.Frames/2)*(24+page) + 24 + 100
	raw[off] ^= 0xff
	os.WriteFile(p+"-wal", raw, 0o644)
	for _, keepShm := range []bool{true, false} {
		q := filepath.Join(t.TempDir(), "q.db")
		copyStore(t, p, q)
		if !keepShm {
			os.Remove(q + "-shm")
		}
		r, err := Check(q)
		if err != nil || r.OK() || r.WAL.BreakAt != rep.Frames/2+1 || r.WAL.LostCommits == 0 {
			t.Fatalf("wal-index %v: check of a damaged log: %+v %v", keepShm, r, err)
		}
		if _, err := OpenSQLite(q, SQLiteOptions{}); !errors.Is(err, ErrDamaged) || !strings.Contains(err.Error(), "breaks at frame") {
			t.Fatalf("a damaged log: %v", err)
		}
	}
	readable := func() int {
		q := filepath.Join(t.TempDir(), "q.db")
		copyStore(t, p, q)
		return sqliteCount(t, q)
	}()
	rr, err := Repair(context.Background(), p, RepairOptions{Embed: embedder})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(rr.Aside + "-wal"); err != nil {
		t.Fatalf("the damaged log is not kept: %v", err)
	}
	if n := count(t, p, "crash"); n != rr.Kept || rr.Kept+len(rr.Lost) < len(acked) || rr.Kept <= readable {
		t.Fatalf("repair kept %d (store holds %d), lost %d of %d; SQLite's recovery reads %d", rr.Kept, n, len(rr.Lost), len(acked), readable)
	}
	t.Logf("damaged frame %d of %d: SQLite's recovery keeps %d of %d acknowledged memories, repair %d (lost %d)",
		rep.Frames/2+1, rep.Frames, readable, len(acked), rr.Kept, len(rr.Lost))
}
