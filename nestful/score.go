package nestful

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"math"
	"regexp"
	"strings"
)

// Scores are NESTFUL's metrics of one predicted sequence against the gold.
//
// Calls are compared in a canonical form: the name and the arguments, each
// reference to an earlier output ("$var_2.result$") rewritten as what that
// output is: the canonical form of the call that produced it (by a hash),
// and the field. So a model that labels its outputs differently ("$out1",
// "var_2") or puts an extra call before them is not marked wrong for
// that, while one that feeds the wrong output is.
type Scores struct {
	// F1Function is the F1 of the predicted function names against the
	// gold's, as multisets.
	F1Function float64 `json:"f1_function"`
	// F1Param is the F1 of the (function, parameter, value) triples.
	F1Param float64 `json:"f1_param"`
	// Partial is the share of the gold calls (name and every argument)
	// the prediction contains (as multisets).
	Partial float64 `json:"partial_sequence"`
	// Full is whether the prediction is the gold sequence, call for call.
	Full bool `json:"full_sequence"`
}

// Score compares pred with gold.
func Score(pred, gold []Call) Scores {
	pc, gc := canonical(pred), canonical(gold)
	var s Scores
	var pn, gn, pp, gp []string
	for i := range pc {
		pn = append(pn, pred[i].Name)
		pp = append(pp, pc[i].params...)
	}
	for i := range gc {
		gn = append(gn, gold[i].Name)
		gp = append(gp, gc[i].params...)
	}
	s.F1Function = f1(pn, gn)
	s.F1Param = f1(pp, gp)
	var pk, gk []string
	for _, c := range pc {
		pk = append(pk, c.key)
	}
	for _, c := range gc {
		gk = append(gk, c.key)
	}
	if len(gk) > 0 {
		s.Partial = float64(overlap(pk, gk)) / float64(len(gk))
	}
	s.Full = len(pk) == len(gk)
	for i := 0; s.Full && i < len(pk); i++ {
		s.Full = pk[i] == gk[i]
	}
	return s
}

// f1 is the F1 of two multisets; two empty ones agree (1).
func f1(pred, gold []string) float64 {
	if len(pred) == 0 && len(gold) == 0 {
		return 1
	}
	tp := float64(overlap(pred, gold))
	if tp == 0 {
		return 0
	}
	p, r := tp/float64(len(pred)), tp/float64(len(gold))
	return 2 * p * r / (p + r)
}

// overlap is the size of the multiset intersection.
func overlap(a, b []string) int {
	n := map[string]int{}
	for _, x := range b {
		n[x]++
	}
	k := 0
	for _, x := range a {
		if n[x] > 0 {
			n[x]--
			k++
		}
	}
	return k
}

type canon struct {
	key    string   // name and arguments
	params []string // name, parameter, value
}

// ref is an argument that is a whole reference to an earlier output:
// "$label$" or "$label.field$" (the label itself may start with '$').
var ref = regexp.MustCompile(`^\$(\$?[^$.]+)(?:\.([^$]*))?\$$`)

// canonical writes each call with its references resolved to the calls
// they name (the latest earlier call of that label, as executing the
// sequence binds it).
func canonical(calls []Call) []canon {
	made := map[string]string{} // label -> the hash of the call that made it
	out := make([]canon, len(calls))
	for i, c := range calls {
		args := map[string]any{}
		var params []string
		for k, v := range c.Arguments {
			v = resolved(v, made)
			args[k] = v
			params = append(params, c.Name+"\x00"+k+"\x00"+valueKey(v))
		}
		key := c.Name + "\x00" + valueKey(args)
		out[i] = canon{key: key, params: params}
		if l := labelOf(c.Label); l != "" {
			h := sha256.Sum256([]byte(key))
			made[l] = hex.EncodeToString(h[:12])
		}
	}
	return out
}

func labelOf(l string) string { return strings.TrimLeft(strings.TrimSpace(l), "$") }

// resolved rewrites references to the labels in made, in v and whatever
// lists and objects it holds; numbers compare by value.
func resolved(v any, made map[string]string) any {
	switch x := v.(type) {
	case json.Number:
		// 20 and 20.0 are the same argument.
		if f, err := x.Float64(); err == nil {
			return f
		}
		return x
	case string:
		if m := ref.FindStringSubmatch(x); m != nil {
			if h, ok := made[labelOf(m[1])]; ok {
				field := m[2]
				if field == "" {
					field = "result"
				}
				return "$#" + h + "." + field + "$"
			}
		}
		return x
	case []any:
		out := make([]any, len(x))
		for i, e := range x {
			out[i] = resolved(e, made)
		}
		return out
	case map[string]any:
		out := make(map[string]any, len(x))
		for k, e := range x {
			out[k] = resolved(e, made)
		}
		return out
	}
	return v
}

// valueKey is v's JSON (objects with sorted keys; 20 and 20.0 alike).
func valueKey(v any) string {
	b, err := json.Marshal(v)
	if err != nil {
		return fmt.Sprint(v)
	}
	return string(b)
}

// Equal reports whether an executed answer matches the gold one: numbers
// within a relative 1e-6 (Python's float arithmetic and JSON's round trip
// are not exact), lists item by item, objects key by key, anything else
// by its JSON.
func Equal(got, want any) bool {
	if n, ok := number(want); ok {
		want = n
	}
	switch w := want.(type) {
	case float64:
		g, ok := number(got)
		if !ok {
			return false
		}
		return g == w || math.Abs(g-w) <= 1e-6*math.Max(math.Abs(g), math.Abs(w))
	case bool:
		g, ok := got.(bool)
		return ok && g == w
	case []any:
		g, ok := got.([]any)
		if !ok || len(g) != len(w) {
			return false
		}
		for i := range w {
			if !Equal(g[i], w[i]) {
				return false
			}
		}
		return true
	case map[string]any:
		g, ok := got.(map[string]any)
		if !ok || len(g) != len(w) {
			return false
		}
		for k, wv := range w {
			gv, ok := g[k]
			if !ok || !Equal(gv, wv) {
				return false
			}
		}
		return true
	}
	return valueKey(got) == valueKey(want)
}

func number(v any) (float64, bool) {
	switch x := v.(type) {
	case float64:
		return x, true
	case json.Number:
		f, err := x.Float64()
		return f, err == nil
	}
	return 0, false
}
