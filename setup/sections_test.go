package setup

import (
	"reflect"
	"strings"
	"testing"

	"github.com/spf13/pflag"

	"github.com/agemem/agemem/bench/nestful"
	"github.com/agemem/agemem/bench/workbench"
	"github.com/agemem/agemem/papers/memtoolagent"
	"github.com/agemem/agemem/papers/tamem"
)

// TestRunSectionsLoad: the sections of the tool-use and LoCoMo runs
// (memtoolagent, workbench, nestful, tamem) hold their packages' defaults
// when a file leaves them out, take every key a file sets, and name a bad
// value by its full key.
func TestRunSectionsLoad(t *testing.T) {
	cfg, err := Load("", nil)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(cfg.MemToolAgent, memtoolagent.DefaultConfig()) || !reflect.DeepEqual(cfg.WorkBench, workbench.DefaultConfig()) ||
		!reflect.DeepEqual(cfg.Nestful, nestful.DefaultConfig()) || !reflect.DeepEqual(cfg.TAMem, tamem.DefaultConfig()) {
		t.Fatalf("defaults: %+v %+v %+v %+v", cfg.MemToolAgent, cfg.WorkBench, cfg.Nestful, cfg.TAMem)
	}
	if cfg.MemToolAgent.Adaptive != (memtoolagent.Adaptive{R: 10, PeakNumber: 1, Fallback: 10}) || cfg.Nestful.TestSize != 500 || cfg.TAMem.MaxTurns != 7 {
		t.Fatalf("the papers' settings: %+v", cfg)
	}
	cfg, err = Load(write(t, `
memtoolagent:
  memory: "on"
  recall: top-3
  adaptive: {radius: 4, peak: 2, fallback: 0}
  extractor_model: qwen3:8b
  memory_db: runs/mem.db
  max_steps: 6
  online: true
  hard_preference: true
  memory_size: 20
workbench:
  data: wb
  tasks: [a.csv, b.csv]
  limit: 30
  parallel: 2
  out: runs/wb
nestful:
  data: n.jsonl
  functions: fns
  python: python3.12
  test_size: 10
  parallel: 8
  out: runs/n
tamem:
  db: t.db
  max_turns: 3
  parallel: 1
  window: 2
  chunking: {kind: semantic, tokens: 128, overlap: 0.5, percentile: 20}
fittext:
  dfsdt:
    retrieval: [none, single]
`), nil)
	if err != nil {
		t.Fatal(err)
	}
	wantM := memtoolagent.Config{Memory: "on", Recall: "top-3", Adaptive: memtoolagent.Adaptive{R: 4, PeakNumber: 2}, ExtractorModel: "qwen3:8b",
		MemoryDB: "runs/mem.db", MaxSteps: 6, Online: true, HardPreference: true, MemorySize: 20}
	wantW := workbench.Config{Data: "wb", Tasks: []string{"a.csv", "b.csv"}, Limit: 30, Parallel: 2, Out: "runs/wb"}
	wantN := nestful.Config{Data: "n.jsonl", Functions: "fns", Python: "python3.12", TestSize: 10, Parallel: 8, Out: "runs/n"}
	wantT := tamem.Config{DB: "t.db", MaxTurns: 3, Parallel: 1, Window: 2, Chunking: tamem.Chunking{Kind: "semantic", Tokens: 128, Overlap: 0.5, Percentile: 20}}
	if !reflect.DeepEqual(cfg.MemToolAgent, wantM) || !reflect.DeepEqual(cfg.WorkBench, wantW) || !reflect.DeepEqual(cfg.Nestful, wantN) ||
		!reflect.DeepEqual(cfg.TAMem, wantT) || !reflect.DeepEqual(cfg.FitText.DFSDT.Retrieval, []string{"none", "single"}) {
		t.Fatalf("loaded:\n%+v\n%+v\n%+v\n%+v\n%v", cfg.MemToolAgent, cfg.WorkBench, cfg.Nestful, cfg.TAMem, cfg.FitText.DFSDT.Retrieval)
	}
	if n := cfg.MemToolAgent.Counter().Count([]float64{0.9, 0.8, 0.7, 0.6, 0.5}); n != 3 {
		t.Fatalf("recall top-3 recalls %d", n)
	}
	for _, tc := range []struct{ name, body, want string }{
		{"memory mode", "memtoolagent:\n  memory: maybe\n", `memtoolagent.memory: "maybe" is not one of on, off, both`},
		{"recall", "memtoolagent:\n  recall: top-0\n", `memtoolagent.recall: "top-0": top-K needs a count K of 1 or more`},
		{"adaptive radius", "memtoolagent:\n  adaptive:\n    radius: 0\n", "memtoolagent.adaptive.radius: 0: a half window R 0 has no slope"},
		{"max steps", "memtoolagent:\n  max_steps: 0\n", "memtoolagent.max_steps: 0: the model needs at least one turn"},
		{"memory size", "memtoolagent:\n  memory_size: -1\n", "memtoolagent.memory_size: -1"},
		{"mistyped key", "memtoolagent:\n  max_step: 3\n", "unknown key memtoolagent.max_step (did you mean max_steps?)"},
		{"workbench limit", "workbench:\n  limit: -2\n", "workbench.limit: -2: want 0 (all queries) or more"},
		{"workbench parallel", "workbench:\n  parallel: 0\n", "workbench.parallel: 0 is below the minimum 1"},
		{"workbench tasks", "workbench:\n  tasks: [a.csv, \"\"]\n", "workbench.tasks[1]"},
		{"workbench tasks type", "workbench:\n  tasks: a.csv\n", "workbench.tasks must be a list"},
		{"nestful test size", "nestful:\n  test_size: -1\n", "nestful.test_size: -1: want 0 (every sample) or more"},
		{"nestful python", "nestful:\n  python: \"\"\n", "nestful.python"},
		{"tamem turns", "tamem:\n  max_turns: 0\n", "tamem.max_turns: 0: want at least 1"},
		{"tamem chunking", "tamem:\n  chunking:\n    kind: topics\n", `tamem.chunking.kind: "topics" is not one of llm, fixed, semantic`},
		{"tamem overlap", "tamem:\n  chunking:\n    overlap: 1\n", "tamem.chunking.overlap: 1: want the share"},
		{"tamem percentile", "tamem:\n  chunking:\n    percentile: 101\n", "tamem.chunking.percentile: 101"},
		{"dfsdt retrieval", "fittext:\n  dfsdt:\n    retrieval: [single, query]\n", `fittext.dfsdt.retrieval[1]: "query": want none or a strategy`},
		{"dfsdt retrieval twice", "fittext:\n  dfsdt:\n    retrieval: [single, single]\n", `fittext.dfsdt.retrieval[1]: "single" is named twice`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := Load(write(t, tc.body), nil); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v, want %q", err, tc.want)
			}
		})
	}
}

