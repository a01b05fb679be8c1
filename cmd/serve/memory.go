package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/agemem/agemem/cmd/internal/memcli"
	"github.com/agemem/agemem/embed"
	"github.com/agemem/agemem/memtools/ltm"
	"github.com/agemem/agemem/setup"
)

// session is an open namespace of the configured store (SQLite or
// PostgreSQL).
type session struct {
	db  ltm.DB
	ns  ltm.Store
	enc embed.Embedder
	cfg setup.Config
}

func open(g *globals) (*session, error) {
	cfg, err := g.load()
	if err != nil {
		return nil, err
	}
	db, err := setup.OpenStore(context.Background(), cfg)
	if err != nil {
		return nil, err
	}
	ns, err := db.Namespace(cfg.Memory.Namespace)
	if err != nil {
		db.Close()
		return nil, err
	}
	enc, err := embedder(context.Background(), cfg)
	if err != nil {
		db.Close()
		return nil, err
	}
	return &session{db: db, ns: ns, enc: enc, cfg: cfg}, nil
}

func (s *session) embed(text string) ([]float32, error) {
	v, err := s.enc.Embed(context.Background(), []string{text})
	if err != nil {
		return nil, err
	}
	return v[0], nil
}

// prepare parses a --metadata flag and embeds text, the two inputs of every
// write and search.
// prepare checks text (a memory's content or a query: the server's API
// refuses blank ones too) and metadata, and embeds text.
func (s *session) prepare(metadata, text string) (map[string]any, []float32, error) {
	if strings.TrimSpace(text) == "" {
		return nil, nil, errors.New("the text is empty: a memory's content and a search's query must say something")
	}
	md, err := parseMetadata(metadata)
	if err != nil {
		return nil, nil, err
	}
	v, err := s.embed(text)
	return md, v, err
}

func parseMetadata(s string) (map[string]any, error) {
	if s == "" {
		return nil, nil
	}
	var m map[string]any
	if err := json.Unmarshal([]byte(s), &m); err != nil {
		return nil, fmt.Errorf("--metadata must be a JSON object: %w", err)
	}
	return m, nil
}

func memoryCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "memory",
		Short: "List, search, add, update, delete, export and import a user's long-term memories",
		Long: `Administers one namespace (one user) of the long-term store: the SQLite file
memory.path, or the PostgreSQL database memory.dsn when memory.store is
postgres. --namespace picks the user (default: memory.namespace).`,
	}
	cmd.PersistentFlags().StringVar(&g.namespace, "namespace", "", "the user's namespace")
	var asJSON bool
	var metadata, memType string
	var topK int
	with := func(f func(cmd *cobra.Command, s *session, args []string) error) func(*cobra.Command, []string) error {
		return func(cmd *cobra.Command, args []string) error {
			s, err := open(g)
			if err != nil {
				return err
			}
			defer s.db.Close()
			return f(cmd, s, args)
		}
	}
	list := &cobra.Command{
		Use: "list", Short: "List every memory, oldest first", Args: cobra.NoArgs,
		Example: "  serve memory list --namespace alice --set memory.path=data/memory.db",
		RunE: with(func(cmd *cobra.Command, s *session, _ []string) error {
			all, err := s.ns.List(context.Background())
			if err != nil {
				return err
			}
			return printEntries(cmd.OutOrStdout(), all, nil, asJSON)
		}),
	}
	search := &cobra.Command{
		Use: "search QUERY", Short: "Retrieve the memories most similar to QUERY", Args: cobra.ExactArgs(1),
		Example: `  serve memory search "where was Marla born" --top-k 3 --metadata '{"type":"bio"}'`,
		RunE: with(func(cmd *cobra.Command, s *session, args []string) error {
			md, v, err := s.prepare(metadata, args[0])
			if err != nil {
				return err
			}
			hits, err := s.ns.Retrieve(context.Background(), v, topK, md)
			if err != nil {
				return err
			}
			entries := make([]ltm.Entry, len(hits))
			scores := make([]float64, len(hits))
			for i, h := range hits {
				entries[i], scores[i] = h.Entry, h.Score
			}
			return printEntries(cmd.OutOrStdout(), entries, scores, asJSON)
		}),
	}
	get := &cobra.Command{
		Use: "get ID", Short: "Print one memory", Args: cobra.ExactArgs(1),
		RunE: with(func(cmd *cobra.Command, s *session, args []string) error {
			e, err := s.ns.Get(context.Background(), args[0])
			if err != nil {
				return err
			}
			return printEntries(cmd.OutOrStdout(), []ltm.Entry{e}, nil, asJSON)
		}),
	}
	add := &cobra.Command{
		Use: "add CONTENT", Short: "Store a memory and print its id", Args: cobra.ExactArgs(1),
		Example: `  serve memory add "Alice's cat is called Tabby" --type fact --metadata '{"topic":"pets"}'`,
		RunE: with(func(cmd *cobra.Command, s *session, args []string) error {
			md, v, err := s.prepare(metadata, args[0])
			if err != nil {
				return err
			}
			e, err := s.ns.Add(context.Background(), ltm.Entry{Content: args[0], Embedding: v, Metadata: md, MemoryType: memType})
			if err != nil {
				return err
			}
			fmt.Fprintln(cmd.OutOrStdout(), e.ID)
			return nil
		}),
	}
	update := &cobra.Command{
		Use: "update ID CONTENT", Short: "Replace a memory's content (and metadata, if given)", Args: cobra.ExactArgs(2),
		RunE: with(func(cmd *cobra.Command, s *session, args []string) error {
			md, v, err := s.prepare(metadata, args[1])
			if err != nil {
				return err
			}
			_, err = s.ns.Update(context.Background(), args[0], args[1], v, md)
			return err
		}),
	}
	del := &cobra.Command{
		Use: "delete ID", Short: "Delete a memory", Args: cobra.ExactArgs(1),
		RunE: with(func(cmd *cobra.Command, s *session, args []string) error {
			return s.ns.Delete(context.Background(), args[0])
		}),
	}
	export := &cobra.Command{
		Use: "export", Short: "Write the namespace as JSONL on stdout", Args: cobra.NoArgs,
		Example: "  serve memory export --namespace alice > alice.jsonl",
		RunE: with(func(cmd *cobra.Command, s *session, _ []string) error {
			all, err := s.ns.List(context.Background())
			if err != nil {
				return err
			}
			return ltm.WriteJSONL(cmd.OutOrStdout(), all)
		}),
	}
	imp := &cobra.Command{
		Use:   "import FILE",
		Short: "Add the memories of a JSONL export (- for stdin) in one transaction",
		Long: `Reads a JSONL file as written by export and writes its memories, embedded
with the configured embedder, in one transaction: every line is checked first
and then all are written or none. A line keeps its memory_id and replaces the
namespace's memory of that id, so importing the same file twice leaves one copy;
lines without an id get new ones.`,
		Args:    cobra.ExactArgs(1),
		Example: "  serve memory import --namespace bob alice.jsonl",
		RunE: with(func(cmd *cobra.Command, s *session, args []string) error {
			var r io.Reader = os.Stdin
			if args[0] != "-" {
				f, err := os.Open(args[0])
				if err != nil {
					return err
				}
				defer f.Close()
				r = f
			}
			lines, err := ltm.ReadJSONL(r, args[0])
			if err != nil {
				return err
			}
			entries := make([]ltm.Entry, len(lines))
			for i, rec := range lines {
				v, err := s.embed(rec.Content)
				if err != nil {
					return err
				}
				entries[i] = rec.Entry()
				entries[i].Embedding = v
			}
			added, replaced, err := s.db.Import(context.Background(), s.cfg.Memory.Namespace, entries)
			if err != nil {
				return err
			}
			fmt.Fprintf(cmd.ErrOrStderr(), "%d added, %d replaced (same memory_id)\n", added, replaced)
			fmt.Fprintf(cmd.ErrOrStderr(), "imported %d memories into namespace %q\n", len(lines), s.cfg.Memory.Namespace)
			return nil
		}),
	}
	for _, c := range []*cobra.Command{list, search, get} {
		c.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	}
	search.Flags().IntVar(&topK, "top-k", 3, "how many memories")
	search.Flags().StringVar(&metadata, "metadata", "", "metadata filter, a JSON object matched key by key")
	add.Flags().StringVar(&metadata, "metadata", "", "metadata, a JSON object")
	add.Flags().StringVar(&memType, "type", "", "memory type")
	update.Flags().StringVar(&metadata, "metadata", "", "new metadata, a JSON object (default: keep)")
	storePath := func() (string, error) {
		cfg, err := g.load()
		if err != nil {
			return "", err
		}
		if cfg.Memory.Store != "sqlite" {
			return "", fmt.Errorf("memory.store is %q: check and repair apply to a sqlite store", cfg.Memory.Store)
		}
		return cfg.Memory.Path, nil
	}
	check := &cobra.Command{
		Use:   "check",
		Short: "Check the store's file (quick_check) and write-ahead log (frame checksums) without changing them",
		Long: `Runs SQLite's quick_check on memory.path and reads its write-ahead log frame
by frame with SQLite's checksums. A log that breaks before its last frames
would lose acknowledged writes in SQLite's recovery: the server refuses to
open such a store, and this command says how many frames are affected. Exits
non-zero when the store is damaged.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			path, err := storePath()
			if err != nil {
				return err
			}
			rep, err := ltm.Check(path)
			if err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "%s: %s (log: %d frames, %d applied, %d after damage)\n", path, rep, rep.WAL.Frames, rep.WAL.Valid, rep.WAL.Lost)
			if !rep.OK() {
				return fmt.Errorf("%s is damaged; `serve memory repair` keeps the damaged files aside and rebuilds the store from what is readable", path)
			}
			return nil
		},
	}
	repair := &cobra.Command{
		Use:   "repair",
		Short: "Move a damaged store aside and rebuild it from every row that can still be read",
		Long: `Renames memory.path (and its -wal, -shm) to memory.path.damaged-TIME, which is
kept, reads every row SQLite can still read from a copy (scanning the table
from both ends and through its index, around the damage), and writes them
into a new store at memory.path. Writes in a log past its damage are not
recoverable; the counts say what was kept. Stop the server first.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			path, err := storePath()
			if err != nil {
				return err
			}
			kept, aside, err := ltm.Repair(path)
			if err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "rebuilt %s with the %d memories that could be read; the damaged files are kept at %s\n", path, kept, aside)
			return nil
		},
	}
	cmd.AddCommand(list, search, get, add, update, del, export, imp, check, repair, memcli.Migrate(g.load))
	return cmd
}

func printEntries(w io.Writer, es []ltm.Entry, scores []float64, asJSON bool) error {
	if asJSON {
		for i := range es {
			es[i].Embedding = nil
		}
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		if scores != nil {
			out := make([]ltm.Scored, len(es))
			for i := range es {
				out[i] = ltm.Scored{Entry: es[i], Score: scores[i]}
			}
			return enc.Encode(out)
		}
		return enc.Encode(es)
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	for i, e := range es {
		md, _ := json.Marshal(e.Metadata)
		if e.Metadata == nil {
			md = []byte("{}")
		}
		if scores != nil {
			fmt.Fprintf(tw, "%s\t%.3f\t%s\t%s\t%s\n", e.ID, scores[i], e.MemoryType, md, e.Content)
		} else {
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", e.ID, e.MemoryType, md, e.Content)
		}
	}
	return tw.Flush()
}
