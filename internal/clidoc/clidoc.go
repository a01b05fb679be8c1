// Package clidoc writes a binary's CLI reference from its cobra command
// tree, and checks command lines written in the docs against that tree, so
// that neither the reference nor the examples drift from the code.
package clidoc

import (
	"fmt"
	"os"

	"github.com/spf13/cobra"
	"github.com/spf13/cobra/doc"
)

// Write writes a Markdown page per command of root into dir, without
// cobra's date line (a regenerated page changes only when the CLI does).
func Write(root *cobra.Command, dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	root.InitDefaultCompletionCmd() // as Execute adds it, so the pages are the same run or not
	var off func(*cobra.Command)
	off = func(c *cobra.Command) {
		c.DisableAutoGenTag = true
		for _, s := range c.Commands() {
			off(s)
		}
	}
	off(root)
	if err := doc.GenMarkdownTree(root, dir); err != nil {
		return fmt.Errorf("CLI reference: %w", err)
	}
	return nil
}
