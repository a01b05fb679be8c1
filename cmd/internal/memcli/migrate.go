// Package memcli holds the memory commands that more than one binary
// offers (serve memory migrate, agemem-train memory migrate): one
// constructor, registered by each.
package memcli

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/agemem/agemem/memtools/ltm"
	"github.com/agemem/agemem/setup"
)

// Migrate is `memory migrate`: every namespace of one store copied into
// another, checked by counts and checksums. load gives the config whose
// memory section sizes the stores' connections (memory.max_conns,
// memory.sync).
func Migrate(load func() (setup.Config, error)) *cobra.Command {
	var from, to string
	var batch int
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "migrate --from STORE --to STORE",
		Short: "Copy every namespace of one memory store into another (SQLite, PostgreSQL), checked by counts and checksums",
		Long: `Copies every namespace of the --from store into the --to store: each memory
with its id, content, embedding, metadata, type and timestamps, in its
namespace's insertion order. A store is sqlite:FILE, a postgres:// URL, or
postgres: followed by key=value pairs; the PostgreSQL password comes from
PGPASSWORD or ~/.pgpass, never from the command line.

Only what the destination lacks is written, in transactions of --batch
memories, so a migration that was interrupted is finished by running the same
command again, and running it after it finished writes nothing. Nothing is
deleted. At the end every namespace's count and checksum (SHA-256 over its
memories in id order) are compared on both sides; any difference, such as
memories the destination held before, is listed and the command exits
non-zero. Stop the servers that write to --from first: a memory written to it
during the copy may be left behind (a second run copies it).`,
		Example: `  agemem-train memory migrate --from sqlite:data/memory.db --to postgres://agemem@db:5432/agemem
  PGPASSWORD=... serve memory migrate --from postgres://agemem@db/agemem --to sqlite:backup.db --json`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg, err := load()
			if err != nil {
				return err
			}
			ctx := cmd.Context()
			if ctx == nil {
				ctx = context.Background()
			}
			src, err := open(ctx, cfg, "--from", from, true)
			if err != nil {
				return err
			}
			defer src.Close()
			dst, err := open(ctx, cfg, "--to", to, false)
			if err != nil {
				return err
			}
			defer dst.Close()
			progress := newProgress(cmd.ErrOrStderr())
			reports, err := ltm.Copy(ctx, src, dst, ltm.CopyOptions{Batch: batch, Progress: progress.update})
			progress.done()
			if perr := print(cmd.OutOrStdout(), reports, asJSON); perr != nil {
				return perr
			}
			return err
		},
	}
	cmd.Flags().StringVar(&from, "from", "", "the store to copy: sqlite:FILE, postgres://... or postgres:KEY=VALUE ...")
	cmd.Flags().StringVar(&to, "to", "", "the store to copy into (created if it is a new SQLite file or an empty database)")
	cmd.Flags().IntVar(&batch, "batch", 500, "memories per transaction")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the per-namespace reports as JSON")
	cmd.MarkFlagRequired("from")
	cmd.MarkFlagRequired("to")
	return cmd
}

// open opens a store named on the command line.
func open(ctx context.Context, cfg setup.Config, flag, spec string, mustExist bool) (ltm.DB, error) {
	switch {
	case strings.HasPrefix(spec, "sqlite:"):
		path := strings.TrimPrefix(spec, "sqlite:")
		if path == "" {
			return nil, fmt.Errorf("%s sqlite: names no file", flag)
		}
		if mustExist {
			if _, err := os.Stat(path); err != nil {
				return nil, fmt.Errorf("%s: %w", flag, err)
			}
		}
		db, err := ltm.OpenSQLite(path, ltm.SQLiteOptions{SyncFull: cfg.Memory.Sync == "full"})
		if err != nil {
			return nil, fmt.Errorf("%s: %w", flag, err)
		}
		return db, nil
	case strings.HasPrefix(spec, "postgres://"), strings.HasPrefix(spec, "postgresql://"), strings.HasPrefix(spec, "postgres:"):
		dsn := spec
		if !strings.Contains(spec, "://") {
			dsn = strings.TrimPrefix(spec, "postgres:")
		}
		if err := ltm.CheckDSN(dsn); err != nil {
			return nil, fmt.Errorf("%s %w", flag, err)
		}
		db, err := ltm.OpenPostgres(ctx, ltm.PostgresOptions{DSN: dsn, MaxConns: cfg.Memory.MaxConns, HNSW: cfg.Memory.HNSW})
		if err != nil {
			return nil, fmt.Errorf("%s: %w", flag, err)
		}
		return db, nil
	}
	return nil, fmt.Errorf("%s %q: want sqlite:FILE, a postgres:// URL, or postgres: followed by key=value pairs", flag, spec)
}

func print(w io.Writer, rs []ltm.CopyReport, asJSON bool) error {
	if asJSON {
		if rs == nil {
			rs = []ltm.CopyReport{}
		}
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		return enc.Encode(rs)
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "NAMESPACE\tFROM\tTO\tWRITTEN\tCHECKSUM")
	var from, to, written, differ int
	for _, r := range rs {
		state := r.FromSum[:16] + " same"
		if !r.Same() {
			state = r.FromSum[:16] + " != " + r.ToSum[:16]
			differ++
		}
		fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%s\n", r.Namespace, r.FromCount, r.ToCount, r.Written, state)
		from, to, written = from+r.FromCount, to+r.ToCount, written+r.Written
	}
	fmt.Fprintf(tw, "%d namespaces\t%d\t%d\t%d\t%d differ\n", len(rs), from, to, written, differ)
	return tw.Flush()
}

// progress writes a line at most every 2 s: memories written, namespaces
// reached.
type progress struct {
	w       io.Writer
	last    time.Time
	spaces  map[string]bool
	written map[string]int
	total   int
}

func newProgress(w io.Writer) *progress {
	return &progress{w: w, last: time.Now(), spaces: map[string]bool{}, written: map[string]int{}}
}

func (p *progress) update(ns string, written, _ int) {
	p.spaces[ns] = true
	p.total += written - p.written[ns]
	p.written[ns] = written
	if time.Since(p.last) >= 2*time.Second {
		p.last = time.Now()
		fmt.Fprintf(p.w, "migrate: %d memories written, %d namespaces reached\n", p.total, len(p.spaces))
	}
}

func (p *progress) done() {
	if p.total > 0 {
		fmt.Fprintf(p.w, "migrate: %d memories written in %d namespaces\n", p.total, len(p.spaces))
	}
}
