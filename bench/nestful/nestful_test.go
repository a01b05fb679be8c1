package nestful

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// rhombus is the NESTFUL paper's example, in data_v2's layout.
const rhombus = toySample

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
			a0, _ := s.Output[1].Arguments.Get("arg_0")
			a1, _ := s.Output[1].Arguments.Get("arg_1")
			if len(s.Output) != 3 || a0 != "$var_1.result$" || a1 != json.Number("2") || len(s.Tools) != 3 || string(s.GoldAnswer) != "12.5" {
				t.Fatalf("%s: sample %s read as %+v", name, s.ID, s)
			}
		}
		if got[2].ID != "7" || string(got[2].GoldAnswer) != `"abc"` {
			t.Fatalf("%s: a numeric id and a plain-string answer read as %q, %s", name, got[2].ID, got[2].GoldAnswer)
		}
	}
}

func TestLoadNamesTheBadRecord(t *testing.T) {
	for text, want := range map[string]string{
		rhombus + "\n{not json\n":                                         "bad.jsonl:2:",
		`{"sample_id": "x", "input": "", "output": []}`:                   "sample x: no input",
		`{"sample_id": "x", "input": "q", "output": []}`:                  "sample x: no gold calls",
		`{"sample_id": "x", "input": "q", "output": [{"arguments": {}}]}`: "a call without a name",
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
	seq := `[{"name": "add", "arguments": {"arg_1": 2, "arg_0": 1.0}, "label": "$var_1"}]`
	for _, text := range []string{
		seq,
		"Here you go:\n```json\n" + seq + "\n```\nDone.",
		"<think>maybe [1, 2]?</think>\nThe calls are " + seq + " as asked.",
		`{"name": "add", "arguments": {"arg_1": 2, "arg_0": 1.0}, "label": "$var_1"}`,
	} {
		calls, bad, err := ParseCalls(text)
		if err != nil || bad != 0 || len(calls) != 1 || calls[0].Name != "add" {
			t.Fatalf("%.50q: %+v, %d, %v", text, calls, bad, err)
		}
		// In the order written, numbers as written.
		if a := calls[0].Arguments; len(a) != 2 || a[0] != (Arg{"arg_1", json.Number("2")}) || a[1] != (Arg{"arg_0", json.Number("1.0")}) {
			t.Fatalf("%.50q: arguments %v", text, a)
		}
	}
	if calls, _, err := ParseCalls("[]"); err != nil || len(calls) != 0 {
		t.Errorf("an empty list: %v, %v", calls, err)
	}
	// Elements that are not calls are counted and left out; arguments that
	// are not an object keep the call, marked.
	// Keys are case-sensitive, as in Python: "Name" is no name.
	calls, bad, err := ParseCalls(`[1, {"arguments": {}}, {"name": 3}, {"Name": "h"}, {"name": "f", "arguments": [1]}, {"name": "g"}]`)
	if err != nil || bad != 4 || len(calls) != 2 || !calls[0].badArgs || calls[1].badArgs {
		t.Fatalf("%+v, %d, %v", calls, bad, err)
	}
	for _, text := range []string{"", "The answer is 12.5.", `[{"name": "add", "arguments": {`} {
		if _, _, err := ParseCalls(text); err == nil || !strings.Contains(err.Error(), "no JSON list of calls") {
			t.Errorf("%q: error %v", text, err)
		}
	}
}

func parse(t *testing.T, s string) []Call {
	t.Helper()
	calls, _, err := ParseCalls(s)
	if err != nil {
		t.Fatal(err)
	}
	return calls
}

// TestScoreHandWorked: the sequence scores on cases worked by hand
// against the rhombus sample's gold sequence, written as NESTFUL's scorer
// writes calls:
//
//	rectangle_area(arg_0 = 20, arg_1 = 10)
//	multiply(arg_0 = $var_1.result$, arg_1 = 2)
//	divide(arg_0 = $var_2.result$, arg_1 = 32)
func TestScoreHandWorked(t *testing.T) {
	s := ToySample()
	rect := `{"name": "rectangle_area", "label": "$var_1", "arguments": {"arg_1": 10, "arg_0": 20}}`
	mul := `{"name": "multiply", "label": "$var_2", "arguments": {"arg_0": "$var_1.result$", "arg_1": 2}}`
	div := `{"name": "divide", "label": "$var_3", "arguments": {"arg_0": "$var_2.result$", "arg_1": 32}}`
	cases := []struct {
		name string
		pred string
		want Scores
	}{
		// Arguments in another order are the same call (they are sorted).
		{"the gold itself", "[" + rect + "," + mul + "," + div + "]", Scores{1, true}},
		// References are compared as written: other labels miss the two
		// calls that use them.
		{"other labels", "[" + strings.ReplaceAll(strings.ReplaceAll(rect+","+mul+","+div, "var_1", "a"), "var_2", "b") + "]", Scores{1.0 / 3, false}},
		// str(20.0) is "20.0": the first call differs.
		{"20.0 for 20", "[" + strings.Replace(rect, "20", "20.0", 1) + "," + mul + "," + div + "]", Scores{2.0 / 3, false}},
		{"a wrong value", "[" + rect + "," + mul + "," + strings.Replace(div, "32", "16", 1) + "]", Scores{2.0 / 3, false}},
		{"a wrong reference", "[" + rect + "," + mul + "," + strings.Replace(div, "var_2", "var_1", 1) + "]", Scores{2.0 / 3, false}},
		// A reference missing its closing '$' gets it.
		{"an open reference", "[" + rect + "," + strings.Replace(mul, "result$", "result", 1) + "," + div + "]", Scores{1, true}},
		// Two of three: aligned with a gap for divide.
		{"a call short", "[" + rect + "," + mul + "]", Scores{2.0 / 3, false}},
		// An extra call first: the alignment pairs each gold call with a
		// gap, then the prediction's four with gaps (0 of 7).
		{"an extra call first", `[{"name": "add", "label": "$x", "arguments": {"arg_0": 1, "arg_1": 1}},` + rect + "," + mul + "," + div + "]", Scores{0, false}},
		// Arguments that are not an object: "multiply({})".
		{"arguments not an object", "[" + rect + `, {"name": "multiply", "label": "$var_2", "arguments": [1, 2]},` + div + "]", Scores{2.0 / 3, false}},
		{"nothing", `[]`, Scores{0, false}},
	}
	for _, c := range cases {
		if got := Score(parse(t, c.pred), s.Output); math.Abs(got.Partial-c.want.Partial) > 1e-12 || got.Full != c.want.Full {
			t.Errorf("%s: %+v, want %+v", c.name, got, c.want)
		}
	}
}

// TestCorpusF1HandWorked: macro F1 over two samples, worked by hand (and
// checked against scikit-learn's MultiLabelBinarizer and f1_score(average=
// "macro") where python3 has it, TestCorpusF1MatchesScikitLearn).
//
// Names: the gold's classes are rectangle_area, multiply, divide, add;
// the prediction misses divide and adds subtract (not a gold class, so
// ignored): F1 1, 1, 0, 1, macro 3/4. Slots: eight gold classes; four
// predicted right (F1 1, "arg_1 = 2" F1 2/3 for its extra positive under
// add), four missed: macro (3 + 2/3)/8 = 11/24.
func TestCorpusF1HandWorked(t *testing.T) {
	s := ToySample()
	g2 := parse(t, `[{"name": "add", "label": "$v1", "arguments": {"arg_0": 1, "arg_1": 2}}, {"name": "add", "label": "$v2", "arguments": {"arg_0": "$v1.result$", "arg_1": 3}}]`)
	p1 := s.Output[:2]
	p2 := parse(t, `[{"name": "add", "label": "$v1", "arguments": {"arg_0": 1, "arg_1": 2}}, {"name": "subtract", "label": "$v2", "arguments": {"arg_0": "$v1.result$", "arg_1": 3}}]`)
	names, params := CorpusF1([][]Call{p1, p2}, [][]Call{s.Output, g2})
	if math.Abs(names-0.75) > 1e-12 || math.Abs(params-11.0/24) > 1e-12 {
		t.Fatalf("names %v (want 0.75), params %v (want 11/24)", names, params)
	}
	if n, p := CorpusF1([][]Call{s.Output}, [][]Call{s.Output}); n != 1 || p != 1 {
		t.Fatalf("the gold against itself: %v, %v", n, p)
	}
	if n, p := CorpusF1([][]Call{nil}, [][]Call{s.Output}); n != 0 || p != 0 {
		t.Fatalf("nothing predicted: %v, %v", n, p)
	}
}

// TestPyRepr: values as Python's str and repr print them, the cases
// worked by hand from CPython's rules, and (where python3 runs) a sweep
// of values against python3 itself.
func TestPyRepr(t *testing.T) {
	for _, c := range []struct {
		v    any
		want string
	}{
		{json.Number("20"), "20"}, {json.Number("-0"), "0"}, {json.Number("20.0"), "20.0"}, {json.Number("2e3"), "2000.0"},
		{json.Number("0.1"), "0.1"}, {json.Number("1e16"), "1e+16"}, {json.Number("1234567890123456.0"), "1234567890123456.0"},
		{json.Number("0.0001"), "0.0001"}, {json.Number("0.00001"), "1e-05"}, {json.Number("-1.5e-7"), "-1.5e-07"},
		{json.Number("123456789012345678901234567890"), "123456789012345678901234567890"},
		{json.Number("1e400"), "inf"}, {true, "True"}, {nil, "None"},
		{[]any{json.Number("1"), "a", json.Number("2.50")}, "[1, 'a', 2.5]"},
		{Object{{"k", "it's"}, {"n", []any{}}}, `{'k': "it's", 'n': []}`},
		{[]any{"a\nb\\", `'"`}, `['a\nb\\', '\'"']`},
	} {
		if got := pyRepr(c.v); got != c.want {
			t.Errorf("repr(%v) = %s, want %s", c.v, got, c.want)
		}
	}
	if pyStr("plain") != "plain" || pyStr(json.Number("3")) != "3" {
		t.Error("str of a string or number")
	}
	if _, err := exec.LookPath("python3"); err != nil {
		t.Skip("no python3 for the sweep")
	}
	lits := []string{`0`, `-7`, `1.0`, `0.5`, `1e-4`, `9.999e-5`, `1e15`, `9999999999999998.0`, `1e16`, `12345678.9`, `3.14159265358979`, `1e100`, `-2.5e-300`,
		`5e-324`, `1.7976931348623157e308`, `[1, [2.0, "x"], {"a": null, "b": true}]`, `"tab\there"`, `"q'uote\"s"`, `"\u00e9"`}
	cmd := exec.Command("python3", "-c", `import json,sys
for l in sys.stdin.read().split("\n"):
    print(repr(json.loads(l)))`)
	cmd.Stdin = strings.NewReader(strings.Join(lits, "\n"))
	out, err := cmd.Output()
	if err != nil {
		t.Fatal(err)
	}
	want := strings.Split(strings.TrimRight(string(out), "\n"), "\n")
	if len(want) != len(lits) {
		t.Fatalf("python3 printed %d lines for %d values", len(want), len(lits))
	}
	for i, l := range lits {
		v, err := decodeOrdered([]byte(l))
		if err != nil {
			t.Fatal(err)
		}
		if got := pyRepr(v); got != want[i] {
			t.Errorf("%s: %s, python3 %s", l, got, want[i])
		}
	}
}

// functions writes an executable_functions folder in NESTFUL's layout.
// divide is also in func_file_map.json, with other parameter names: the
// scorer takes basic_functions.py's first.
func functions(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	if err := WriteToyFunctions(dir); err != nil {
		t.Fatal(err)
	}
	return dir
}

func needPython(t *testing.T) {
	t.Helper()
	if _, err := exec.LookPath("python3"); err != nil {
		t.Skip("no python3: the win rate runs NESTFUL's Python functions")
	}
}

// sample is the rhombus sample with more tools and another gold answer.
func sample(t *testing.T, gold string, tools ...string) Sample {
	t.Helper()
	s := ToySample()
	s.GoldAnswer = json.RawMessage(gold)
	for _, tl := range tools {
		var x Tool
		if err := json.Unmarshal([]byte(tl), &x); err != nil {
			t.Fatal(err)
		}
		s.Tools = append(s.Tools, x)
	}
	return s
}

// TestExecutorFollowsTheScorer: the win rate's rules, each on a case.
func TestExecutorFollowsTheScorer(t *testing.T) {
	needPython(t)
	ex, err := NewExecutor(functions(t), "")
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	one := func(name string) string {
		return `{"name": "` + name + `", "description": "", "parameters": {}, "output_parameters": {"result": {}}}`
	}
	s := sample(t, "12.5", one("add"), one("stats"), one("spin"), one("kinds"), one("pair"),
		`{"name": "two", "description": "", "parameters": {}, "output_parameters": {"a": {}, "b": {}}}`)
	run := func(gold, calls string) Outcome {
		t.Helper()
		s.GoldAnswer = json.RawMessage(gold)
		o, err := ex.Run(ctx, s, parse(t, calls))
		if err != nil {
			t.Fatal(err)
		}
		return o
	}
	for _, c := range []struct {
		why, gold, calls string
		win              bool
		answer, err      string
	}{
		{"the gold sequence (divide from basic_functions.py, not the map's)", "12.5", `[{"name": "rectangle_area", "label": "$var_1", "arguments": {"arg_0": 20, "arg_1": 10}}, {"name": "multiply", "label": "$var_2", "arguments": {"arg_0": "$var_1.result$", "arg_1": 2}}, {"name": "divide", "label": "$var_3", "arguments": {"arg_0": "$var_2.result$", "arg_1": 32}}]`, true, "12.5", ""},
		// By position in the order written, whatever the names: 10 / -50.
		{"positional, in order", "-5.0", `[{"name": "divide", "label": "$v", "arguments": {"arg_1": 10, "arg_0": -50}}]`, false, "-0.2", ""},
		// Rounded to the gold's one decimal place.
		{"rounded to the gold's decimals", "0.3", `[{"name": "divide", "label": "$v", "arguments": {"arg_0": 1, "arg_1": 3}}]`, true, "0.3", ""},
		{"an int is not rounded", "0", `[{"name": "divide", "label": "$v", "arguments": {"arg_0": 1, "arg_1": 3}}]`, false, "0.3333333333333333", ""},
		{"1 == 1.0", "1", `[{"name": "divide", "label": "$v", "arguments": {"arg_0": 3, "arg_1": 3}}]`, true, "1.0", ""},
		{"a tuple is a list", "[1, 2]", `[{"name": "pair", "label": "$v", "arguments": {"a": 1, "b": 2}}]`, true, "(1, 2)", ""},
		{"an open reference, a print on the way", "3", `[{"name": "add", "label": "$var_1", "arguments": {"arg_0": 1, "arg_1": 1}}, {"name": "add", "label": "$var_2", "arguments": {"arg_0": "$var_1.result", "arg_1": 1}}]`, true, "3", ""},
		{"numbers as written", `["int", "float", "str"]`, `[{"name": "kinds", "label": "$v", "arguments": {"x": 2, "y": 2.0, "z": "2"}}]`, true, "['int', 'float', 'str']", ""},
		{"a field other than the output's", "0", `[{"name": "stats", "label": "$v", "arguments": {"n": [1, 2]}}, {"name": "add", "label": "$w", "arguments": {"arg_0": "$v.total$", "arg_1": 1}}]`, false, "", "KeyError"},
		{"a function not in the sample's tools", "0", `[{"name": "sub", "label": "$v", "arguments": {}}]`, false, "", "IndexError"},
		{"a tool with two outputs", "0", `[{"name": "two", "label": "$v", "arguments": {}}]`, false, "", "KeyError"},
		{"a reference to nothing", "0", `[{"name": "add", "label": "$v", "arguments": {"arg_0": "$var_9.result$", "arg_1": 1}}]`, false, "", "KeyError: 'var_9'"},
		{"a failing call", "0", `[{"name": "divide", "label": "$v", "arguments": {"arg_0": 1, "arg_1": 0}}]`, false, "", "ZeroDivisionError"},
		{"no label", "2", `[{"name": "add", "arguments": {"arg_0": 1, "arg_1": 1}}]`, false, "", "KeyError: 'label'"},
	} {
		o := run(c.gold, c.calls)
		if o.Win != c.win || (c.answer != "" && o.Answer != c.answer) || !strings.Contains(o.Error, c.err) || (c.err == "") != (o.Error == "") {
			t.Errorf("%s: %+v, want win %v, answer %q, error %q", c.why, o, c.win, c.answer, c.err)
		}
	}
	if o, err := ex.Run(ctx, s, nil); err != nil || o.Win {
		t.Errorf("no calls: %+v, %v", o, err)
	}
	ex.Timeout = 500 * time.Millisecond
	if _, err := ex.Run(ctx, s, parse(t, `[{"name": "spin", "label": "$v", "arguments": {"n": 0}}]`)); err == nil || !strings.Contains(err.Error(), "deadline") {
		t.Errorf("a function that never returns: %v", err)
	}
	if _, err := NewExecutor(t.TempDir(), ""); err == nil || !strings.Contains(err.Error(), "executable_functions") {
		t.Errorf("a folder without the functions: %v", err)
	}
}

// TestCorpusF1MatchesScikitLearn: macroF1 against scikit-learn's own
// MultiLabelBinarizer and f1_score(average="macro") on 200 random corpora
// (labels the gold lacks, empty rows, repeats), where a python3 with
// scikit-learn is found ($NESTFUL_SKLEARN_PYTHON, else python3 and
// /usr/bin/python3; Debian's python3-sklearn).
func TestCorpusF1MatchesScikitLearn(t *testing.T) {
	var py string
	for _, p := range []string{os.Getenv("NESTFUL_SKLEARN_PYTHON"), "python3", "/usr/bin/python3"} {
		if p != "" && exec.Command(p, "-c", "import sklearn").Run() == nil {
			py = p
			break
		}
	}
	if py == "" {
		t.Skip("no python3 with scikit-learn")
	}
	r := rand.New(rand.NewPCG(9, 9))
	type corpus struct{ Gold, Pred [][]string }
	var cs []corpus
	for range 200 {
		var c corpus
		for range 1 + r.IntN(6) {
			row := func(vocab int) []string {
				out := []string{}
				for range r.IntN(4) {
					out = append(out, fmt.Sprintf("l%d", r.IntN(vocab)))
				}
				return out
			}
			c.Gold, c.Pred = append(c.Gold, row(5)), append(c.Pred, row(7))
		}
		if len(c.Gold[0]) == 0 {
			c.Gold[0] = []string{"l0"} // the binarizer needs one gold label
		}
		cs = append(cs, c)
	}
	in, _ := json.Marshal(cs)
	cmd := exec.Command(py, "-c", `import json, sys, warnings
warnings.simplefilter("ignore")
from sklearn.metrics import f1_score
from sklearn.preprocessing import MultiLabelBinarizer
for c in json.load(sys.stdin):
    b = MultiLabelBinarizer().fit(c["Gold"])
    print(repr(float(f1_score(b.transform(c["Gold"]), b.transform(c["Pred"]), average="macro"))))`)
	cmd.Stdin = bytes.NewReader(in)
	out, err := cmd.Output()
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Fields(string(out))
	if len(lines) != len(cs) {
		t.Fatalf("%d answers for %d corpora", len(lines), len(cs))
	}
	for i, c := range cs {
		want, _ := strconv.ParseFloat(lines[i], 64)
		if got := macroF1(c.Gold, c.Pred); math.Abs(got-want) > 1e-12 {
			t.Fatalf("corpus %d %+v: %v, scikit-learn %v", i, c, got, want)
		}
	}
}

// TestCallStringsMatchPython: the "name(arg = value, ...)" strings of
// random calls against python3 writing them as the scorer does (its
// f-strings over json.loads' values, the arguments sorted), so Python's
// own str() is the reference for every value kind.
func TestCallStringsMatchPython(t *testing.T) {
	needPython(t)
	r := rand.New(rand.NewPCG(4, 2))
	vals := []string{`0`, `-3`, `20`, `20.0`, `1e-7`, `2.5e17`, `0.1`, `"$var_1.result$"`, `"$var_2.result"`, `"text, with (parens)"`,
		`"it's"`, `true`, `null`, `[1, "a", 2.0, [null]]`, `{"k": [1.5, "x"], "j": false}`, `"\u00e9\t"`, `12345678901234567890`}
	var lines []string
	var calls []Call
	for range 300 {
		var args []string
		for k := range 1 + r.IntN(4) {
			args = append(args, fmt.Sprintf(`"%c%d": %s`, 'a'+rune(r.IntN(3)), k, vals[r.IntN(len(vals))]))
		}
		line := fmt.Sprintf(`{"name": "f%d", "arguments": {%s}}`, r.IntN(3), strings.Join(args, ", "))
		var c Call
		if err := json.Unmarshal([]byte(line), &c); err != nil {
			t.Fatal(err)
		}
		lines, calls = append(lines, line), append(calls, c)
	}
	cmd := exec.Command("python3", "-c", `import json, sys
for l in sys.stdin.read().split("\n"):
    f = json.loads(l)
    args = []
    for key, val in f["arguments"].items():
        if type(val) == str and val.startswith("$") and not val.endswith("$"):
            val = val + "$"
        args.append(f"{key} = {val}")
    print(json.dumps(f["name"] + "(" + ", ".join(sorted(args)) + ")"))`)
	cmd.Stdin = strings.NewReader(strings.Join(lines, "\n"))
	out, err := cmd.Output()
	if err != nil {
		t.Fatal(err)
	}
	want := strings.Split(strings.TrimSpace(string(out)), "\n")
	got := apiStrings(calls, true)
	for i := range calls {
		var w string
		json.Unmarshal([]byte(want[i]), &w)
		if got[i] != w {
			t.Fatalf("%s:\n got %s\nwant %s", lines[i], got[i], w)
		}
	}
}
