package memtoolagent

import (
	"context"
	"fmt"
	"io"
	"strconv"
	"strings"

	"github.com/agemem/agemem/agent"
	"github.com/agemem/agemem/bench/nestful"
	"github.com/agemem/agemem/bench/workbench"
	"github.com/agemem/agemem/embed"
	"github.com/agemem/agemem/internal/valid"
	"github.com/agemem/agemem/llm"
	"github.com/agemem/agemem/memtools/ltm"
)

// Config is the "memtoolagent" section: MemToolAgent's memory as a run on
// WorkBench or NESTFUL plays it (agemem-train tools run).
type Config struct {
	// Memory plays the test queries with the memory (on), without it
	// (off), or both, without first.
	Memory string `yaml:"memory"`
	// Recall is how many entries a query recalls: dynamic (the paper's
	// adaptive count of the similarity curve, the adaptive keys), top-K
	// (a fixed K) or gap (Adaptive-k: the entries above the largest drop
	// of similarity), the last two the paper's baselines (Figure 5).
	Recall   string   `yaml:"recall"`
	Adaptive Adaptive `yaml:"adaptive"`
	// ExtractorModel is the memory extractor's model on openai.base_url
	// ("": the agent's own).
	ExtractorModel string `yaml:"extractor_model"`
	// MemoryDB keeps the memory in this SQLite file, in the namespace
	// memory.namespace, which must be empty ("": in memory).
	MemoryDB string `yaml:"memory_db"`
	// MaxSteps bounds the model's turns on a WorkBench query.
	MaxSteps int `yaml:"max_steps"`
	// Online also stores each WorkBench test query's entry as it is
	// scored (the test queries then go one at a time).
	Online bool `yaml:"online"`
	// HardPreference is Hard Preference Guiding on WorkBench: the tools
	// only the recalled failures used are taken out of the agent's.
	HardPreference bool `yaml:"hard_preference"`
	// MemorySize is how many NESTFUL samples after the test set populate
	// the memory (the paper's 500).
	MemorySize int `yaml:"memory_size"`
}

// DefaultConfig is the paper's WorkBench setting, played with and
// without the memory.
func DefaultConfig() Config {
	return Config{Memory: "both", Recall: "dynamic", Adaptive: DefaultAdaptive(), MaxSteps: 10, MemorySize: 500}
}

// Validate checks every key.
func (c Config) Validate() error {
	var e valid.Errors
	e.OneOf("memory", c.Memory, "on", "off", "both")
	if _, err := c.counter(); err != nil {
		e.Add("recall", "%v", err)
	}
	e.Section("adaptive", c.Adaptive.Check())
	if c.MaxSteps < 1 {
		e.Add("max_steps", "%d: the model needs at least one turn", c.MaxSteps)
	}
	if c.MemorySize < 0 {
		e.Add("memory_size", "%d: want 0 or more", c.MemorySize)
	}
	return e.Err()
}

func (c Config) counter() (Counter, error) {
	k, isTop := strings.CutPrefix(c.Recall, "top-")
	switch {
	case c.Recall == "dynamic":
		return c.Adaptive, nil
	case c.Recall == "gap":
		return Gap{}, nil
	case isTop:
		n, err := strconv.Atoi(k)
		if err != nil || n < 1 {
			return nil, fmt.Errorf("%q: top-K needs a count K of 1 or more", c.Recall)
		}
		return TopK(n), nil
	}
	return nil, fmt.Errorf("%q: want dynamic (the paper's), top-K or gap", c.Recall)
}

// Counter is the count Recall names (the adaptive one for a Recall that
// does not validate).
func (c Config) Counter() Counter {
	if n, err := c.counter(); err == nil {
		return n
	}
	return c.Adaptive
}

// Modes are the runs Memory asks for, in order: false plays without the
// memory, true with it.
func (c Config) Modes() []bool {
	return map[string][]bool{"on": {true}, "off": {false}, "both": {false, true}}[c.Memory]
}

// Cast is what a run plays with: the agent's model, the memory
// extractor's (nil: the agent's), the embedder of the memory's queries,
// and the store each run's memory starts from (empty), with what closes
// it.
type Cast struct {
	Model     llm.Model
	Extractor llm.Model
	Embedder  embed.Embedder
	NewStore  func() (ltm.Store, func(), error)
}

// memory opens a fresh memory for one run.
func (cast Cast) memory(c Config) (*Memory, func(), error) {
	st, done, err := cast.NewStore()
	if err != nil {
		return nil, nil, err
	}
	return &Memory{Store: st, Embedder: cast.Embedder, Count: c.Counter()}, done, nil
}

// WorkBenchRuns plays tasks (after workbench.Split) once for each of the
// memory modes c asks for, parallel test queries at once.
func WorkBenchRuns(ctx context.Context, c Config, cast Cast, d *workbench.Data, tasks []workbench.Task, parallel int, log io.Writer) ([]workbench.Result, error) {
	var results []workbench.Result
	for _, on := range c.Modes() {
		o := WorkBenchOptions{Model: cast.Model, Extractor: cast.Extractor, Online: c.Online, HardPreference: c.HardPreference,
			Limits: agent.Limits{MaxSteps: c.MaxSteps}, Log: log, Parallel: parallel}
		done := func() {}
		if on {
			var err error
			if o.Memory, done, err = cast.memory(c); err != nil {
				return nil, err
			}
		}
		r, err := WorkBench(ctx, d, tasks, o)
		done()
		if err != nil {
			return nil, err
		}
		results = append(results, r)
	}
	return results, nil
}

// NestfulMemory are the samples that populate the memory, the first
// c.MemorySize of those after the test set (MemToolAgent's protocol: 500
// tested, the next 500 remembered); an error when a run with the memory
// would have none.
func (c Config) NestfulMemory(test, rest []nestful.Sample) ([]nestful.Sample, error) {
	memory := rest[:min(c.MemorySize, len(rest))]
	for _, on := range c.Modes() {
		if on && len(memory) == 0 {
			return nil, fmt.Errorf("none left to populate the memory: %d samples, the first %d the test set (nestful.test_size), memtoolagent.memory_size %d (memtoolagent.memory %s)",
				len(test)+len(rest), len(test), c.MemorySize, c.Memory)
		}
	}
	return memory, nil
}

// NestfulRuns plays test once for each of the memory modes c asks for,
// the memory populated by memory (NestfulMemory).
func NestfulRuns(ctx context.Context, c Config, cast Cast, test, memory []nestful.Sample, ex *nestful.Executor, parallel int, log io.Writer) ([]nestful.Result, error) {
	var results []nestful.Result
	for _, on := range c.Modes() {
		o := NestfulOptions{Model: cast.Model, Extractor: cast.Extractor, Exec: ex, Log: log, Parallel: parallel}
		done := func() {}
		if on {
			var err error
			if o.Memory, done, err = cast.memory(c); err != nil {
				return nil, err
			}
		}
		r, err := Nestful(ctx, test, memory, o)
		done()
		if err != nil {
			return nil, err
		}
		results = append(results, r)
	}
	return results, nil
}
