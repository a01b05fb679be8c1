package locomo

import (
	"slices"
	"strings"
)

// Stem is the Porter stemmer as NLTK's PorterStemmer runs it by default
// (mode NLTK_EXTENSIONS), which LoCoMo's scorer uses: Porter's 1980
// algorithm with Martin Porter's later extensions (-fully, -tionally, the
// *o test at the start of a word, -logi keeping its l), NLTK's own (a table
// of irregular forms, "ies"/"ied" in four-letter words, y → i only after a
// consonant that is not the whole stem, -alli recursion) and words of two
// letters or fewer left alone. It lower-cases first and works on runes, as
// Python's str does.
func Stem(word string) string {
	lower := strings.ToLower(word)
	if p, ok := irregular[word]; ok {
		return p
	}
	if len([]rune(word)) <= 2 {
		return lower
	}
	w := []rune(lower)
	for _, step := range []func([]rune) []rune{step1a, step1b, step1c, step2, step3, step4, step5a, step5b} {
		w = step(w)
	}
	return string(w)
}

// irregular maps NLTK's irregular forms to their stems (looked up by the
// word as given, as NLTK does).
var irregular = map[string]string{
	"sky": "sky", "skies": "sky", "dying": "die", "lying": "lie", "tying": "tie", "news": "news",
	"innings": "inning", "inning": "inning", "outings": "outing", "outing": "outing",
	"cannings": "canning", "canning": "canning", "howe": "howe",
	"proceed": "proceed", "exceed": "exceed", "succeed": "succeed",
}

func isVowelLetter(r rune) bool { return r == 'a' || r == 'e' || r == 'i' || r == 'o' || r == 'u' }

// consonant: a letter other than a, e, i, o, u, and other than y after a
// consonant (anything not a vowel counts, digits included, as in NLTK).
func consonant(w []rune, i int) bool {
	if isVowelLetter(w[i]) {
		return false
	}
	if w[i] == 'y' {
		return i == 0 || !consonant(w, i-1)
	}
	return true
}

// measure is m of [C](VC){m}[V]: the number of vowel-consonant
// transitions.
func measure(w []rune) int {
	m := 0
	for i := 1; i < len(w); i++ {
		if !consonant(w, i-1) && consonant(w, i) {
			m++
		}
	}
	return m
}

func hasVowel(w []rune) bool {
	for i := range w {
		if !consonant(w, i) {
			return true
		}
	}
	return false
}

func endsDoubleConsonant(w []rune) bool {
	n := len(w)
	return n >= 2 && w[n-1] == w[n-2] && consonant(w, n-1)
}

// endsCVC is *o: the stem ends consonant-vowel-consonant, the last not w, x
// or y; or (NLTK) the stem is exactly vowel-consonant.
func endsCVC(w []rune) bool {
	n := len(w)
	if n >= 3 && consonant(w, n-3) && !consonant(w, n-2) && consonant(w, n-1) && !slices.Contains([]rune("wxy"), w[n-1]) {
		return true
	}
	return n == 2 && !consonant(w, 0) && consonant(w, 1)
}

func hasSuffix(w []rune, s string) bool {
	rs := []rune(s)
	return len(w) >= len(rs) && string(w[len(w)-len(rs):]) == s
}

func trim(w []rune, s string) []rune { return slices.Clone(w[:len(w)-len([]rune(s))]) }

func with(stem []rune, s string) []rune { return append(slices.Clone(stem), []rune(s)...) }

// rule is a suffix, its replacement and the condition its stem must meet
// (nil: none). The first rule whose suffix matches decides: applied if its
// condition holds, else the word is left as it is.
type rule struct {
	suffix, repl string
	cond         func(stem []rune) bool
}

func applyRules(w []rune, rules []rule) []rune {
	for _, r := range rules {
		if r.suffix == "*d" {
			if endsDoubleConsonant(w) {
				stem := w[:len(w)-2]
				if r.cond == nil || r.cond(stem) {
					return with(stem, r.repl)
				}
				return w
			}
			continue
		}
		if hasSuffix(w, r.suffix) {
			stem := trim(w, r.suffix)
			if r.cond == nil || r.cond(stem) {
				return with(stem, r.repl)
			}
			return w
		}
	}
	return w
}

