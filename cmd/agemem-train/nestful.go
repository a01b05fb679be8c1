package main

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"

	"github.com/spf13/cobra"

	"github.com/agemem/agemem/bench/nestful"
	"github.com/agemem/agemem/embed"
	"github.com/agemem/agemem/papers/memtoolagent"
	"github.com/agemem/agemem/setup"
)

type nestfulOptions struct {
	data, functions, python, model, native, dev, extractor, out string
	limit, memorySize, parallel                                 int
	modes                                                       []bool
}

// nestfulRun is `tools run --env nestful`: MemToolAgent's NESTFUL
// protocol, the first --limit samples (500) the test set and the next
// --memory-size (500) the memory's, played with and without the memory.
func nestfulRun(cmd *cobra.Command, cfg setup.Config, o nestfulOptions, newMemory func(embed.Embedder) (*memtoolagent.Memory, func(), error)) error {
	ctx := cmd.Context()
	samples, err := nestful.Load(o.data)
	if err != nil {
		return err
	}
	var ex *nestful.Executor
	if o.functions != "" {
		if ex, err = nestful.NewExecutor(o.functions, o.python); err != nil {
			return err
		}
	}
	nTest := o.limit
	if nTest == 0 {
		nTest = 500
	}
	if o.memorySize < 0 {
		return fmt.Errorf("--memory-size %d: want 0 or more", o.memorySize)
	}
	nTest = min(nTest, len(samples))
	test, rest := samples[:nTest], samples[nTest:]
	memory := rest[:min(o.memorySize, len(rest))]
	for _, on := range o.modes {
		if on && len(memory) == 0 {
			return fmt.Errorf("--data %s: %d samples, all in the test set (--limit %d): none left to populate the memory (--memory on or both)", o.data, len(samples), nTest)
		}
	}
	m, ext, emb, err := memoryAgent(cmd, cfg, o.model, o.native, o.dev, o.extractor, o.parallel)
	if err != nil {
		return err
	}
	var results []nestful.Result
	for _, on := range o.modes {
		bo := memtoolagent.NestfulOptions{Model: m, Extractor: ext, Exec: ex, Log: cmd.ErrOrStderr(), Parallel: o.parallel}
		if on {
			mem, done, err := newMemory(emb)
			if err != nil {
				return err
			}
			defer done()
			bo.Memory = mem
		}
		r, err := memtoolagent.Nestful(ctx, test, memory, bo)
		if err != nil {
			return err
		}
		results = append(results, r)
	}
	nestful.Print(cmd.OutOrStdout(), results)
	if err := os.MkdirAll(o.out, 0o755); err != nil {
		return err
	}
	raw, _ := json.MarshalIndent(results, "", "  ")
	path := filepath.Join(o.out, "report.json")
	if err := os.WriteFile(path, append(raw, '\n'), 0o644); err != nil {
		return err
	}
	fmt.Fprintf(cmd.OutOrStdout(), "wrote %s\n", path)
	return nil
}
