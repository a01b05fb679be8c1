package main

import (
	"github.com/spf13/cobra"

	"github.com/agemem/agemem/cmd/internal/memcli"
)

func memoryCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "memory",
		Short: "Move long-term memory between stores (SQLite, PostgreSQL)",
		Long: `Commands on whole memory stores. The per-user commands (list, search, add,
export, import, check, repair) are serve's: serve memory --help.`,
	}
	cmd.AddCommand(memcli.Migrate(g.load))
	return cmd
}
