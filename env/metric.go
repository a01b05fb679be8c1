package env

import (
	"regexp"
	"strings"
	"unicode"
)

// The answer metric of HotpotQA's official evaluation script: answers are
// normalised (lower case, no punctuation, no articles, single spaces) and
// compared by exact match and by token F1.

var articles = regexp.MustCompile(`\b(a|an|the)\b`)

// NormalizeAnswer is HotpotQA's normalize_answer.
func NormalizeAnswer(s string) string {
	s = strings.ToLower(s)
	s = strings.Map(func(r rune) rune {
		if unicode.IsPunct(r) || unicode.IsSymbol(r) {
			return -1
		}
		return r
	}, s)
	s = articles.ReplaceAllString(s, " ")
	return strings.Join(strings.Fields(s), " ")
}

// ExactMatch is 1 if the normalised answers are equal.
func ExactMatch(pred, gold string) float64 {
	if NormalizeAnswer(pred) == NormalizeAnswer(gold) {
		return 1
	}
	return 0
}

// F1 is the token-overlap F1 of the normalised answers. As in the official
// script, yes/no/noanswer answers score only on an exact match.
func F1(pred, gold string) float64 {
	np, ng := NormalizeAnswer(pred), NormalizeAnswer(gold)
	special := map[string]bool{"yes": true, "no": true, "noanswer": true}
	if (special[np] || special[ng]) && np != ng {
		return 0
	}
	return TokenF1(strings.Fields(np), strings.Fields(ng))
}

// TokenF1 is the F1 of two token multisets.
func TokenF1(pred, gold []string) float64 {
	count := map[string]int{}
	for _, t := range gold {
		count[t]++
	}
	same := 0
	for _, t := range pred {
		if count[t] > 0 {
			count[t]--
			same++
		}
	}
	if same == 0 {
		return 0
	}
	p := float64(same) / float64(len(pred))
	r := float64(same) / float64(len(gold))
	return 2 * p * r / (p + r)
}
