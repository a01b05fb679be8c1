package nestful

import (
	"encoding/json"
	"strings"
	"testing"
)

// FuzzParseCalls: any answer parses with an error or as calls; a parsed
// sequence scored against itself (without open references) is a full
// match with F1 1 (the params'
// 0 when no call has an argument: no gold label), and against another
// every metric is within [0, 1]. `make test` runs the
// seeds; `make fuzz` explores.
func FuzzParseCalls(f *testing.F) {
	f.Add(`[{"name": "add", "arguments": {"arg_0": 1, "arg_1": "$var_0.result$"}, "label": "$var_1"}]`)
	f.Add("```json\n[{\"name\": \"f\", \"arguments\": {\"x\": [\"$a$\", {\"y\": 2.0}]}, \"label\": \"a\"}]\n```")
	f.Add(`<think>[</think>{"name": "g", "arguments": {}}`)
	f.Add(`[{"name": "f", "label": "$v", "arguments": {"a": "$v.result$"}}, {"name": "f", "label": "$v", "arguments": {"a": "$v$"}}]`)
	f.Add(`[1, 2`)
	f.Fuzz(func(t *testing.T, s string) {
		calls, _, err := ParseCalls(s)
		if err != nil {
			return
		}
		open := false // a predicted "$x" gets its closing '$', the gold's not
		for _, c := range calls {
			for _, a := range c.Arguments {
				if v, ok := a.Value.(string); ok && strings.HasPrefix(v, "$") && !strings.HasSuffix(v, "$") {
					open = true
				}
			}
		}
		if len(calls) > 0 && !open {
			if got := Score(calls, calls); got != (Scores{1, true}) {
				t.Fatalf("%q against itself: %+v", s, got)
			}
			if n, p := CorpusF1([][]Call{calls}, [][]Call{calls}); n != 1 || (p != 1 && p != 0) {
				t.Fatalf("%q against itself: F1 %v, %v", s, n, p)
			}
		}
		gold := []Call{{Name: "add", Label: "$var_1", Arguments: Args{{"arg_0", json.Number("1")}}}}
		got := Score(calls, gold)
		n, p := CorpusF1([][]Call{calls}, [][]Call{gold})
		for _, v := range []float64{got.Partial, n, p} {
			if v < 0 || v > 1 || v != v {
				t.Fatalf("%q: %+v, F1 %v, %v", s, got, n, p)
			}
		}
		for _, c := range calls {
			for _, a := range c.Arguments {
				_ = pyStr(a.Value)
			}
		}
	})
}
