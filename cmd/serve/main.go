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
	configPath string
	sets       []string
	namespace  string
}

func (g *globals) load() (config.Config, error) {
	cfg, err := config.Load(g.configPath, g.sets)
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
	root.PersistentFlags().StringVar(&g.configPath, "config", "", "YAML config file (memory.path names the SQLite store)")
	root.PersistentFlags().StringArrayVar(&g.sets, "set", nil, "override a config key, e.g. --set memory.path=users.db (repeatable)")
	root.AddCommand(memoryCmd(g))
	return root
}
