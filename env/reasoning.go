package env

import (
	"regexp"
	"strings"
)

// Reasoning is the oracle's thought before it answers a comparison whose
// facts it sees: each option beside the value it is compared on, then the
// verdict. Told only "the facts are in my context", a tiny policy answered
// comparisons no better than a coin (J 0.42-0.47 on them against 0.95 on
// bridge questions, from the same stored facts): the comparison of two
// years four tokens long, or of two country names, has to happen in one
// step, at the answer's first token. Written out, every step is one a
// small model learns: copy an option's year or country from its fact,
// compare two values just written, copy the name that follows the winning
// year (the value comes first, so an induction head finds it). ok is false
// for bridge questions and for facts it cannot read.
func Reasoning(t Task, seen string) (string, bool) {
	if t.Type != "comparison" {
		return "", false
	}
	if m := sameCountryRe.FindStringSubmatch(t.Question); m != nil {
		l1, ok1 := factValue(t.SupportingFacts, m[1], countryRe)
		l2, ok2 := factValue(t.SupportingFacts, m[2], countryRe)
		if !ok1 || !ok2 {
			return "", false
		}
		verdict := "Different countries."
		if l1 == l2 {
			verdict = "The same country."
		}
		a, b := m[1]+": "+l1+". ", m[2]+": "+l2+". "
		if swapped(t.SupportingFacts, m[1], m[2], seen) {
			a, b = b, a
		}
		return a + b + verdict, true
	}
	m := optionsRe.FindStringSubmatch(t.Question)
	if m == nil || !strings.Contains(t.Question, "first") && !strings.Contains(t.Question, "earlier") {
		return "", false
	}
	y1, ok1 := factValue(t.SupportingFacts, m[1], yearRe)
	y2, ok2 := factValue(t.SupportingFacts, m[2], yearRe)
	if !ok1 || !ok2 || y1 == y2 {
		return "", false
	}
	// Four-digit years compare as strings.
	early, name := y1, m[1]
	if y2 < y1 {
		early, name = y2, m[2]
	}
	a, b := y1+": "+m[1]+". ", y2+": "+m[2]+". "
	if swapped(t.SupportingFacts, m[1], m[2], seen) {
		a, b = b, a
	}
	return a + b + "The earlier is " + early + ": " + name + ".", true
}

// ReasonedAnswer is the reasoning teacher's reply to t's question when
// its supporting facts are in seen: a comparison's Reasoning (or, for a
// bridge question, that the facts are in its context) as the thought,
// then the answer, in the policy's reply format.
func ReasonedAnswer(t Task, seen string) string {
	if r, ok := Reasoning(t, seen); ok {
		return answer(r, t.Answer)
	}
	return answer(factsVisibleThought, t.Answer)
}

const factsVisibleThought = "The supporting facts are in my context, so I can answer."

// swapped reports whether the fact about second comes before the fact
// about first in seen (their last occurrences: the retrieval result is the
// latest message). Restated in the order the memories were returned, each
// option's value is read from the memory the policy has just reached, not
// looked up by name across the context: a 3-layer policy taught the
// question's order wrote both years correctly but bound them to the wrong
// names.
func swapped(facts []string, first, second, seen string) bool {
	at := func(name string) int {
		for _, f := range facts {
			if strings.HasPrefix(f, name+" ") {
				return strings.LastIndex(seen, f)
			}
		}
		return -1
	}
	i, j := at(first), at(second)
	return i >= 0 && j >= 0 && j < i
}

var (
	sameCountryRe = regexp.MustCompile(`^Are (.+?) and (.+?) in the same country\?$`)
	countryRe     = regexp.MustCompile(` is a town in (.+)\.$`)
	yearRe        = regexp.MustCompile(` (?:born|founded) in (\d{4})\.$`)
)

// factValue returns what re captures in the fact about name: the one that
// begins with name and a space (so "Gerox Hyki" does not read "Gerox
// Hykinson ...").
func factValue(facts []string, name string, re *regexp.Regexp) (string, bool) {
	for _, f := range facts {
		if !strings.HasPrefix(f, name+" ") {
			continue
		}
		if m := re.FindStringSubmatch(f); m != nil {
			return m[1], true
		}
	}
	return "", false
}
