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
		Short: "Train, evaluate and run LLM agents that manage their own memory",
		Long: `agemem-train is the toolkit's workbench for five memory systems on one runtime:
AgeMem (an agent that adds, updates, deletes and retrieves long-term memories and
summarises and filters its context), MemTool (an agent's working set of tools),
FitText (tool retrieval with pseudo-tools), MemToolAgent (a memory of past tool
use) and TA-Mem (notes in a multi-index database).

It makes data (data, tokenizer, init-model), trains Qwen-architecture policies
(pretrain, sft, train: step-wise GRPO, on CPUs or NVIDIA GPUs), evaluates them
(eval, episode, locomo, tools, memtool, retrieve), runs agents (agent, generate),
and exports them (merge, export: Hugging Face, PEFT, GGUF and Ollama). The
trained policy is served by the serve binary. Every command reads the same YAML
config (--config, --set key=value).`,
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
	root.AddCommand(docsCmd(), dataCmd(g), episodeCmd(g), configCmd(g), initModelCmd(g), pretrainCmd(g), probeCmd(), sftCmd(g), trainCmd(g), evalCmd(g), tokenizeCmd(), generateCmd(), tokenizerCmd(g), mergeCmd(), exportCmd(g), embedCmd(g), agentCmd(g), locomoCmd(g), toolsCmd(g), memtoolCmd(g), memoryCmd(g), consoleCmd())
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
