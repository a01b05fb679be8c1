package main

import (
	"os"
	"path/filepath"

	"github.com/spf13/cobra"

	"github.com/agemem/agemem/internal/clidoc"
	"github.com/agemem/agemem/serve"
)

// docsCmd writes serve's CLI reference and its HTTP API's OpenAPI
// document (make docs).
func docsCmd() *cobra.Command {
	var out string
	cmd := &cobra.Command{
		Use:    "docs",
		Short:  "Write serve's CLI reference and OpenAPI document (make docs)",
		Hidden: true,
		Args:   cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := clidoc.Write(cmd.Root(), filepath.Join(out, "cli")); err != nil {
				return err
			}
			doc, err := serve.OpenAPI()
			if err != nil {
				return err
			}
			return os.WriteFile(filepath.Join(out, "openapi.json"), doc, 0o644)
		},
	}
	cmd.Flags().StringVar(&out, "out", "docs/reference", "the references' directory")
	return cmd
}
