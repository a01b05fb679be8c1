package ltm

// Writes: SQLite has one write slot; writers queue for it in-process
// (begin) so a burst waits its turn or gets ErrBusy instead of SQLITE_BUSY.

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strings"
	"sync"
	"time"

	"github.com/agemem/agemem/internal/gate"
)

func (n *sqliteNS) Add(ctx context.Context, e Entry) (Entry, error) {
	md, err := n.s.opt.Metadata.normalize(e.Metadata)
	if err != nil {
		return Entry{}, n.wrap("add memory", err)
	}
	tx, err := n.s.begin(ctx)
	if err != nil {
		return Entry{}, n.wrap("add memory", err)
	}
	defer tx.Rollback()
	d, err := n.dim(ctx, tx)
	if err != nil {
		return Entry{}, n.wrap("add memory", err)
	}
	if err := checkEmbedding(e.Embedding, d); err != nil {
		return Entry{}, n.wrap("add memory", err)
	}
	if err := checkText(e.Content, md); err != nil {
		return Entry{}, n.wrap("add memory", err)
	}
	// A namespace holds a content once; the write slot makes the look-up
	// and the insert one step.
	held, err := scanEntry(tx.QueryRowContext(ctx, "SELECT "+entryCols+" FROM memories WHERE namespace = ? AND content = ? ORDER BY rowid LIMIT 1", n.ns, e.Content).Scan)
	if err == nil {
		return held, nil
	}
	if !errors.Is(err, sql.ErrNoRows) {
		return Entry{}, n.wrap("add memory", err)
	}
	e.Metadata = md
	e.Embedding = unit(e.Embedding)
	e.Created = time.Now().UTC()
	e.Updated = e.Created
	mdJSON, _ := json.Marshal(orEmpty(md))
	for try := 0; ; try++ {
		e.ID = randomID()
		_, err = tx.ExecContext(ctx, insertMemory,
			n.ns, e.ID, e.Content, encodeVec(e.Embedding), string(mdJSON), e.MemoryType, e.Created.UnixNano(), e.Updated.UnixNano())
		if err == nil {
			break
		}
		if try > 8 || !strings.Contains(err.Error(), "UNIQUE") {
			return Entry{}, n.wrap("add memory", err)
		}
	}
	if err := n.bump(ctx, tx.Tx); err != nil {
		return Entry{}, n.wrap("add memory", err)
	}
	if err := tx.Commit(); err != nil {
		return Entry{}, n.wrap("add memory", err)
	}
	return e, nil
}

func (n *sqliteNS) Update(ctx context.Context, id, content string, embedding []float32, metadata map[string]any) (Entry, error) {
	tx, err := n.s.begin(ctx)
	if err != nil {
		return Entry{}, n.wrap("update "+id, err)
	}
	defer tx.Rollback()
	e, err := n.get(ctx, tx, id)
	if err != nil {
		return Entry{}, n.wrap("update "+id, err)
	}
	if err := checkEmbedding(embedding, len(e.Embedding)); err != nil {
		return Entry{}, n.wrap("update "+id, err)
	}
	if metadata != nil {
		md, err := n.s.opt.Metadata.normalize(metadata)
		if err != nil {
			return Entry{}, n.wrap("update "+id, err)
		}
		e.Metadata = md
	}
	if err := checkText(content, e.Metadata); err != nil {
		return Entry{}, n.wrap("update "+id, err)
	}
	e.Content = content
	e.Embedding = unit(embedding)
	e.Updated = time.Now().UTC()
	mdJSON, _ := json.Marshal(orEmpty(e.Metadata))
	if _, err := tx.ExecContext(ctx, `UPDATE memories SET content = ?, embedding = ?, metadata = ?, updated = ?
		WHERE namespace = ? AND id = ?`, e.Content, encodeVec(e.Embedding), string(mdJSON), e.Updated.UnixNano(), n.ns, id); err != nil {
		return Entry{}, n.wrap("update "+id, err)
	}
	if err := n.bump(ctx, tx.Tx); err != nil {
		return Entry{}, n.wrap("update "+id, err)
	}
	if err := tx.Commit(); err != nil {
		return Entry{}, n.wrap("update "+id, err)
	}
	return e, nil
}

func (n *sqliteNS) Delete(ctx context.Context, id string) error {
	tx, err := n.s.begin(ctx)
	if err != nil {
		return n.wrap("delete "+id, err)
	}
	defer tx.Rollback()
	res, err := tx.ExecContext(ctx, "DELETE FROM memories WHERE namespace = ? AND id = ?", n.ns, id)
	if err != nil {
		return n.wrap("delete "+id, err)
	}
	if k, _ := res.RowsAffected(); k == 0 {
		return fmt.Errorf("delete %s: %w", id, ErrNotFound)
	}
	if err := n.bump(ctx, tx.Tx); err != nil {
		return n.wrap("delete "+id, err)
	}
	if err := tx.Commit(); err != nil {
		return n.wrap("delete "+id, err)
	}
	return nil
}

