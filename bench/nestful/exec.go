package nestful

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"
)

// Executor computes NESTFUL's win rate: a prediction wins when executing
// its calls with the benchmark's own implementations of its functions
// (data_v2/executable_functions: basic_functions.py for the MathQA
// operations, func_file_map.json naming the file of each coding function)
// returns the gold answer. It runs the scorer's rules (src/scorer.py,
// calculate_win_score) in a Python process a sequence:
//
//   - a function defined in basic_functions.py is taken from there, any
//     other from the file func_file_map.json names, the file loaded
//     afresh for each call;
//   - arguments are passed by position, in the order they were written;
//     "$var_1.result$" (or "$var_1.result") is the output named result
//     of the call labelled $var_1;
//   - each call's output is named by its tool's one output parameter (a
//     tool with none or several fails the sequence), and the answer is
//     the last call's;
//   - a float answer is rounded to the gold's decimal places, a tuple
//     read as a list, then compared with ==.
//
// Any error, and a sequence over the time limit, is a loss.
type Executor struct {
	Dir     string        // the executable_functions folder
	Python  string        // the interpreter (default python3)
	Timeout time.Duration // a sequence's limit (default 10 s, the scorer's alarm)
}

// NewExecutor checks that dir holds NESTFUL's functions and that the
// interpreter runs.
func NewExecutor(dir, python string) (*Executor, error) {
	for _, f := range []string{"basic_functions.py", "func_file_map.json"} {
		if _, err := os.Stat(filepath.Join(dir, f)); err != nil {
			return nil, fmt.Errorf("nestful: %s is not NESTFUL's executable_functions folder: %w", dir, err)
		}
	}
	if python == "" {
		python = "python3"
	}
	if _, err := exec.LookPath(python); err != nil {
		return nil, fmt.Errorf("nestful: the win rate executes NESTFUL's Python functions: %w", err)
	}
	return &Executor{Dir: dir, Python: python, Timeout: 10 * time.Second}, nil
}

// marker starts the harness's answer line: the functions may print.
const marker = "\x1enestful\x1e"

// harness reads {"calls", "tools", "gold"} and writes {"win", "answer"}
// or {"error"} after the marker.
const harness = `import importlib.util, json, os, sys
d = sys.argv[1]
req = json.loads(sys.stdin.read())
basic = set()
for line in open(os.path.join(d, "basic_functions.py")):
    if line.startswith("def "):
        s = line.strip()[4:]
        basic.add(s[:s.index("(")])
fmap = json.load(open(os.path.join(d, "func_file_map.json")))
def func(name):
    f = "basic_functions.py" if name in basic else fmap[name]
    spec = importlib.util.spec_from_file_location(f, os.path.join(d, f))
    m = importlib.util.module_from_spec(spec)
    sys.modules[f] = m
    spec.loader.exec_module(m)
    return getattr(m, name)
def listit(t):
    return list(map(listit, t)) if isinstance(t, (list, tuple)) else t
def answer(calls, tools):
    results = {}
    for c in calls:
        label = c["label"].replace("$", "")
        spec = [s for s in tools if s["name"] == c["name"]][0]
        outs = list((spec.get("output_parameters") or spec.get("output_parameter") or {}).keys())
        args = []
        for k, v in c["arguments"].items():
            if type(v) == str and v.startswith("$") and v.endswith("$"):
                ref, out = v[1:-1].split(".", 1)
                v = results[ref][out]
            elif type(v) == str and v.startswith("$var"):
                ref, out = v[1:].split(".", 1)
                v = results[ref][out]
            args.append(v)
        res = func(c["name"])(*args)
        if len(outs) != 1:
            raise ValueError("%s has %d output parameters" % (c["name"], len(outs)))
        results[label] = {outs[0]: res}
    return next(iter(results[calls[-1]["label"].replace("$", "")].values()))
try:
    got = answer(req["calls"], req["tools"])
    gold = req["gold"]
    if type(gold) == float and type(got) == float and "." in str(gold):
        got = round(got, len(str(gold).split(".")[1]))
    win = got == gold or (type(got) == tuple and type(gold) == list and listit(got) == gold)
    out = {"win": bool(win), "answer": repr(got)}
except BaseException as e:
    out = {"win": False, "error": "%s: %s" % (type(e).__name__, e)}
sys.stdout.write("\n` + marker + `" + json.dumps(out) + "\n")
`

// Outcome is one executed prediction.
type Outcome struct {
	Win    bool   `json:"win"`
	Answer string `json:"answer,omitempty"` // the answer as Python prints it
	Error  string `json:"error,omitempty"`  // why the calls did not run through
}

// Run executes calls with s's tools and compares the answer with s's
// gold answer. An error is the harness's own failure (the interpreter
// would not start, the time limit): the prediction does not win.
func (e *Executor) Run(ctx context.Context, s Sample, calls []Call) (Outcome, error) {
	if len(calls) == 0 {
		return Outcome{Error: "no calls"}, nil
	}
	gold := s.GoldAnswer
	if len(gold) == 0 {
		gold = json.RawMessage("null")
	}
	in, err := json.Marshal(map[string]any{"calls": calls, "tools": s.Tools, "gold": gold})
	if err != nil {
		return Outcome{}, err
	}
	limit := e.Timeout
	if limit <= 0 {
		limit = 10 * time.Second
	}
	ctx, cancel := context.WithTimeout(ctx, limit)
	defer cancel()
	cmd := exec.CommandContext(ctx, e.Python, "-c", harness, e.Dir)
	cmd.Stdin = bytes.NewReader(in)
	var out, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &stderr
	runErr := cmd.Run()
	if ctx.Err() != nil {
		return Outcome{}, fmt.Errorf("nestful: executing the calls: %w", ctx.Err())
	}
	i := strings.LastIndex(out.String(), marker)
	if i < 0 {
		msg := strings.TrimSpace(stderr.String())
		if len(msg) > 300 {
			msg = msg[len(msg)-300:]
		}
		return Outcome{}, fmt.Errorf("nestful: the Python harness gave no answer (%v): %s", runErr, msg)
	}
	var o Outcome
	if err := json.Unmarshal([]byte(strings.TrimSpace(out.String()[i+len(marker):])), &o); err != nil {
		return Outcome{}, fmt.Errorf("nestful: the Python harness's answer: %w", err)
	}
	return o, nil
}
