package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"slices"
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
	cmd.AddCommand(memoryListCmd(g), memorySearchCmd(g), memoryGetCmd(g), memoryAddCmd(g), memoryUpdateCmd(g), memoryDeleteCmd(g),
		memoryExportCmd(g), memoryImportCmd(g), memoryCheckCmd(g), memoryRepairCmd(g), memcli.Migrate(g.load))
	return cmd
}

// withSession runs a subcommand's body on the configured namespace, open
// for its length.
func withSession(g *globals, f func(cmd *cobra.Command, s *session, args []string) error) func(*cobra.Command, []string) error {
	return func(cmd *cobra.Command, args []string) error {
		s, err := open(g)
		if err != nil {
			return err
		}
		defer s.db.Close()
		return f(cmd, s, args)
	}
}

func memoryListCmd(g *globals) *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use: "list", Short: "List every memory, oldest first", Args: cobra.NoArgs,
		Example: "  serve memory list --namespace alice --set memory.path=data/memory.db",
		RunE: withSession(g, func(cmd *cobra.Command, s *session, _ []string) error {
			all, err := s.ns.List(context.Background())
			if err != nil {
				return err
			}
			return printEntries(cmd.OutOrStdout(), all, nil, asJSON)
		}),
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return cmd
}

func memorySearchCmd(g *globals) *cobra.Command {
	var asJSON bool
	var metadata string
	var topK int
	cmd := &cobra.Command{
		Use: "search QUERY", Short: "Retrieve the memories most similar to QUERY", Args: cobra.ExactArgs(1),
		Example: `  serve memory search "where was Marla born" --top-k 3 --metadata '{"type":"bio"}'`,
		RunE: withSession(g, func(cmd *cobra.Command, s *session, args []string) error {
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
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	cmd.Flags().IntVar(&topK, "top-k", 3, "how many memories")
	cmd.Flags().StringVar(&metadata, "metadata", "", "metadata filter, a JSON object matched key by key")
	return cmd
}

func memoryGetCmd(g *globals) *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use: "get ID", Short: "Print one memory", Args: cobra.ExactArgs(1),
		RunE: withSession(g, func(cmd *cobra.Command, s *session, args []string) error {
			e, err := s.ns.Get(context.Background(), args[0])
			if err != nil {
				return err
			}
			return printEntries(cmd.OutOrStdout(), []ltm.Entry{e}, nil, asJSON)
		}),
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return cmd
}

func memoryAddCmd(g *globals) *cobra.Command {
	var metadata, memType string
	cmd := &cobra.Command{
		Use: "add CONTENT", Short: "Store a memory and print its id", Args: cobra.ExactArgs(1),
		Example: `  serve memory add "Alice's cat is called Tabby" --type fact --metadata '{"topic":"pets"}'`,
		RunE: withSession(g, func(cmd *cobra.Command, s *session, args []string) error {
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
	cmd.Flags().StringVar(&metadata, "metadata", "", "metadata, a JSON object")
	cmd.Flags().StringVar(&memType, "type", "", "memory type")
	return cmd
}

func memoryUpdateCmd(g *globals) *cobra.Command {
	var metadata string
	cmd := &cobra.Command{
		Use: "update ID CONTENT", Short: "Replace a memory's content (and metadata, if given)", Args: cobra.ExactArgs(2),
		RunE: withSession(g, func(cmd *cobra.Command, s *session, args []string) error {
			md, v, err := s.prepare(metadata, args[1])
			if err != nil {
				return err
			}
			_, err = s.ns.Update(context.Background(), args[0], args[1], v, md)
			return err
		}),
	}
	cmd.Flags().StringVar(&metadata, "metadata", "", "new metadata, a JSON object (default: keep)")
	return cmd
}

func memoryDeleteCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use: "delete ID", Short: "Delete a memory", Args: cobra.ExactArgs(1),
		RunE: withSession(g, func(cmd *cobra.Command, s *session, args []string) error {
			return s.ns.Delete(context.Background(), args[0])
		}),
	}
}

func memoryExportCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use: "export", Short: "Write the namespace as JSONL on stdout", Args: cobra.NoArgs,
		Example: "  serve memory export --namespace alice > alice.jsonl",
		RunE: withSession(g, func(cmd *cobra.Command, s *session, _ []string) error {
			all, err := s.ns.List(context.Background())
			if err != nil {
				return err
			}
			return ltm.WriteJSONL(cmd.OutOrStdout(), all)
		}),
	}
}

func memoryImportCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "import FILE",
		Short: "Add the memories of a JSONL export (- for stdin) in one transaction",
		Long: `Reads a JSONL file as written by export and writes its memories, embedded
with the configured embedder, in one transaction: every line is checked first
and then all are written or none. A line keeps its memory_id and replaces the
namespace's memory of that id, so importing the same file twice leaves one copy;
lines without an id get new ones.`,
		Args:    cobra.ExactArgs(1),
		Example: "  serve memory import --namespace bob alice.jsonl",
		RunE: withSession(g, func(cmd *cobra.Command, s *session, args []string) error {
			var r io.Reader = os.Stdin
			if args[0] != "-" {
				f, err := os.Open(args[0])
				if err != nil {
					return err
				}
				defer f.Close()
				r = f
			}
			n, added, replaced, err := s.importJSONL(r, args[0])
			if err != nil {
				return err
			}
			fmt.Fprintf(cmd.ErrOrStderr(), "%d added, %d replaced (same memory_id)\n", added, replaced)
			fmt.Fprintf(cmd.ErrOrStderr(), "imported %d memories into namespace %q\n", n, s.cfg.Memory.Namespace)
			return nil
		}),
	}
}

