package nestful

import (
	"sort"
	"strings"
)

// NESTFUL's metrics, as its scorer (src/scorer.py of the benchmark's
// repository) computes them. A call is written "name(arg = value, ...)",
// its arguments sorted, each value as Python prints it (so 20 and 20.0
// differ, and a reference is compared as written: "$var_1.result$"; a
// predicted "$var_1.result" gets its closing '$').
//
//   - partial sequence: the share of positions where the predicted and
//     gold calls agree, after aligning the two lists when their lengths
//     differ (a name missing on one side becomes a gap);
//   - full sequence: every position agrees;
//   - F1 function and F1 param: macro F1 over the corpus (scikit-learn's
//     MultiLabelBinarizer fitted on the gold): the labels are function
//     names, one set a sample, and "arg = value" slots, one set per
//     function name of a sample; a predicted label the gold never has is
//     ignored, as the binarizer drops it.

// Scores are one sample's sequence scores.
type Scores struct {
	Partial float64 `json:"partial_sequence"`
	Full    bool    `json:"full_sequence"`
}

// Score compares pred with gold.
func Score(pred, gold []Call) Scores {
	g, p := align(apiStrings(gold, false), apiStrings(pred, true))
	var s Scores
	if len(g) == 0 {
		return s
	}
	same := 0
	for i := range g {
		if g[i] == p[i] {
			same++
		}
	}
	s.Partial = float64(same) / float64(len(g))
	s.Full = same == len(g)
	return s
}

// apiStrings writes each call as "name(arg = value, ...)", the arguments
// sorted; a call whose arguments were not an object has "name({})".
func apiStrings(calls []Call, pred bool) []string {
	out := make([]string, len(calls))
	for i, c := range calls {
		if c.badArgs {
			out[i] = c.Name + "({})"
			continue
		}
		args := slots(c, pred)
		sort.Strings(args)
		out[i] = c.Name + "(" + strings.Join(args, ", ") + ")"
	}
	return out
}

// slots are a call's "arg = value" strings; a predicted reference missing
// its closing '$' gets it.
func slots(c Call, pred bool) []string {
	out := make([]string, 0, len(c.Arguments))
	for _, a := range c.Arguments {
		v := a.Value
		if s, ok := v.(string); ok && pred && strings.HasPrefix(s, "$") && !strings.HasSuffix(s, "$") {
			v = s + "$"
		}
		out = append(out, a.Key+" = "+pyStr(v))
	}
	return out
}

// align pads the two lists to one length when they differ: walking both,
// equal names pair up, and otherwise the gold's call pairs with a gap (and
// once the gold is done, the prediction's rest with gaps).
func align(gold, pred []string) ([]string, []string) {
	if len(gold) == len(pred) {
		return gold, pred
	}
	name := func(s string) string { n, _, _ := strings.Cut(s, "("); return n }
	var g, p []string
	i, j := 0, 0
	for i < len(gold) || j < len(pred) {
		switch {
		case i < len(gold) && j < len(pred) && name(gold[i]) == name(pred[j]):
			g, p = append(g, gold[i]), append(p, pred[j])
			i, j = i+1, j+1
		case i < len(gold):
			g, p = append(g, gold[i]), append(p, "")
			i++
		default:
			g, p = append(g, ""), append(p, pred[j])
			j++
		}
	}
	return g, p
}

// labels are one sample's labels for the corpus F1s: its function names,
// and its slots by function name (a name called twice keeps the slots of
// its last call, as the scorer's map does).
type labels struct {
	names []string
	slots map[string][]string
}

func labelsOf(calls []Call, pred bool) labels {
	l := labels{slots: map[string][]string{}}
	for _, c := range calls {
		l.names = append(l.names, c.Name)
		if c.badArgs {
			l.slots[c.Name] = nil
			continue
		}
		l.slots[c.Name] = slots(c, pred)
	}
	return l
}

// CorpusF1 is the macro F1 of the function names and of the slots over
// samples, each a (predicted, gold) pair.
func CorpusF1(pred, gold [][]Call) (names, params float64) {
	var gn, pn, gs, ps [][]string
	for i := range gold {
		g, p := labelsOf(gold[i], false), labelsOf(pred[i], true)
		gn, pn = append(gn, g.names), append(pn, p.names)
		keys := map[string]bool{}
		for k := range g.slots {
			keys[k] = true
		}
		for k := range p.slots {
			keys[k] = true
		}
		for k := range keys {
			gs, ps = append(gs, g.slots[k]), append(ps, p.slots[k])
		}
	}
	return macroF1(gn, pn), macroF1(gs, ps)
}

// macroF1 is scikit-learn's f1_score(average="macro") over multi-label
// rows binarised by the gold's labels: each label's F1 (0 where it has
// no true or predicted positive) averaged over the labels.
// (TestCorpusF1MatchesScikitLearn holds it to scikit-learn itself.)
func macroF1(gold, pred [][]string) float64 {
	type counts struct{ tp, fp, fn int }
	c := map[string]*counts{}
	for _, row := range gold {
		for _, l := range row {
			if c[l] == nil {
				c[l] = &counts{}
			}
		}
	}
	if len(c) == 0 {
		return 0
	}
	if len(c) == 1 {
		// One column: scikit-learn reads it as a binary target and
		// averages the F1 of both values that occur, 1 and 0.
		var only string
		for l := range c {
			only = l
		}
		var t, p []bool
		for i := range gold {
			t, p = append(t, setOf(gold[i])[only]), append(p, setOf(pred[i])[only])
		}
		return binaryMacroF1(t, p)
	}
	for i := range gold {
		g, p := setOf(gold[i]), setOf(pred[i])
		for l := range g {
			if p[l] {
				c[l].tp++
			} else {
				c[l].fn++
			}
		}
		for l := range p {
			if x := c[l]; x != nil && !g[l] {
				x.fp++
			}
		}
	}
	var sum float64
	for _, x := range c {
		if d := 2*x.tp + x.fp + x.fn; d > 0 {
			sum += 2 * float64(x.tp) / float64(d)
		}
	}
	return sum / float64(len(c))
}

// binaryMacroF1 is the F1 of value true and of value false (each where
// it occurs in either list), averaged.
func binaryMacroF1(t, p []bool) float64 {
	var sum float64
	n := 0
	for _, v := range []bool{true, false} {
		tp, fp, fn, seen := 0, 0, 0, false
		for i := range t {
			seen = seen || t[i] == v || p[i] == v
			switch {
			case t[i] == v && p[i] == v:
				tp++
			case p[i] == v:
				fp++
			case t[i] == v:
				fn++
			}
		}
		if seen {
			n++
			if d := 2*tp + fp + fn; d > 0 {
				sum += 2 * float64(tp) / float64(d)
			}
		}
	}
	return sum / float64(n)
}

func setOf(xs []string) map[string]bool {
	m := make(map[string]bool, len(xs))
	for _, x := range xs {
		m[x] = true
	}
	return m
}
