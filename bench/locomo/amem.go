package locomo

import (
	"math"
	"regexp"
	"strings"
	"unicode"
	"unicode/utf8"
)

// The second table other memory papers report on LoCoMo (A-Mem, Mem0,
// TA-Mem's comparison): A-Mem's token F1 and BLEU-1 (its utils.py, which
// Mem0's evaluation borrows).

// amemTokens is A-Mem's simple_tokenize: lower-cased, . , ! ? made spaces,
// split on whitespace.
func amemTokens(s string) []string {
	s = strings.NewReplacer(".", " ", ",", " ", "!", " ", "?", " ").Replace(strings.ToLower(s))
	return strings.Fields(s)
}

// AMemF1 is A-Mem's token F1: of the sets of tokens (repeats count once),
// 0 when either side is empty.
func AMemF1(prediction, answer string) float64 {
	set := func(s string) map[string]bool {
		m := map[string]bool{}
		for _, t := range amemTokens(s) {
			m[t] = true
		}
		return m
	}
	p, r := set(strings.TrimSpace(prediction)), set(strings.TrimSpace(answer))
	if len(p) == 0 || len(r) == 0 {
		return 0
	}
	common := 0
	for t := range p {
		if r[t] {
			common++
		}
	}
	if common == 0 {
		return 0
	}
	prec, rec := float64(common)/float64(len(p)), float64(common)/float64(len(r))
	return 2 * prec * rec / (prec + rec)
}

// BLEU1 is A-Mem's BLEU-1: NLTK's sentence_bleu of the lower-cased
// word_tokenize tokens, weights (1, 0, 0, 0), smoothing method 1. With
// those weights it is the brevity penalty times the clipped unigram
// precision (0 when nothing matches). word_tokenize first splits sentences
// with Punkt, whose model is not here: the answer is tokenized as one
// sentence (NLTKWordTokenizer), which differs only where a period ends a
// sentence inside a multi-sentence answer.
func BLEU1(prediction, answer string) float64 {
	prediction, answer = strings.TrimSpace(prediction), strings.TrimSpace(answer)
	if prediction == "" || answer == "" {
		return 0 // A-Mem scores an empty side 0
	}
	hyp, ref := WordTokenize(strings.ToLower(prediction)), WordTokenize(strings.ToLower(answer))
	counts := map[string]int{}
	for _, t := range ref {
		counts[t]++
	}
	matched := 0
	for _, t := range hyp {
		if counts[t] > 0 {
			counts[t]--
			matched++
		}
	}
	if matched == 0 {
		return 0
	}
	bp := 1.0
	if len(hyp) <= len(ref) {
		bp = math.Exp(1 - float64(len(ref))/float64(len(hyp)))
	}
	return bp * float64(matched) / float64(len(hyp))
}

// The regular expressions of NLTKWordTokenizer (NLTK 3.8), in its order. Go's
// regexp has no look-around, so the two rules that use it are written out
// (apostropheClitic, wanna); \w, \d and \b are Unicode, as in Python 3.
var (
	startingQuotes = []tbRule{
		{`([«“‘„]|[` + "`" + `]+)`, " $1 "},
		{`^"`, "``"},
		{"(``)", " $1 "},
		{`([ (\[{<])("|'{2})`, "$1 `` "},
	}
	tbPunctuation = []tbRule{
		{`([^.])(\.)([\])}>"'»”’ ]*)\s*$`, "$1 $2 $3 "},
		{`([:,])([^\p{Nd}])`, " $1 $2"},
		{`([:,])$`, " $1 "},
		{`\.{2,}`, " $0 "},
		{`[;@#$%&]`, " $0 "},
		{`([^.])(\.)([\])}>"']*)\s*$`, "$1 $2$3 "},
		{`[?!]`, " $0 "},
		{`([^'])' `, "$1 ' "},
		{`[*]`, " $0 "},
	}
	parensDashes = []tbRule{
		{`[\]\[(){}<>]`, " $0 "},
		{`--`, " -- "},
	}
	endingQuotes = []tbRule{
		{`([»”’])`, " $1 "},
		{`''`, " '' "},
		{`"`, " '' "},
		{`([^' ])('[sS]|'[mM]|'[dD]|') `, "$1 $2 "},
		{`([^' ])('ll|'LL|'re|'RE|'ve|'VE|n't|N'T) `, "$1 $2 "},
	}
	// MacIntyre's contractions: CONTRACTIONS2, then CONTRACTIONS3.
	contractions = []tbRule{
		{`(?i)` + wb + `(can)(not)` + we, " $1 $2 "},
		{`(?i)` + wb + `(d)('ye)` + we, " $1 $2 "},
		{`(?i)` + wb + `(gim)(me)` + we, " $1 $2 "},
		{`(?i)` + wb + `(gon)(na)` + we, " $1 $2 "},
		{`(?i)` + wb + `(got)(ta)` + we, " $1 $2 "},
		{`(?i)` + wb + `(lem)(me)` + we, " $1 $2 "},
		{`(?i)` + wb + `(more)('n)` + we, " $1 $2 "},
		{`(?i)` + wb + `(wan)(na)(\s)`, " $1 $2 $3"}, // (?=\s): the space re-emitted
		{`(?i) ('t)(is)` + we, " $1 $2 "},
		{`(?i) ('t)(was)` + we, " $1 $2 "},
	}
)

