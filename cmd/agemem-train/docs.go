package main

import (
	"bytes"
	"os"
	"path/filepath"

	"github.com/spf13/cobra"

	"github.com/agemem/agemem/internal/clidoc"
	"github.com/agemem/agemem/setup"
)

// docsCmd writes the references generated from the code (make docs): the
// CLI reference from the command tree and the configuration reference
// from the config structs and their comments.
func docsCmd() *cobra.Command {
	var out, root string
	cmd := &cobra.Command{
		Use:    "docs",
		Short:  "Write the CLI and configuration references (make docs)",
		Hidden: true,
		Args:   cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return writeReferences(cmd.Root(), out, root)
		},
	}
	cmd.Flags().StringVar(&out, "out", "docs/reference", "the references' directory")
	cmd.Flags().StringVar(&root, "source", ".", "the module's directory (the config structs' comments are read there)")
	return cmd
}

// writeReferences writes cli/agemem-train*.md and config.md under out.
func writeReferences(root *cobra.Command, out, source string) error {
	if err := clidoc.Write(root, filepath.Join(out, "cli")); err != nil {
		return err
	}
	var b bytes.Buffer
	if err := setup.Reference(&b, source); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(out, "config.md"), b.Bytes(), 0o644)
}