func positive(stem []rune) bool { return measure(stem) > 0 }

func step1a(w []rune) []rune {
	if hasSuffix(w, "ies") && len(w) == 4 {
		return with(trim(w, "ies"), "ie")
	}
	return applyRules(w, []rule{{"sses", "ss", nil}, {"ies", "i", nil}, {"ss", "ss", nil}, {"s", "", nil}})
}

func step1b(w []rune) []rune {
	if hasSuffix(w, "ied") {
		if len(w) == 4 {
			return with(trim(w, "ied"), "ie")
		}
		return with(trim(w, "ied"), "i")
	}
	if hasSuffix(w, "eed") {
		if stem := trim(w, "eed"); measure(stem) > 0 {
			return with(stem, "ee")
		}
		return w
	}
	var stem []rune
	ok := false
	for _, s := range []string{"ed", "ing"} {
		if hasSuffix(w, s) {
			if stem = trim(w, s); hasVowel(stem) {
				ok = true
				break
			}
		}
	}
	if !ok {
		return w
	}
	last := stem[len(stem)-1]
	return applyRules(stem, []rule{
		{"at", "ate", nil}, {"bl", "ble", nil}, {"iz", "ize", nil},
		{"*d", string(last), func([]rune) bool { return last != 'l' && last != 's' && last != 'z' }},
		{"", "e", func(s []rune) bool { return measure(s) == 1 && endsCVC(s) }},
	})
}

func step1c(w []rune) []rune {
	return applyRules(w, []rule{{"y", "i", func(s []rune) bool { return len(s) > 1 && consonant(s, len(s)-1) }}})
}

func step2(w []rune) []rune {
	if hasSuffix(w, "alli") && positive(trim(w, "alli")) {
		return step2(with(trim(w, "alli"), "al"))
	}
	word := w
	return applyRules(w, []rule{
		{"ational", "ate", positive}, {"tional", "tion", positive}, {"enci", "ence", positive},
		{"anci", "ance", positive}, {"izer", "ize", positive}, {"bli", "ble", positive},
		{"alli", "al", positive}, {"entli", "ent", positive}, {"eli", "e", positive},
		{"ousli", "ous", positive}, {"ization", "ize", positive}, {"ation", "ate", positive},
		{"ator", "ate", positive}, {"alism", "al", positive}, {"iveness", "ive", positive},
		{"fulness", "ful", positive}, {"ousness", "ous", positive}, {"aliti", "al", positive},
		{"iviti", "ive", positive}, {"biliti", "ble", positive},
		{"fulli", "ful", positive},
		// -logi keeps its l in the stem whose measure is taken.
		{"logi", "log", func([]rune) bool { return positive(word[:len(word)-3]) }},
	})
}

func step3(w []rune) []rune {
	return applyRules(w, []rule{
		{"icate", "ic", positive}, {"ative", "", positive}, {"alize", "al", positive},
		{"iciti", "ic", positive}, {"ical", "ic", positive}, {"ful", "", positive}, {"ness", "", positive},
	})
}

func step4(w []rune) []rune {
	gt1 := func(s []rune) bool { return measure(s) > 1 }
	var rules []rule
	for _, s := range []string{"al", "ance", "ence", "er", "ic", "able", "ible", "ant", "ement", "ment", "ent"} {
		rules = append(rules, rule{s, "", gt1})
	}
	rules = append(rules, rule{"ion", "", func(s []rune) bool {
		return measure(s) > 1 && len(s) > 0 && (s[len(s)-1] == 's' || s[len(s)-1] == 't')
	}})
	for _, s := range []string{"ou", "ism", "ate", "iti", "ous", "ive", "ize"} {
		rules = append(rules, rule{s, "", gt1})
	}
	return applyRules(w, rules)
}

func step5a(w []rune) []rune {
	if hasSuffix(w, "e") {
		stem := trim(w, "e")
		if m := measure(stem); m > 1 || m == 1 && !endsCVC(stem) {
			return stem
		}
	}
	return w
}

func step5b(w []rune) []rune {
	word := w
	return applyRules(w, []rule{{"ll", "l", func([]rune) bool { return measure(word[:len(word)-1]) > 1 }}})
}