// importJSONL reads an export (name says where it came from in errors),
// embeds each memory's content and writes them all in one transaction.
func (s *session) importJSONL(r io.Reader, name string) (n, added, replaced int, err error) {
	lines, err := ltm.ReadJSONL(r, name)
	if err != nil {
		return 0, 0, 0, err
	}
	entries := make([]ltm.Entry, len(lines))
	for i, rec := range lines {
		v, err := s.embed(rec.Content)
		if err != nil {
			return 0, 0, 0, err
		}
		entries[i] = rec.Entry()
		entries[i].Embedding = v
	}
	added, replaced, err = s.db.Import(context.Background(), s.cfg.Memory.Namespace, entries)
	return len(lines), added, replaced, err
}

// storePath is memory.path, which check and repair read as files.
func storePath(g *globals) (setup.Config, string, error) {
	cfg, err := g.load()
	if err != nil {
		return cfg, "", err
	}
	if cfg.Memory.Store != "sqlite" {
		return cfg, "", fmt.Errorf("memory.store is %q: check and repair apply to a sqlite store", cfg.Memory.Store)
	}
	return cfg, cfg.Memory.Path, nil
}

func memoryCheckCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "check",
		Short: "Check the store's file (quick_check) and write-ahead log (frame checksums, its index) without changing them",
		Long: `Runs SQLite's quick_check on memory.path and reads its write-ahead log frame
by frame with SQLite's checksums, beside the log's index (the -shm file), which
records how many frames were committed. A crash leaves at most an unfinished
transaction's frames at the log's end (a torn tail: never acknowledged, and
dropped as SQLite does). A log that breaks with committed frames after the
break was damaged; a log shorter than its index records was cut: in both,
SQLite's recovery would drop acknowledged writes without a word, so the server
refuses to open the store and this command says how many frames (and
transactions) are lost. Exits non-zero when the store is damaged.`,
		Example: "  serve memory check --set memory.path=data/memory.db",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			_, path, err := storePath(g)
			if err != nil {
				return err
			}
			rep, err := ltm.Check(path)
			if err != nil {
				return err
			}
			w := rep.WAL
			index := "no usable index"
			if w.IndexFrames >= 0 {
				index = fmt.Sprintf("index records %d committed", w.IndexFrames)
			}
			fmt.Fprintf(cmd.OutOrStdout(), "%s: %s (log: %d frames, %d applied, %d torn by a crash, %d lost; %s)\n",
				path, rep, w.Frames, w.Valid, w.Torn, w.Lost, index)
			if !rep.OK() {
				return fmt.Errorf("%s is damaged; `serve memory repair` keeps the damaged files aside and rebuilds the store from what is readable", path)
			}
			return nil
		},
	}
}

func memoryRepairCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "repair",
		Short: "Move a damaged store aside and rebuild it from every memory that can still be read",
		Long: `Renames memory.path (and its -wal, -shm) to memory.path.damaged-TIME, which is
kept, and reads every page of the old database (with the log's committed
frames over it) on its own, so that damage costs only the memories on the
damaged pages: a memory whose content is intact is kept, its embedding
recomputed with the configured embedder when the stored one is unreadable and
other unreadable fields rebuilt (metadata {}, timestamps). The new store at
memory.path is written in the current layout. Memories known to have existed
(by their record or an index entry) that could not be read are counted and
listed in memory.path.damaged-TIME.lost. Stop the server first.`,
		Example: "  serve memory repair --set memory.path=data/memory.db",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg, path, err := storePath(g)
			if err != nil {
				return err
			}
			enc, err := embedder(context.Background(), cfg)
			if err != nil {
				return err
			}
			rep, err := ltm.Repair(context.Background(), path, ltm.RepairOptions{Embed: enc.Embed})
			if err != nil {
				return err
			}
			printRepair(cmd.OutOrStdout(), path, rep)
			return nil
		},
	}
}

// printRepair says what a repair kept, rebuilt and lost, and where the
// damaged files and the list of lost memories are.
func printRepair(out io.Writer, path string, rep ltm.RepairReport) {
	fmt.Fprintf(out, "rebuilt %s: kept %d of %d memories, lost %d\n", path, rep.Kept, rep.Kept+len(rep.Lost), len(rep.Lost))
	if len(rep.Rebuilt) > 0 {
		var fields []string
		for _, f := range slices.Sorted(maps.Keys(rep.Rebuilt)) {
			fields = append(fields, fmt.Sprintf("%s %d", f, rep.Rebuilt[f]))
		}
		fmt.Fprintf(out, "kept with unreadable fields rebuilt: %s\n", strings.Join(fields, ", "))
	}
	if rep.LostFile != "" {
		fmt.Fprintf(out, "the lost memories are listed in %s\n", rep.LostFile)
	}
	if rep.LogMissing > 0 {
		fmt.Fprintf(out, "the log had been cut: %d committed frames were gone before the repair, and the memories they wrote are not counted above\n", rep.LogMissing)
	}
	if rep.FreeListDamaged {
		fmt.Fprintln(out, "the free-page list was damaged: only memories an index lists were taken from pages outside the b-trees")
	}
	fmt.Fprintf(out, "the damaged files are kept at %s\n", rep.Aside)
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
