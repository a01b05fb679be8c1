package main

import (
	"path/filepath"

	"github.com/spf13/cobra"

	"github.com/agemem/agemem/internal/clidoc"
)

// docsCmd writes serve's CLI reference (make docs).
func docsCmd() *cobra.Command {
	var out string
	cmd := &cobra.Command{
		Use:    "docs",
		Short:  "Write serve's CLI reference (make docs)",
		Hidden: true,
		Args:   cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return clidoc.Write(cmd.Root(), filepath.Join(out, "cli"))
		},
	}
	cmd.Flags().StringVar(&out, "out", "docs/reference", "the references' directory")
	return cmd
}
