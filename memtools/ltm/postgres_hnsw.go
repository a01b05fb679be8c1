package ltm

// HNSW indexes: one per large namespace (and dimension), a partial index
// on that namespace's rows. A table-wide index filtered to one namespace
// measured badly: a namespace of 20,000 memories in a table of 1.2M took
// 590 ms through it against 90 ms exactly (every candidate the graph
// yields is fetched from the heap to test its namespace), namespaces of
// 100 got recall@10 0.13, and every write of every namespace paid for
// inserting into one big graph. A namespace's own graph answers only its
// rows, and only its writes maintain it.

import (
	"context"
	"crypto/md5"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"hash/fnv"
	"strings"
	"time"
)

// hnswType is the type a dimension is indexed as: pgvector's HNSW takes
// vector up to 2,000 dimensions and halfvec up to 4,000.
func hnswType(d int) (string, bool) {
	switch {
	case d <= 2000:
		return "vector", true
	case d <= 4000:
		return "halfvec", true
	}
	return "", false
}

// hnswName is the index of namespace ns's vectors of dimension d (the
// namespace hashed: any text, and within PostgreSQL's 63 characters).
func hnswName(ns string, d int) string {
	h := md5.Sum([]byte(ns))
	return fmt.Sprintf("agemem_memories_hnsw_%d_%s", d, hex.EncodeToString(h[:8]))
}

// hnswLock is the advisory lock (bigint space) of one index's build.
func hnswLock(ns string, d int) int64 {
	h := fnv.New64a()
	h.Write(binary.LittleEndian.AppendUint32(nil, uint32(d)))
	h.Write([]byte(ns))
	return int64(h.Sum64())
}

// quoteLiteral makes ns a dollar-quoted SQL literal, for the one place a
// value cannot be a parameter: an index predicate.
func quoteLiteral(ns string) string {
	tag := "$ns$"
	for i := 0; strings.Contains(ns, tag); i++ {
		tag = fmt.Sprintf("$ns%d$", i)
	}
	return tag + ns + tag
}

// large reports whether namespace ns holds at least HNSW.MinRows entries,
// counting at most that many, at most once a sizeTTL.
func (p *Postgres) large(ctx context.Context, ns string) (bool, error) {
	p.mu.Lock()
	s, ok := p.sizes[ns]
	p.mu.Unlock()
	if ok && time.Since(s.at) < sizeTTL {
		return s.large, nil
	}
	var c int
	if err := p.pool.QueryRow(ctx, "SELECT count(*) FROM (SELECT 1 FROM agemem_memories WHERE namespace = $1 LIMIT $2) t",
		ns, p.opt.HNSW.MinRows).Scan(&c); err != nil {
		return false, err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.sizes) > 100000 { // forget them all rather than grow without bound
		clear(p.sizes)
	}
	p.sizes[ns] = nsSize{large: c >= p.opt.HNSW.MinRows, at: time.Now()}
	return c >= p.opt.HNSW.MinRows, nil
}

// hnswState is what this process knows of one index.
type hnswState struct {
	valid    bool
	building bool
	next     time.Time // look again (and maybe build) from then on
}

// indexReady reports whether namespace ns's index of dimension d is built
// and valid; when it is not, it starts building it in the background (one
// build at a time per process, and per index across every process sharing
// the database) and the caller searches exactly meanwhile. It asks the
// database at most every 30 s, and after a failed build (a role that may
// not create indexes, say) every 10 minutes.
func (p *Postgres) indexReady(ctx context.Context, ns string, d int) bool {
	key := hnswName(ns, d)
	p.mu.Lock()
	st := p.indexes[key]
	if st == nil {
		st = &hnswState{}
		p.indexes[key] = st
	}
	if st.valid || st.building || time.Now().Before(st.next) {
		defer p.mu.Unlock()
		return st.valid
	}
	st.next = time.Now().Add(30 * time.Second)
	p.mu.Unlock()
	valid, err := p.indexValid(ctx, ns, d)
	p.mu.Lock()
	defer p.mu.Unlock()
	if err != nil || valid {
		st.valid = valid
		return valid
	}
	st.building = true
	p.builds.Add(1)
	go func() {
		defer p.builds.Done()
		p.buildSlot <- struct{}{}
		err := p.BuildIndex(p.bg, ns, d)
		<-p.buildSlot
		valid := false
		if err == nil { // built, or another process is building it
			valid, err = p.indexValid(p.bg, ns, d)
		}
		p.mu.Lock()
		defer p.mu.Unlock()
		st.building, st.valid = false, valid
		st.next = time.Now().Add(30 * time.Second)
		if err != nil && !errors.Is(err, context.Canceled) {
			p.log.Error("memory store: HNSW index build failed; the namespace is searched exactly", "namespace", ns, "dim", d, "err", err)
			st.next = time.Now().Add(10 * time.Minute)
		}
	}()
	return false
}

