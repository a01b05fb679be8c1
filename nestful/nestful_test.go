package nestful

import (
	"context"
	"encoding/json"
	"errors"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/agemem/agemem/agent"
	"github.com/agemem/agemem/embed"
	"github.com/agemem/agemem/memtools/ltm"
	"github.com/agemem/agemem/toolmem"
)

// rhombus is the NESTFUL paper's example, in data_v2's layout.
const rhombus = `{"sample_id": "s1", "input": "The area of a rhombus is equal to the area of a rectangle whose length is 20cm and the breadth is 10cm. If one of the diagonals is 32cm what is the length of other diagonal?", "output": [{"name": "rectangle_area", "label": "$var_1", "arguments": {"arg_0": 20, "arg_1": 10}}, {"name": "multiply", "label": "$var_2", "arguments": {"arg_0": "$var_1.result$", "arg_1": 2}}, {"name": "divide", "label": "$var_3", "arguments": {"arg_0": "$var_2.result$", "arg_1": 32}}], "tools": [{"name": "rectangle_area", "description": "area of a rectangle", "parameters": {"arg_0": {"description": "length", "type": "int or float"}, "arg_1": {"description": "width", "type": "int or float"}}, "output_parameter": {"result": {"description": "the area", "type": "int or float"}}}, {"name": "multiply", "description": "multiplies two numbers", "parameters": {"arg_0": {"type": "int or float"}, "arg_1": {"type": "int or float"}}, "output_parameter": {"result": {"type": "int or float"}}}, {"name": "divide", "description": "divides two numbers", "parameters": {"arg_0": {"type": "int or float"}, "arg_1": {"type": "int or float"}}, "output_parameter": {"result": {"type": "int or float"}}}], "gold_answer": 12.5}`

