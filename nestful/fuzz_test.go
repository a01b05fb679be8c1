package nestful

import "testing"

// FuzzParseCalls: any answer parses with an error or as calls; a parsed
// sequence scored against itself is a full match with every metric 1, and
// against nothing every metric is within [0, 1]. `make test` runs the
// seeds; `make fuzz` explores.
func FuzzParseCalls(f *testing.F) {
	f.Add(`[{"name": "add", "arguments": {"arg_0": 1, "arg_1": "$var_0.result$"}, "label": "$var_1"}]`)
	f.Add("```json\n[{\"name\": \"f\", \"arguments\": {\"x\": [\"$a$\", {\"y\": 2.0}]}, \"label\": \"a\"}]\n```")
	f.Add(`<think>[</think>{"name": "g", "arguments": {}}`)
	f.Add(`[{"name": "f", "label": "$v", "arguments": {"a": "$v.result$"}}, {"name": "f", "label": "$v", "arguments": {"a": "$v$"}}]`)
	f.Add(`[1, 2`)
	f.Fuzz(func(t *testing.T, s string) {
		calls, err := ParseCalls(s)
		if err != nil {
			return
		}
		if len(calls) > 0 {
			if got := Score(calls, calls); got != (Scores{1, 1, 1, true}) {
				t.Fatalf("%q against itself: %+v", s, got)
			}
		}
		gold := []Call{{Name: "add", Label: "$var_1", Arguments: map[string]any{"arg_0": 1.0}}}
		got := Score(calls, gold)
		for _, v := range []float64{got.F1Function, got.F1Param, got.Partial} {
			if v < 0 || v > 1 || v != v {
				t.Fatalf("%q: %+v", s, got)
			}
		}
	})
}