// indexValid reports whether the index exists and is usable (a build that
// was interrupted leaves an invalid one).
func (p *Postgres) indexValid(ctx context.Context, ns string, d int) (bool, error) {
	var valid *bool
	err := p.pool.QueryRow(ctx, "SELECT (SELECT indisvalid FROM pg_index WHERE indexrelid = to_regclass($1))", hnswName(ns, d)).Scan(&valid)
	return valid != nil && *valid, err
}

// BuildIndex builds namespace ns's HNSW index of dimension d with CREATE
// INDEX CONCURRENTLY, which lets writes go on meanwhile; a process that
// finds another building it returns at once. An invalid index that an
// interrupted build left is dropped first.
func (p *Postgres) BuildIndex(ctx context.Context, ns string, d int) error {
	typ, ok := hnswType(d)
	if !ok {
		return fmt.Errorf("dimension %d: pgvector indexes at most 4,000 dimensions (halfvec); the namespace is searched exactly", d)
	}
	name := hnswName(ns, d)
	conn, err := p.pool.Acquire(ctx)
	if err != nil {
		return p.wrap("build HNSW index", ns, err)
	}
	defer conn.Release()
	// A session lock (a concurrent build cannot run in a transaction),
	// freed with the connection if this process dies.
	key := hnswLock(ns, d)
	var got bool
	if err := conn.QueryRow(ctx, "SELECT pg_try_advisory_lock($1)", key).Scan(&got); err != nil {
		return p.wrap("build HNSW index", ns, err)
	}
	if !got {
		return nil
	}
	defer conn.Exec(context.WithoutCancel(ctx), "SELECT pg_advisory_unlock($1)", key)
	var valid *bool
	if err := conn.QueryRow(ctx, "SELECT (SELECT indisvalid FROM pg_index WHERE indexrelid = to_regclass($1))", name).Scan(&valid); err != nil {
		return p.wrap("build HNSW index", ns, err)
	}
	if valid != nil && *valid {
		return nil
	}
	if valid != nil {
		if _, err := conn.Exec(ctx, "DROP INDEX CONCURRENTLY IF EXISTS "+name); err != nil {
			return p.wrap("drop the invalid HNSW index", ns, err)
		}
	}
	if m := p.opt.HNSW.BuildMemory; m != "" {
		if _, err := conn.Exec(ctx, "SET maintenance_work_mem = '"+m+"'"); err != nil { // validated: digits and a unit
			return p.wrap("build HNSW index", ns, err)
		}
		defer conn.Exec(context.WithoutCancel(ctx), "RESET maintenance_work_mem")
	}
	start := time.Now()
	p.log.Info("memory store: building an HNSW index", "namespace", ns, "dim", d, "index", name)
	_, err = conn.Exec(ctx, fmt.Sprintf(`CREATE INDEX CONCURRENTLY %s ON agemem_memories
		USING hnsw ((embedding::%s(%d)) %s_cosine_ops) WITH (m = %d, ef_construction = %d)
		WHERE namespace = %s AND dim = %d`,
		name, typ, d, typ, p.opt.HNSW.M, p.opt.HNSW.EfConstruction, quoteLiteral(ns), d))
	if err != nil {
		return p.wrap("build HNSW index", ns, err)
	}
	p.log.Info("memory store: HNSW index built", "namespace", ns, "dim", d, "seconds", time.Since(start).Seconds())
	return nil
}