func writeFile(t *testing.T, name, text string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(p, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestLoadReadsBothLayouts(t *testing.T) {
	var rec map[string]any
	if err := json.Unmarshal([]byte(rhombus), &rec); err != nil {
		t.Fatal(err)
	}
	// The Hugging Face export: output, tools and gold_answer as JSON text.
	hf := map[string]any{"sample_id": "s2", "input": rec["input"]}
	for _, k := range []string{"output", "tools", "gold_answer"} {
		b, _ := json.Marshal(rec[k])
		hf[k] = string(b)
	}
	hfLine, _ := json.Marshal(hf)
	str := `{"sample_id": 7, "input": "q", "output": [{"name": "f", "label": "$var_1", "arguments": {}}], "tools": [], "gold_answer": "abc"}`
	for name, text := range map[string]string{
		"lines.jsonl": rhombus + "\n\n" + string(hfLine) + "\n" + str + "\n",
		"array.json":  "[" + rhombus + "," + string(hfLine) + "," + str + "]",
	} {
		got, err := Load(writeFile(t, name, text))
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if len(got) != 3 {
			t.Fatalf("%s: %d records, want 3", name, len(got))
		}
		for _, s := range got[:2] {
			if len(s.Output) != 3 || s.Output[1].Arguments["arg_0"] != "$var_1.result$" || s.Output[1].Arguments["arg_1"] != json.Number("2") || len(s.Tools) != 3 || s.GoldAnswer != 12.5 {
				t.Fatalf("%s: sample %s read as %+v", name, s.ID, s)
			}
		}
		if got[2].ID != "7" || got[2].GoldAnswer != "abc" {
			t.Fatalf("%s: a numeric id and a plain-string answer read as %q, %v", name, got[2].ID, got[2].GoldAnswer)
		}
	}
}

func TestLoadNamesTheBadRecord(t *testing.T) {
	for text, want := range map[string]string{
		rhombus + "\n{not json\n":                                         "bad.jsonl:2:",
		`{"sample_id": "x", "input": "", "output": []}`:                   "sample x: no input",
		`{"sample_id": "x", "input": "q", "output": []}`:                  "sample x: no gold calls",
		`{"sample_id": "x", "input": "q", "output": [{"arguments": {}}]}`: "gold call 1 has no name",
		`{"sample_id": "x", "input": "q", "output": "[{"}`:                "sample x: output",
		"\n\n": "no NESTFUL records",
	} {
		_, err := Load(writeFile(t, "bad.jsonl", text))
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%.40q: error %v, want it to say %q", text, err, want)
		}
	}
	if _, err := Load(filepath.Join(t.TempDir(), "missing.jsonl")); err == nil {
		t.Error("a missing file loaded")
	}
}

func TestParseCalls(t *testing.T) {
	seq := `[{"name": "add", "arguments": {"arg_0": 1, "arg_1": 2}, "label": "$var_1"}]`
	for _, text := range []string{
		seq,
		"Here you go:\n```json\n" + seq + "\n```\nDone.",
		"<think>maybe [1, 2]?</think>\nThe calls are " + seq + " as asked.",
		`{"name": "add", "arguments": {"arg_0": 1, "arg_1": 2}, "label": "$var_1"}`,
	} {
		calls, err := ParseCalls(text)
		if err != nil || len(calls) != 1 || calls[0].Name != "add" || calls[0].Arguments["arg_1"] != json.Number("2") {
			t.Errorf("%.50q: %+v, %v", text, calls, err)
		}
	}
	if calls, err := ParseCalls("[]"); err != nil || len(calls) != 0 {
		t.Errorf("an empty list: %v, %v", calls, err)
	}
	for _, text := range []string{"", "The answer is 12.5.", `[{"name": "add", "arguments": {`} {
		if _, err := ParseCalls(text); err == nil || !strings.Contains(err.Error(), "no JSON list of calls") {
			t.Errorf("%q: error %v", text, err)
		}
	}
}

func parse(t *testing.T, s string) []Call {
	t.Helper()
	calls, err := ParseCalls(s)
	if err != nil {
		t.Fatal(err)
	}
	return calls
}

// TestScoreHandWorked: each metric on cases worked by hand against the
// rhombus sample's gold sequence (rectangle_area, multiply, divide).
func TestScoreHandWorked(t *testing.T) {
	var s Sample
	if err := json.Unmarshal([]byte(rhombus), &s); err != nil {
		t.Fatal(err)
	}
	gold := s.Output
	cases := []struct {
		name string
		pred string
		want Scores
	}{
		{"the gold itself", `[{"name": "rectangle_area", "label": "$var_1", "arguments": {"arg_0": 20, "arg_1": 10}}, {"name": "multiply", "label": "$var_2", "arguments": {"arg_0": "$var_1.result$", "arg_1": 2}}, {"name": "divide", "label": "$var_3", "arguments": {"arg_0": "$var_2.result$", "arg_1": 32}}]`,
			Scores{1, 1, 1, true}},
		// Other labels, 20.0 for 20: the same sequence.
		{"relabelled", `[{"name": "rectangle_area", "label": "a", "arguments": {"arg_1": 10, "arg_0": 20.0}}, {"name": "multiply", "label": "$b", "arguments": {"arg_0": "$a.result$", "arg_1": 2}}, {"name": "divide", "label": "c", "arguments": {"arg_0": "$b.result$", "arg_1": 32}}]`,
			Scores{1, 1, 1, true}},
		// divide by 16: names 3/3; params 5 of 6 (P = R = 5/6); calls 2 of 3.
		{"one wrong value", `[{"name": "rectangle_area", "label": "$var_1", "arguments": {"arg_0": 20, "arg_1": 10}}, {"name": "multiply", "label": "$var_2", "arguments": {"arg_0": "$var_1.result$", "arg_1": 2}}, {"name": "divide", "label": "$var_3", "arguments": {"arg_0": "$var_2.result$", "arg_1": 16}}]`,
			Scores{1, 5.0 / 6, 2.0 / 3, false}},
		// divide reads the area, not the product: the reference is what is wrong.
		{"wrong reference", `[{"name": "rectangle_area", "label": "$var_1", "arguments": {"arg_0": 20, "arg_1": 10}}, {"name": "multiply", "label": "$var_2", "arguments": {"arg_0": "$var_1.result$", "arg_1": 2}}, {"name": "divide", "label": "$var_3", "arguments": {"arg_0": "$var_1.result$", "arg_1": 32}}]`,
			Scores{1, 5.0 / 6, 2.0 / 3, false}},
		// Two calls, both right: names P 1, R 2/3 (F1 0.8); params 4 of 4
		// against 4 of 6 (F1 0.8); calls 2 of 3.
		{"a call short", `[{"name": "rectangle_area", "label": "$var_1", "arguments": {"arg_0": 20, "arg_1": 10}}, {"name": "multiply", "label": "$var_2", "arguments": {"arg_0": "$var_1.result$", "arg_1": 2}}]`,
			Scores{0.8, 0.8, 2.0 / 3, false}},
		// add instead of multiply, one extra call: names 2 of 4 predicted
		// (P 1/2, R 2/3: F1 4/7); divide is fed add's output, not
		// multiply's, so it is wrong too: params 3 of 8 (P 3/8, R 1/2: F1
		// 3/7); calls 1 of 3.
		{"a wrong and an extra call", `[{"name": "rectangle_area", "label": "$var_1", "arguments": {"arg_0": 20, "arg_1": 10}}, {"name": "add", "label": "$var_2", "arguments": {"arg_0": "$var_1.result$", "arg_1": 2}}, {"name": "add", "label": "$var_4", "arguments": {"arg_0": 1, "arg_1": 1}}, {"name": "divide", "label": "$var_3", "arguments": {"arg_0": "$var_2.result$", "arg_1": 32}}]`,
			Scores{4.0 / 7, 3.0 / 7, 1.0 / 3, false}},
		// An extra call first: the others still feed the same outputs.
		// Names P 3/4, R 1 (F1 6/7); params P 6/8, R 1 (F1 6/7); calls 3/3.
		{"an extra call first", `[{"name": "add", "label": "x", "arguments": {"arg_0": 1, "arg_1": 1}}, {"name": "rectangle_area", "label": "a", "arguments": {"arg_0": 20, "arg_1": 10}}, {"name": "multiply", "label": "b", "arguments": {"arg_0": "$a.result$", "arg_1": 2}}, {"name": "divide", "label": "c", "arguments": {"arg_0": "$b.result$", "arg_1": 32}}]`,
			Scores{6.0 / 7, 6.0 / 7, 1, false}},
		// A label used twice: a reference is to the latest before it.
		{"a label rebound", `[{"name": "rectangle_area", "label": "v", "arguments": {"arg_0": 20, "arg_1": 10}}, {"name": "multiply", "label": "v", "arguments": {"arg_0": "$v.result$", "arg_1": 2}}, {"name": "divide", "label": "v", "arguments": {"arg_0": "$v.result$", "arg_1": 32}}]`,
			Scores{1, 1, 1, true}},
		{"nothing", `[]`, Scores{0, 0, 0, false}},
	}
	for _, c := range cases {
		got := Score(parse(t, c.pred), gold)
		near := func(a, b float64) bool { return math.Abs(a-b) < 1e-12 }
		if !near(got.F1Function, c.want.F1Function) || !near(got.F1Param, c.want.F1Param) || !near(got.Partial, c.want.Partial) || got.Full != c.want.Full {
			t.Errorf("%s: %+v, want %+v", c.name, got, c.want)
		}
	}
}

func TestEqual(t *testing.T) {
	for _, c := range []struct {
		got, want any
		eq        bool
	}{
		{12.5, 12.5, true}, {0.1 + 0.2, 0.3, true}, {12.5, 12.6, false}, {1e-9, 0.0, false},
		{"12.5", 12.5, false}, {"abc", "abc", true}, {true, true, true}, {true, 1.0, false},
		{[]any{1.0, 2.0}, []any{1.0, 2.0000000001}, true}, {[]any{1.0}, []any{1.0, 2.0}, false},
		{map[string]any{"a": 1.0}, map[string]any{"a": 1.0}, true}, {map[string]any{"a": 1.0}, map[string]any{"b": 1.0}, false},
		{nil, nil, true}, {nil, 0.0, false},
	} {
		if Equal(c.got, c.want) != c.eq {
			t.Errorf("Equal(%v, %v) = %v", c.got, c.want, !c.eq)
		}
	}
}

// functions writes an executable_functions folder in NESTFUL's layout.
func functions(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	files := map[string]string{
		"basic_functions.py": "import math\ndef rectangle_area(arg_0, arg_1):\n    return arg_0 * arg_1\n" +
			"def multiply(arg_0, arg_1):\n    return arg_0 * arg_1\ndef divide(arg_0, arg_1):\n    return arg_0 / arg_1\n" +
			"def add(arg_0, arg_1):\n    print('adding', arg_0, arg_1)\n    return arg_0 + arg_1\n",
		"py_code_file_1.py":  "def stats(numbers):\n    return {'total': sum(numbers), 'count': len(numbers)}\n",
		"py_code_file_2.py":  "def spin(n):\n    while True:\n        n += 1\n",
		"py_code_file_3.py":  "def sub(a, b):\n    return a - b\ndef seq(*xs):\n    return list(xs)\ndef kinds(*xs):\n    return [type(x).__name__ for x in xs]\n",
		"func_file_map.json": `{"stats": "py_code_file_1.py", "spin": "py_code_file_2.py", "sub": "py_code_file_3.py", "seq": "py_code_file_3.py", "kinds": "py_code_file_3.py"}`,
	}
	for name, text := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

func needPython(t *testing.T) {
	t.Helper()
	if _, err := exec.LookPath("python3"); err != nil {
		t.Skip("no python3: the win rate runs NESTFUL's Python functions")
	}
}

func TestExecutorRunsTheSequence(t *testing.T) {
	needPython(t)
	ex, err := NewExecutor(functions(t), "")
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	var s Sample
	if err := json.Unmarshal([]byte(rhombus), &s); err != nil {
		t.Fatal(err)
	}
	got, err := ex.Run(ctx, s.Output)
	if err != nil || !Equal(got, s.GoldAnswer) {
		t.Fatalf("the gold sequence: %v, %v; want %v", got, err, s.GoldAnswer)
	}
	// A function's output object: a field of it by name; a print does not
	// get in the way.
	got, err = ex.Run(ctx, parse(t, `[{"name": "stats", "label": "$var_1", "arguments": {"numbers": [1, 2, 4]}}, {"name": "add", "label": "$var_2", "arguments": {"arg_0": "$var_1.total$", "arg_1": "$var_1.count$"}}]`))
	if err != nil || !Equal(got, 10.0) {
		t.Fatalf("fields of an object output: %v, %v", got, err)
	}
	// Names the function does not have: by position, arg_2 before arg_10.
	got, err = ex.Run(ctx, parse(t, `[{"name": "sub", "label": "$var_1", "arguments": {"arg_1": 1, "arg_0": 10}}]`))
	if err != nil || !Equal(got, 9.0) {
		t.Fatalf("sub(arg_0=10, arg_1=1) by position: %v, %v", got, err)
	}
	got, err = ex.Run(ctx, parse(t, `[{"name": "seq", "label": "$var_1", "arguments": {"arg_10": 10, "arg_2": 2, "arg_0": 0, "arg_1": 1}}]`))
	if err != nil || !Equal(got, []any{0.0, 1.0, 2.0, 10.0}) {
		t.Fatalf("arguments in their names' numeric order: %v, %v", got, err)
	}
	// Numbers reach Python as written: 2 an int, 2.0 a float.
	got, err = ex.Run(ctx, parse(t, `[{"name": "kinds", "label": "$var_1", "arguments": {"arg_0": 2, "arg_1": 2.0, "arg_2": "2"}}]`))
	if err != nil || !Equal(got, []any{"int", "float", "str"}) {
		t.Fatalf("argument types: %v, %v", got, err)
	}
	for seq, want := range map[string]string{
		`[{"name": "nope", "label": "$var_1", "arguments": {}}]`:                                     "no function named 'nope'",
		`[{"name": "add", "label": "$var_1", "arguments": {"arg_0": "$var_9.result$", "arg_1": 1}}]`: "no earlier output labelled 'var_9'",
		`[{"name": "add", "label": "$var_1", "arguments": {"x": 1}}]`:                                "TypeError",
		`[{"name": "divide", "label": "$var_1", "arguments": {"arg_0": 1, "arg_1": 0}}]`:             "ZeroDivisionError",
	} {
		if _, err := ex.Run(ctx, parse(t, seq)); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: error %v, want %q", seq, err, want)
		}
	}
	ex.Timeout = 500 * time.Millisecond
	if _, err := ex.Run(ctx, parse(t, `[{"name": "spin", "label": "$var_1", "arguments": {"n": 0}}]`)); err == nil || !strings.Contains(err.Error(), "deadline") {
		t.Errorf("a function that never returns: %v", err)
	}
	if _, err := NewExecutor(t.TempDir(), ""); err == nil || !strings.Contains(err.Error(), "executable_functions") {
		t.Errorf("a folder without the functions: %v", err)
	}
}

// scripted answers each query from a table and records the system
// prompts it was given.
type scripted struct {
	mu      sync.Mutex
	answers map[string]string
	systems map[string]string
}

func (m *scripted) Chat(_ context.Context, msgs []agent.Message, _ []agent.Spec) (agent.Reply, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	q := msgs[len(msgs)-1].Content
	if msgs[0].Role == "system" && strings.HasPrefix(msgs[0].Content, "You are an agent responsible for analyzing") {
		return agent.Reply{Message: agent.Message{Role: "assistant", Content: "it added where it should have multiplied"}}, nil
	}
	m.systems[q] = msgs[0].Content
	return agent.Reply{Message: agent.Message{Role: "assistant", Content: m.answers[q]}, PromptTokens: 100}, nil
}

// TestBenchWithAndWithoutMemory: a scripted model right on some samples,
// wrong or unparsable on others; the means are worked by hand, and with
// memory the test prompts carry the memory samples' entries, a failure's
// with the extractor's critique.
func TestBenchWithAndWithoutMemory(t *testing.T) {
	needPython(t)
	ex, err := NewExecutor(functions(t), "")
	if err != nil {
		t.Fatal(err)
	}
	var base Sample
	if err := json.Unmarshal([]byte(rhombus), &base); err != nil {
		t.Fatal(err)
	}
	gold, _ := json.Marshal(base.Output)
	short := `[{"name": "rectangle_area", "label": "$var_1", "arguments": {"arg_0": 20, "arg_1": 10}}]`
	mk := func(id, q string) Sample { s := base; s.ID, s.Input = id, q; return s }
	test := []Sample{mk("t1", "rhombus one"), mk("t2", "rhombus two"), mk("t3", "rhombus three")}
	memory := []Sample{mk("m1", "rhombus memory right"), mk("m2", "rhombus memory wrong")}
	m := &scripted{systems: map[string]string{}, answers: map[string]string{
		"rhombus one": string(gold), "rhombus two": short, "rhombus three": "12.5",
		"rhombus memory right": string(gold), "rhombus memory wrong": short,
	}}
	off, err := Bench(context.Background(), test, memory, BenchOptions{Model: m, Exec: ex, Parallel: 2})
	if err != nil {
		t.Fatal(err)
	}
	// t1 full; t2 one call of three (names F1 0.5, params F1 0.5, partial
	// 1/3, executes to 200, not 12.5); t3 unparsed (all 0).
	if off.Full.Mean != 1.0/3 || off.Win.Mean != 1.0/3 || off.Win.N != 3 || off.Unparsed != 1 ||
		math.Abs(off.F1Function.Mean-0.5) > 1e-12 || math.Abs(off.Partial.Mean-4.0/9) > 1e-12 {
		t.Fatalf("without memory: %+v", off)
	}
	if strings.Contains(m.systems["rhombus one"], "Example Query") {
		t.Fatal("a prompt without memory shows memory entries")
	}
	mem := &toolmem.Memory{Store: ltm.NewMemory(1), Embedder: embed.NewHashing(256, nil), Count: toolmem.TopK(2)}
	on, err := Bench(context.Background(), test, memory, BenchOptions{Model: m, Exec: ex, Memory: mem})
	if err != nil {
		t.Fatal(err)
	}
	if on.MemorySize != 2 || on.Runs[0].Recalled != 2 || on.Full.Mean != off.Full.Mean {
		t.Fatalf("with memory: %+v", on)
	}
	p := m.systems["rhombus one"]
	for _, want := range []string{"Example Query: rhombus memory right", "Reflection/Critic: correct tool calls", "=====",
		"Example Query: rhombus memory wrong", "Reflection/Critic: it added where it should have multiplied", `"name":"rectangle_area"`} {
		if !strings.Contains(p, want) {
			t.Fatalf("the prompt with memory lacks %q:\n%s", want, p)
		}
	}
}

type failing struct{}

func (failing) Chat(context.Context, []agent.Message, []agent.Spec) (agent.Reply, error) {
	return agent.Reply{}, errors.New("prompt of 3524 tokens exceeds the limit of 2048")
}

// TestBenchScoresAModelErrorAsAFailure: a sample the model gives no
// answer for is a scored failure with its reason, not the run's end; a
// cancelled run ends.
func TestBenchScoresAModelErrorAsAFailure(t *testing.T) {
	var s Sample
	if err := json.Unmarshal([]byte(rhombus), &s); err != nil {
		t.Fatal(err)
	}
	r, err := Bench(context.Background(), []Sample{s, s}, nil, BenchOptions{Model: failing{}})
	if err != nil || r.Errors != 2 || r.Full.Mean != 0 || r.Full.N != 2 || !strings.Contains(r.Runs[1].Error, "exceeds the limit") {
		t.Fatalf("%+v, %v", r, err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := Bench(ctx, []Sample{s}, nil, BenchOptions{Model: failing{}}); !errors.Is(err, context.Canceled) {
		t.Fatalf("a cancelled run: %v", err)
	}
}
