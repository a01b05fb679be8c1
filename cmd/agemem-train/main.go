// Command agemem-train generates data, runs AgeMem episodes and (as the
// toolkit grows) trains and evaluates memory-managing policies.
package main

import (
	"fmt"
	"os"
	"runtime/pprof"

	"github.com/spf13/cobra"

	"github.com/agemem/agemem/setup"
)

// globals are the flags every subcommand shares.
type globals struct{ setup.Flags }

func (g *globals) load() (setup.Config, error) { return g.Load() }

// loadData loads the config and defaults *data to data.train.
func (g *globals) loadData(data *string) (setup.Config, error) {
	cfg, err := g.Load()
	if err == nil && *data == "" {
		*data = cfg.Data.Train
	}
	return cfg, err
}

func main() {
	if err := newRoot().Execute(); err != nil {
		fmt.Fprintln(os.Stderr, "agemem-train:", err)
		os.Exit(1)
	}
}

func newRoot() *cobra.Command {
	g := &globals{}
	root := &cobra.Command{
		Use:   "agemem-train",
		Short: "Train and evaluate LLM agents that manage their own memory (AgeMem)",
		Long: `agemem-train generates HotpotQA-format task data, plays AgeMem's three-stage
episodes (LTM construction, STM control under distractors, integrated
reasoning) with a policy, and reports how well the policy used its memory.`,
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	g.Register(root.PersistentFlags())
	// A CPU profile of any subcommand (go tool pprof FILE), for finding where
	// a training or evaluation run spends its time.
	var profile string
	var profFile *os.File
	root.PersistentFlags().StringVar(&profile, "cpuprofile", "", "write a CPU profile of the run to this file (go tool pprof)")
	root.PersistentPreRunE = func(*cobra.Command, []string) error {
		if profile == "" {
			return nil
		}
		f, err := create(profile)
		if err != nil {
			return fmt.Errorf("--cpuprofile: %w", err)
		}
		profFile = f
		return pprof.StartCPUProfile(f)
	}
	root.PersistentPostRunE = func(*cobra.Command, []string) error {
		if profFile == nil {
			return nil
		}
		pprof.StopCPUProfile()
		return profFile.Close()
	}
	root.AddCommand(dataCmd(g), episodeCmd(g), configCmd(g), initModelCmd(g), pretrainCmd(g), probeCmd(), sftCmd(g), trainCmd(g), evalCmd(g), tokenizeCmd(), generateCmd(), tokenizerCmd(g), mergeCmd(), exportCmd(g), embedCmd(g), agentCmd(g), locomoCmd(g), toolsCmd(g), memtoolCmd(g), consoleCmd())
	return root
}

func configCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:     "config",
		Short:   "Print the effective config after the file and --set overrides",
		Example: "  agemem-train config --config configs/tiny.yaml --set agent.max_steps=6",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg, err := g.load()
			if err != nil {
				return err
			}
			fmt.Fprint(cmd.OutOrStdout(), cfg.YAML())
			return nil
		},
	}
}