// writeTx is a write transaction that holds the process's write slot
// until it commits or rolls back.
type writeTx struct {
	*sql.Tx
	release func()
}

func (t *writeTx) Commit() error {
	defer t.release()
	return t.Tx.Commit()
}

// Rollback after Commit is a no-op, as for sql.Tx. It frees the write slot
// whatever Rollback says: when the caller's context ends, database/sql rolls
// the transaction back by itself and Rollback reports ErrTxDone, and a slot
// kept then would block every later writer for good (the serve soak found
// it: clients hanging up mid-write).
func (t *writeTx) Rollback() error {
	defer t.release()
	return t.Tx.Rollback()
}

// begin waits for the write slot (ErrBusy if the queue is full) and opens
// an IMMEDIATE transaction.
func (s *SQLite) begin(ctx context.Context) (*writeTx, error) {
	release, err := s.writes.Enter(ctx)
	if errors.Is(err, gate.ErrFull) {
		return nil, ErrBusy
	}
	if err != nil {
		return nil, err
	}
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		release()
		return nil, err
	}
	return &writeTx{Tx: tx, release: sync.OnceFunc(release)}, nil
}

// Import writes entries into namespace ns in one transaction: all of them
// or none. An entry whose ID is a valid id keeps it, replacing the entry
// of that id if the namespace holds one (so importing the same export
// twice leaves one copy); others get new ids. Embeddings must be set.
func (s *SQLite) Import(ctx context.Context, ns string, es []Entry) (added, replaced int, err error) {
	return s.importEntries(ctx, ns, es, true)
}

// importEntries is Import; a repair writes back what a store held
// without holding it to today's metadata limits.
func (s *SQLite) importEntries(ctx context.Context, ns string, es []Entry, limits bool) (added, replaced int, err error) {
	if err := checkNamespace(ns); err != nil {
		return 0, 0, err
	}
	n := &sqliteNS{s: s, ns: ns}
	lim := s.opt.Metadata
	if !limits {
		lim = MetadataLimits{MaxBytes: math.MaxInt, MaxDepth: math.MaxInt}
	}
	tx, err := s.begin(ctx)
	if err != nil {
		return 0, 0, n.wrap("import", err)
	}
	defer tx.Rollback()
	d, err := n.dim(ctx, tx)
	if err != nil {
		return 0, 0, n.wrap("import", err)
	}
	now := time.Now().UTC()
	for i, e := range es {
		if err := checkEmbedding(e.Embedding, d); err != nil {
			return 0, 0, n.wrap(fmt.Sprintf("import entry %d", i+1), err)
		}
		d = len(e.Embedding)
		md, err := lim.normalize(e.Metadata)
		if me := (*MetadataError)(nil); errors.As(err, &me) {
			me.Entry = i + 1
		}
		if err == nil {
			err = checkText(e.Content, md)
		}
		if err != nil {
			return 0, 0, n.wrap(fmt.Sprintf("import entry %d", i+1), err)
		}
		mdJSON, _ := json.Marshal(orEmpty(md))
		created, updated := e.Created, e.Updated
		if created.IsZero() {
			created = now
		}
		if updated.IsZero() {
			updated = now
		}
		id := e.ID
		if ValidID(id) {
			var exists int
			if err := tx.QueryRowContext(ctx, "SELECT COUNT(*) FROM memories WHERE namespace = ? AND id = ?", ns, id).Scan(&exists); err != nil {
				return 0, 0, n.wrap("import", err)
			}
			if exists > 0 {
				if _, err := tx.ExecContext(ctx, `UPDATE memories SET content = ?, embedding = ?, metadata = ?, memory_type = ?, created = ?, updated = ?
					WHERE namespace = ? AND id = ?`, e.Content, encodeVec(e.Embedding), string(mdJSON), e.MemoryType, created.UnixNano(), updated.UnixNano(), ns, id); err != nil {
					return 0, 0, n.wrap("import", err)
				}
				replaced++
				continue
			}
		} else {
			id = ""
		}
		for try := 0; ; try++ {
			if id == "" || try > 0 {
				id = randomID()
			}
			_, err = tx.ExecContext(ctx, insertMemory,
				ns, id, e.Content, encodeVec(e.Embedding), string(mdJSON), e.MemoryType, created.UnixNano(), updated.UnixNano())
			if err == nil {
				break
			}
			if try > 8 || !strings.Contains(err.Error(), "UNIQUE") {
				return 0, 0, n.wrap("import", err)
			}
		}
		added++
	}
	if err := n.bump(ctx, tx.Tx); err != nil {
		return 0, 0, n.wrap("import", err)
	}
	if err := tx.Commit(); err != nil {
		return 0, 0, n.wrap("import", err)
	}
	return added, replaced, nil
}

func (n *sqliteNS) bump(ctx context.Context, tx *sql.Tx) error {
	_, err := tx.ExecContext(ctx, `INSERT INTO namespaces (namespace, version) VALUES (?, 1)
		ON CONFLICT(namespace) DO UPDATE SET version = version + 1`, n.ns)
	return err
}
