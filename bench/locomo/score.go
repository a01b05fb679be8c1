package locomo

import (
	"strings"
	"unicode"
)

// Normalize is LoCoMo's answer normalisation: commas removed, lower case,
// ASCII punctuation removed, the words a, an, the and and removed (as a
// Unicode-aware \b(a|an|the|and)\b does), whitespace collapsed.
func Normalize(s string) string {
	s = strings.ToLower(strings.ReplaceAll(s, ",", ""))
	s = strings.Map(func(r rune) rune {
		if r < 128 && strings.ContainsRune(punctuation, r) {
			return -1
		}
		return r
	}, s)
	s = removeArticles(s)
	return strings.Join(fields(s), " ")
}

// punctuation is Python's string.punctuation.
const punctuation = "!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~"

// wordRune is a character of \w as Python's regex module reads it with
// Unicode: letters, marks, digits and connector punctuation.
func wordRune(r rune) bool {
	return unicode.IsLetter(r) || unicode.IsMark(r) || unicode.IsDigit(r) || unicode.In(r, unicode.Pc, unicode.Nl, unicode.Join_Control)
}

// removeArticles replaces each a, an, the, and that stands between word
// boundaries with a space.
func removeArticles(s string) string {
	rs := []rune(s)
	var b strings.Builder
	for i := 0; i < len(rs); {
		if i == 0 || !wordRune(rs[i-1]) {
			matched := 0
			for _, w := range []string{"and", "the", "an", "a"} { // the regex tries a|an|the|and; the longest match at a boundary wins here as there
				n := len(w)
				if i+n <= len(rs) && string(rs[i:i+n]) == w && (i+n == len(rs) || !wordRune(rs[i+n])) {
					matched = n
					break
				}
			}
			if matched > 0 {
				b.WriteRune(' ')
				i += matched
				continue
			}
		}
		b.WriteRune(rs[i])
		i++
	}
	return b.String()
}

// fields splits on whitespace as Python's str.split() does (which also
// counts the information separators U+001C..U+001F).
func fields(s string) []string {
	return strings.FieldsFunc(s, func(r rune) bool { return unicode.IsSpace(r) || r >= 0x1c && r <= 0x1f })
}

// TokenF1 is LoCoMo's f1_score: the F1 of the stemmed tokens of the
// normalised prediction and answer (0 when they share none).
func TokenF1(prediction, answer string) float64 {
	p, g := stems(prediction), stems(answer)
	count := map[string]int{}
	for _, t := range g {
		count[t]++
	}
	same := 0
	for _, t := range p {
		if count[t] > 0 {
			count[t]--
			same++
		}
	}
	if same == 0 {
		return 0
	}
	prec, rec := float64(same)/float64(len(p)), float64(same)/float64(len(g))
	return 2 * prec * rec / (prec + rec)
}

func stems(s string) []string {
	ws := fields(Normalize(s))
	for i, w := range ws {
		ws[i] = Stem(w)
	}
	return ws
}

// MultiF1 is LoCoMo's f1 for multi-hop answers: prediction and answer split
// on commas; for each gold part the best F1 of any predicted part; their
// mean.
func MultiF1(prediction, answer string) float64 {
	preds := strings.Split(prediction, ",")
	golds := strings.Split(answer, ",")
	var sum float64
	for _, g := range golds {
		best := 0.0
		for _, p := range preds {
			best = max(best, TokenF1(strings.TrimSpace(p), strings.TrimSpace(g)))
		}
		sum += best
	}
	return sum / float64(len(golds))
}

// ScoreQA is a prediction's score for a question, by its category as
// LoCoMo's evaluation does: single-hop, temporal and open-domain by token
// F1 (open-domain against the answer up to its first ';'), multi-hop by
// MultiF1, adversarial 1 when the prediction says the information is not
// available ("no information available" or "not mentioned") and 0
// otherwise.
func ScoreQA(q QA, prediction string) float64 {
	switch q.Category {
	case 1:
		return MultiF1(prediction, q.Answer)
	case 3:
		a, _, _ := strings.Cut(q.Answer, ";")
		return TokenF1(prediction, strings.TrimSpace(a))
	case 5:
		low := strings.ToLower(prediction)
		if strings.Contains(low, "no information available") || strings.Contains(low, "not mentioned") {
			return 1
		}
		return 0
	}
	return TokenF1(prediction, q.Answer)
}

// EvidenceRecall is the share of the question's evidence dialogue ids the
// retrieved context holds, as LoCoMo computes it: when the first context
// entry names a session ("S3"), every entry is read as a session and counts
// every turn of it. A question without evidence, or a prediction that gave
// no context (nil), scores 1 (LoCoMo's convention); an empty context that
// was given scores 0 (where LoCoMo's script fails).
func EvidenceRecall(q QA, context []string) float64 {
	if context == nil || len(q.Evidence) == 0 {
		return 1
	}
	if len(context) == 0 {
		return 0
	}
	hit := 0
	if strings.HasPrefix(context[0], "S") {
		sessions := map[string]bool{}
		for _, c := range context {
			if len(c) > 0 {
				sessions[c[1:]] = true
			}
		}
		for _, ev := range q.Evidence {
			s, _, _ := strings.Cut(ev, ":")
			if len(s) > 0 && sessions[s[1:]] {
				hit++
			}
		}
	} else {
		in := map[string]bool{}
		for _, c := range context {
			in[c] = true
		}
		for _, ev := range q.Evidence {
			if in[ev] {
				hit++
			}
		}
	}
	return float64(hit) / float64(len(q.Evidence))
}