// wb and we stand for \b before and after a word in the rules above: the
// boundary is checked by hand (boundaryRule), since Go's \b is ASCII.
const (
	wb = `\x00B`
	we = `\x00E`
)

type tbRule struct{ re, with string }

type compiled struct {
	re         *regexp.Regexp
	with       string
	start, end bool // the match must begin / end at a word boundary
}

func compile(rs []tbRule) []compiled {
	out := make([]compiled, len(rs))
	for i, r := range rs {
		c := compiled{with: r.with}
		p := r.re
		if strings.Contains(p, wb) {
			c.start, p = true, strings.Replace(p, wb, "", 1)
		}
		if strings.Contains(p, we) {
			c.end, p = true, strings.Replace(p, we, "", 1)
		}
		c.re = regexp.MustCompile(p)
		out[i] = c
	}
	return out
}

var (
	cStarting     = compile(startingQuotes)
	cPunctuation  = compile(tbPunctuation)
	cParensDashes = compile(parensDashes)
	cEnding       = compile(endingQuotes)
	cContractions = compile(contractions)
)

func isWord(r rune) bool {
	return r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r) || unicode.Is(unicode.Mn, r)
}

// apply is re.sub: matches left to right, none overlapping; a rule with
// word boundaries skips a match that lacks them and tries one position on.
func (c compiled) apply(s string) string {
	if !c.start && !c.end {
		return c.re.ReplaceAllString(s, c.with)
	}
	var b strings.Builder
	pos := 0
	for pos <= len(s) {
		m := c.re.FindStringSubmatchIndex(s[pos:])
		if m == nil {
			break
		}
		lo, hi := pos+m[0], pos+m[1]
		okStart := !c.start || lo == 0 || !isWord(lastRune(s[:lo])) || !isWord(firstRune(s[lo:]))
		okEnd := !c.end || hi == len(s) || !isWord(firstRune(s[hi:])) || !isWord(lastRune(s[:hi]))
		if !okStart || !okEnd {
			// Retry from the next character after this match's start.
			_, size := firstRuneSize(s[lo:])
			b.WriteString(s[pos : lo+size])
			pos = lo + size
			continue
		}
		b.WriteString(s[pos:lo])
		abs := make([]int, len(m))
		for i, v := range m {
			abs[i] = v
			if v >= 0 {
				abs[i] = v + pos
			}
		}
		b.Write(c.re.ExpandString(nil, c.with, s, abs))
		pos = hi
		if hi == lo {
			if hi < len(s) {
				_, size := firstRuneSize(s[hi:])
				b.WriteString(s[hi : hi+size])
				pos = hi + size
			} else {
				break
			}
		}
	}
	if pos < len(s) {
		b.WriteString(s[pos:])
	}
	return b.String()
}

func firstRuneSize(s string) (rune, int) {
	r, size := utf8.DecodeRuneInString(s)
	return r, max(size, 1)
}

func firstRune(s string) rune { r, _ := utf8.DecodeRuneInString(s); return r }

func lastRune(s string) rune { r, _ := utf8.DecodeLastRuneInString(s); return r }

// apostropheClitic is (?i)(')(?!re|ve|ll|m|t|s|d|n)(\w)\b -> \1 \2: an
// apostrophe before a one-letter word that is not a clitic gets a space.
func apostropheClitic(s string) string {
	rs := []rune(s)
	var b strings.Builder
	for i := 0; i < len(rs); i++ {
		b.WriteRune(rs[i])
		if rs[i] != '\'' || i+1 >= len(rs) || !isWord(rs[i+1]) || (i+2 < len(rs) && isWord(rs[i+2])) {
			continue
		}
		rest := strings.ToLower(string(rs[i+1:]))
		if strings.HasPrefix(rest, "re") || strings.HasPrefix(rest, "ve") || strings.HasPrefix(rest, "ll") || strings.ContainsRune("mtsdn", []rune(rest)[0]) {
			continue
		}
		b.WriteString(" ")
	}
	return b.String()
}

// WordTokenize is NLTK's NLTKWordTokenizer (word_tokenize on one sentence).
func WordTokenize(text string) []string {
	for _, c := range cStarting {
		text = c.apply(text)
	}
	text = apostropheClitic(text)
	for _, c := range cPunctuation {
		text = c.apply(text)
	}
	for _, c := range cParensDashes {
		text = c.apply(text)
	}
	text = " " + text + " "
	for _, c := range cEnding {
		text = c.apply(text)
	}
	for _, c := range cContractions {
		text = c.apply(text)
	}
	return strings.Fields(text)
}
