package nestful

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"

	"github.com/agemem/agemem/internal/valid"
)

// Config is the "nestful" section: the data a run plays (agemem-train
// tools run --env nestful), how its win rate is computed and where its
// report goes.
type Config struct {
	// Data is NESTFUL's nestful_data.jsonl (its GitHub release's data_v2,
	// or the Hugging Face export); a run needs it.
	Data string `yaml:"data"`
	// Functions is NESTFUL's executable_functions folder: with it, every
	// prediction is executed for the win rate ("": no win rate).
	Functions string `yaml:"functions"`
	// Python runs Functions.
	Python string `yaml:"python"`
	// TestSize is how many samples, from the first, are the test set (the
	// paper's 500; 0: all).
	TestSize int `yaml:"test_size"`
	// Parallel test samples are played at once.
	Parallel int `yaml:"parallel"`
	// Out receives report.json.
	Out string `yaml:"out"`
}

// DefaultConfig is MemToolAgent's protocol: the first 500 samples tested.
func DefaultConfig() Config {
	return Config{Python: "python3", TestSize: 500, Parallel: 4, Out: "runs/nestful"}
}

// Validate checks every key.
func (c Config) Validate() error {
	var e valid.Errors
	if c.Python == "" {
		e.Add("python", `"": want the Python interpreter that runs functions (python3)`)
	}
	if c.TestSize < 0 {
		e.Add("test_size", "%d: want 0 (every sample) or more", c.TestSize)
	}
	e.AtLeast("parallel", c.Parallel, 1)
	if c.Out == "" {
		e.Add("out", `"": want the folder for report.json`)
	}
	return e.Err()
}

// Load reads the samples of Data and, with Functions, opens the executor
// of the win rate (nil without).
func (c Config) Load() ([]Sample, *Executor, error) {
	if c.Data == "" {
		return nil, nil, fmt.Errorf("nestful.data is empty: name NESTFUL's nestful_data.jsonl")
	}
	samples, err := Load(c.Data)
	if err != nil {
		return nil, nil, err
	}
	var ex *Executor
	if c.Functions != "" {
		if ex, err = NewExecutor(c.Functions, c.Python); err != nil {
			return nil, nil, err
		}
	}
	return samples, ex, nil
}

// Split is the test set (the first TestSize samples, all when 0) and the
// samples after it.
func (c Config) Split(samples []Sample) (test, rest []Sample) {
	n := len(samples)
	if c.TestSize > 0 {
		n = min(c.TestSize, n)
	}
	return samples[:n], samples[n:]
}

// WriteReport writes dir/report.json (every run's predictions and scores)
// and returns its path.
func WriteReport(dir string, rs []Result) (string, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	path := filepath.Join(dir, "report.json")
	raw, err := json.MarshalIndent(rs, "", "  ")
	if err != nil {
		return "", err
	}
	return path, os.WriteFile(path, append(raw, '\n'), 0o644)
}
