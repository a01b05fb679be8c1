// Command serve puts a trained AgeMem policy in front of users. Today it
// administers the persistent per-user long-term memory that the server will
// use; the HTTP API and the MCP endpoint arrive with the serve issue.
package main

import (
	"fmt"
	"os"

	"github.com/spf13/cobra"

	"github.com/agemem/agemem/config"
)

type globals struct {
	config.Flags
	namespace string
}

func (g *globals) load() (config.Config, error) {
	cfg, err := g.Load()
	if err != nil {
		return cfg, err
	}
	if g.namespace != "" {
		cfg.Memory.Namespace = g.namespace
	}
	return cfg, nil
}

func main() {
	if err := newRoot().Execute(); err != nil {
		fmt.Fprintln(os.Stderr, "serve:", err)
		os.Exit(1)
	}
}

func newRoot() *cobra.Command {
	g := &globals{}
	root := &cobra.Command{
		Use:           "serve",
		Short:         "Serve AgeMem policies with persistent per-user memory",
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	g.Register(root.PersistentFlags())
	root.AddCommand(memoryCmd(g))
	return root
}
