package nestful

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"
)

// Executor runs a call sequence with NESTFUL's own implementations of its
// functions (data_v2/executable_functions: basic_functions.py for the
// MathQA operations, func_file_map.json naming the file of each coding
// function), in a Python process per sequence, as the benchmark's win
// rate is defined: a prediction wins when executing it returns the gold
// answer. Arguments are passed by name when the function has parameters of
// those names, else by position, in the order of their names (arg_0,
// arg_1, ..., arg_10: the data's names for the MathQA operations, which
// func_file_map.json's implementations call otherwise); "$var_1.result$"
// is the output of the call labelled $var_1 (a field of it when the
// output is an object with that key).
type Executor struct {
	Dir     string        // the executable_functions folder
	Python  string        // the interpreter (default python3)
	Timeout time.Duration // a sequence's limit (default 10 s): the functions are arbitrary code
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

// harness executes the calls read from stdin and writes the last call's
// output, or the error that stopped the sequence, after the marker.
const harness = `import importlib.util, inspect, json, os, re, sys
d = sys.argv[1]
fmap = json.load(open(os.path.join(d, "func_file_map.json")))
mods = {}
def load(f):
    if f not in mods:
        spec = importlib.util.spec_from_file_location(f[:-3], os.path.join(d, f))
        m = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(m)
        mods[f] = m
    return mods[f]
def func(name):
    fn = getattr(load(fmap.get(name, "basic_functions.py")), name, None)
    if not callable(fn):
        raise NameError("no function named %r" % name)
    return fn
env = {}
def value(v):
    if isinstance(v, str) and len(v) > 2 and v[0] == "$" and v[-1] == "$" and "$" not in v[1:-1].lstrip("$"):
        label, _, field = v[1:-1].lstrip("$").partition(".")
        if label not in env:
            raise KeyError("no earlier output labelled %r" % label)
        out = env[label]
        if isinstance(out, dict) and field in out:
            return out[field]
        if field in ("", "result"):
            return out
        raise KeyError("output %r has no field %r" % (label, field))
    if isinstance(v, list):
        return [value(x) for x in v]
    if isinstance(v, dict):
        return {k: value(x) for k, x in v.items()}
    return v
def natural(k):
    m = re.match(r"^(.*?)(\d+)$", k)
    return (m.group(1), int(m.group(2))) if m else (k, -1)
def call(fn, args):
    try:
        ps = inspect.signature(fn).parameters.values()
        if all(k in {p.name for p in ps} for k in args) or any(p.kind == p.VAR_KEYWORD for p in ps):
            return fn(**args)
    except (TypeError, ValueError):
        pass
    return fn(*[args[k] for k in sorted(args, key=natural)])
res = {"result": None}
try:
    for c in json.load(sys.stdin):
        out = call(func(c["name"]), {k: value(a) for k, a in (c.get("arguments") or {}).items()})
        env[str(c.get("label", "")).lstrip("$")] = out
        res["result"] = out
except BaseException as e:
    res = {"error": "%s: %s" % (type(e).__name__, e)}
try:
    line = json.dumps(res, allow_nan=False)
except (TypeError, ValueError):
    line = json.dumps({"result": repr(res.get("result"))})
sys.stdout.write("\n` + marker + `" + line + "\n")
`

// Run executes calls and returns the last one's output. An error is the
// sequence's (an unknown function, a bad argument, a reference to no
// earlier output, the time limit): the prediction does not win.
func (e *Executor) Run(ctx context.Context, calls []Call) (any, error) {
	if len(calls) == 0 {
		return nil, errors.New("nestful: no calls to execute")
	}
	in, err := json.Marshal(calls)
	if err != nil {
		return nil, err
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
		return nil, fmt.Errorf("nestful: executing the calls: %w", ctx.Err())
	}
	i := strings.LastIndex(out.String(), marker)
	if i < 0 {
		msg := strings.TrimSpace(stderr.String())
		if len(msg) > 300 {
			msg = msg[len(msg)-300:]
		}
		return nil, fmt.Errorf("nestful: the Python harness gave no answer (%v): %s", runErr, msg)
	}
	var res struct {
		Result any    `json:"result"`
		Error  string `json:"error"`
	}
	if err := json.Unmarshal([]byte(strings.TrimSpace(out.String()[i+len(marker):])), &res); err != nil {
		return nil, fmt.Errorf("nestful: the Python harness's answer: %w", err)
	}
	if res.Error != "" {
		return nil, errors.New(res.Error)
	}
	return res.Result, nil
}