// TestFlagOverridesKey: a bound flag that is given wins over its key from
// the file and from --set; one that is not leaves the key; a bad value
// is named by the flag and the key; a list flag replaces the list.
func TestFlagOverridesKey(t *testing.T) {
	file := write(t, "memtoolagent:\n  max_steps: 7\n  memory: \"off\"\nworkbench:\n  tasks: [a.csv]\nnestful:\n  test_size: 50\n")
	parse := func(args ...string) (Config, error) {
		f := Flags{Path: file, Sets: []string{"memtoolagent.max_steps=8"}}
		fs := pflag.NewFlagSet("run", pflag.ContinueOnError)
		f.Flag(fs, "max-steps", "memtoolagent.max_steps", "turns")
		f.Flag(fs, "memory", "memtoolagent.memory", "on, off or both")
		f.Flag(fs, "tasks", "workbench.tasks", "CSV files")
		f.Flag(fs, "chunk-overlap", "tamem.chunking.overlap", "share")
		fs.Int("limit", 0, "the key of the benchmark")
		if err := fs.Parse(args); err != nil {
			t.Fatal(err)
		}
		f.Bind(fs, "limit", "nestful.test_size")
		return f.Load()
	}
	cfg, err := parse()
	if err != nil {
		t.Fatal(err)
	}
	if cfg.MemToolAgent.MaxSteps != 8 || cfg.MemToolAgent.Memory != "off" || !reflect.DeepEqual(cfg.WorkBench.Tasks, []string{"a.csv"}) || cfg.Nestful.TestSize != 50 {
		t.Fatalf("flags not given changed keys: %+v %+v", cfg.MemToolAgent, cfg.WorkBench)
	}
	cfg, err = parse("--max-steps", "3", "--memory", "on", "--tasks", "b.csv", "--tasks", "c,d.csv", "--chunk-overlap", "0.5", "--limit", "9")
	if err != nil {
		t.Fatal(err)
	}
	if cfg.MemToolAgent.MaxSteps != 3 || cfg.MemToolAgent.Memory != "on" || !reflect.DeepEqual(cfg.WorkBench.Tasks, []string{"b.csv", "c,d.csv"}) ||
		cfg.TAMem.Chunking.Overlap != 0.5 || cfg.Nestful.TestSize != 9 {
		t.Fatalf("flags given: %+v %+v %+v %+v", cfg.MemToolAgent, cfg.WorkBench, cfg.TAMem, cfg.Nestful)
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--max-steps", "0"}, "--max-steps 0: the model needs at least one turn (memtoolagent.max_steps)"},
		{[]string{"--memory", "maybe"}, `--memory "maybe" is not one of on, off, both (memtoolagent.memory)`},
		{[]string{"--chunk-overlap", "1"}, "--chunk-overlap 1: want the share of a chunk the next repeats, in [0, 1) (tamem.chunking.overlap)"},
		{[]string{"--limit", "-1"}, "--limit -1: want 0 (every sample) or more (nestful.test_size)"},
	} {
		if _, err := parse(c.args...); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%v: %v, want %q", c.args, err, c.want)
		}
	}
	// The flag takes the key's type and default, and says which key it sets.
	fs := pflag.NewFlagSet("run", pflag.ContinueOnError)
	var f Flags
	f.Flag(fs, "max-steps", "memtoolagent.max_steps", "turns")
	if fl := fs.Lookup("max-steps"); fl.Value.Type() != "int" || fl.DefValue != "10" || !strings.Contains(fl.Usage, "(memtoolagent.max_steps)") {
		t.Fatalf("flag %s %s %q", fl.Value.Type(), fl.DefValue, fl.Usage)
	}
	for _, bad := range []func(){
		func() { f.Flag(fs, "x", "memtoolagent.max_stepz", "") },
		func() { f.Bind(fs, "nope", "memtoolagent.max_steps") },
	} {
		func() {
			defer func() {
				if recover() == nil {
					t.Error("a binding to a key or flag that does not exist was accepted")
				}
			}()
			bad()
		}()
	}
}
