package tokenizer

import (
	"unicode"
)

// PreTokenize cuts text as Qwen's pre-tokenizer regex does:
//
//	(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
//
// Go's regexp has no lookahead, so the alternation is walked by hand, first
// alternative that matches wins, each as greedy as the regex. \s follows
// JavaScript's definition, as the reference implementation does.
func PreTokenize(text string) []string { return split(text, matchAt) }

// split cuts text into the pre-tokens match finds, each starting where the
// last ended.
func split(text string, match func(rs []rune, i int) int) []string {
	var out []string
	rs := []rune(text)
	for i := 0; i < len(rs); {
		n := match(rs, i)
		out = append(out, string(rs[i:i+n]))
		i += n
	}
	return out
}

func isSpace(r rune) bool {
	switch r {
	case '\t', '\n', '\v', '\f', '\r', ' ', 0xA0, 0x1680, 0x2028, 0x2029, 0x202F, 0x205F, 0x3000, 0xFEFF:
		return true
	}
	return r >= 0x2000 && r <= 0x200A
}

func isLetter(r rune) bool { return unicode.IsLetter(r) }
func isNumber(r rune) bool { return unicode.IsNumber(r) }
func isNL(r rune) bool     { return r == '\r' || r == '\n' }

// matchAt returns the length in runes of the pre-token starting at i (>= 1).
func matchAt(rs []rune, i int) int {
	n := len(rs)
	// 1. contractions, case-insensitive
	if rs[i] == '\'' && i+1 < n {
		c := unicode.ToLower(rs[i+1])
		if c == 's' || c == 't' || c == 'm' || c == 'd' {
			return 2
		}
		if i+2 < n {
			c2 := unicode.ToLower(rs[i+2])
			if (c == 'r' && c2 == 'e') || (c == 'v' && c2 == 'e') || (c == 'l' && c2 == 'l') {
				return 3
			}
		}
	}
	// 2. [^\r\n\p{L}\p{N}]?\p{L}+
	j := i
	if !isNL(rs[j]) && !isLetter(rs[j]) && !isNumber(rs[j]) && j+1 < n && isLetter(rs[j+1]) {
		j++
	}
	if isLetter(rs[j]) {
		for j < n && isLetter(rs[j]) {
			j++
		}
		return j - i
	}
	// 3. \p{N}
	if isNumber(rs[i]) {
		return 1
	}
	// 4.  ?[^\s\p{L}\p{N}]+[\r\n]*
	if j, k := punctRun(rs, i); k > j {
		for k < n && isNL(rs[k]) {
			k++
		}
		return k - i
	}
	// Whitespace alternatives: W is the maximal run of spaces at i.
	w := i
	for w < n && isSpace(rs[w]) {
		w++
	}
	if w == i {
		// Unreachable for valid input (every rune is a letter, number,
		// space or other); keep the walk moving.
		return 1
	}
	// 5. \s*[\r\n]+ : up to and including the last newline in W.
	for k := w - 1; k >= i; k-- {
		if isNL(rs[k]) {
			return k + 1 - i
		}
	}
	// 6. \s+(?!\S) : all of W at the end of text, else W less its last rune.
	if w == n {
		return w - i
	}
	if w-i >= 2 {
		return w - 1 - i
	}
	// 7. \s+
	return w - i
}

// PreTokenizeGPT2 cuts text as the GPT-2 / RoBERTa ByteLevel
// pre-tokenizer's regex does:
//
//	's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
func PreTokenizeGPT2(text string) []string { return split(text, matchGPT2) }

func matchGPT2(rs []rune, i int) int {
	n := len(rs)
	// contractions, lowercase only
	if rs[i] == '\'' && i+1 < n {
		switch rs[i+1] {
		case 's', 't', 'm', 'd':
			return 2
		}
		if i+2 < n {
			if p := string(rs[i+1 : i+3]); p == "re" || p == "ve" || p == "ll" {
				return 3
			}
		}
	}
	// " ?\p{L}+" then " ?\p{N}+"
	for _, class := range []func(rune) bool{isLetter, isNumber} {
		j := i
		if rs[j] == ' ' && j+1 < n && class(rs[j+1]) {
			j++
		}
		if class(rs[j]) {
			for j < n && class(rs[j]) {
				j++
			}
			return j - i
		}
	}
	// " ?[^\s\p{L}\p{N}]+"
	if j, k := punctRun(rs, i); k > j {
		return k - i
	}
	// "\s+(?!\S)" then "\s+"
	w := i
	for w < n && isSpace(rs[w]) {
		w++
	}
	switch {
	case w == i:
		return 1
	case w == n:
		return w - i
	case w-i >= 2:
		return w - 1 - i
	}
	return w - i
}

// punctRun matches " ?[^\s\p{L}\p{N}]+" at i: the run is rs[j:k], after
// an optional space (k == j: no match).
func punctRun(rs []rune, i int) (j, k int) {
	j = i
	if rs[j] == ' ' {
		j++
	}
	k = j
	for k < len(rs) && !isSpace(rs[k]) && !isLetter(rs[k]) && !isNumber(rs[k]) {
		k++
	}
	return j, k
}

// WordsPattern is the pre-tokenizer regex PreTokenizeWords implements: a
// word keeps the space after it rather than the one before, so it is cut
// the same after a space, a quote or a tag. A small model that copies
// names from its context into tool calls and answers ("content":
// "Gamair ..." from "By the way, Gamair ...") then copies the same token
// ids, which it can learn with one induction circuit; under Qwen's regex
// the first word of a copy is a different token sequence from its source.
// Digits are cut one at a time, as Qwen's regex cuts them: ten frequent
// tokens, where whole numbers are some hundred rare ones a tiny model
// confuses (it stored "born in 1969" as "1973").
const WordsPattern = `\p{L}+ ?|\p{N}|[^\s\p{L}\p{N}]+|\s+`

// WordsRunsPattern is WordsPattern as it was before digits were cut one at
// a time (a number a token, with its trailing space); tokenizers trained
// with it load and cut text as they did.
const WordsRunsPattern = `\p{L}+ ?|\p{N}+ ?|[^\s\p{L}\p{N}]+|\s+`

// PreTokenizeWords cuts text as WordsPattern does.
func PreTokenizeWords(text string) []string {
	return split(text, func(rs []rune, i int) int { return matchWords(rs, i, false) })
}

// NamesPattern is WordsPattern except that a word that starts with a
// capital keeps no space after it: a name is then the same tokens wherever
// it stands, before a space, a full stop or a tag as after one. Under
// WordsPattern the last piece of "Wemound" differs between "Pebrond
// Wemound is a composer" (a memory) and "Pebrond Wemound</answer>" (the
// answer), so copying a person's surname into an answer was a mapping to
// learn, not a copy; the tiny policy got the first name right and made up
// the surname. Lower-case words, the common vocabulary, keep their space,
// so text costs few more tokens.
const NamesPattern = `\p{Lu}\p{L}*|\p{L}+ ?|\p{N}|[^\s\p{L}\p{N}]+|\s+`

// PreTokenizeNames cuts text as NamesPattern does.
func PreTokenizeNames(text string) []string {
	return split(text, func(rs []rune, i int) int {
		if unicode.IsUpper(rs[i]) {
			j := i + 1
			for j < len(rs) && isLetter(rs[j]) {
				j++
			}
			return j - i
		}
		return matchWords(rs, i, false)
	})
}

// patterns maps each pre-tokenizer regex this package implements to its
// cutter, for training a tokenizer and for loading one.
var patterns = map[string]func(string) []string{
	QwenPattern:      PreTokenize,
	WordsPattern:     PreTokenizeWords,
	WordsRunsPattern: preTokenizeWordsRuns,
	NamesPattern:     PreTokenizeNames,
}

// preTokenizeWordsRuns cuts text as WordsRunsPattern does.
func preTokenizeWordsRuns(text string) []string {
	return split(text, func(rs []rune, i int) int { return matchWords(rs, i, true) })
}

func matchWords(rs []rune, i int, numberRuns bool) int {
	n := len(rs)
	if isNumber(rs[i]) && !numberRuns {
		return 1
	}
	for _, class := range []func(rune) bool{isLetter, isNumber} {
		if class(rs[i]) {
			j := i
			for j < n && class(rs[j]) {
				j++
			}
			if j < n && rs[j] == ' ' {
				j++
			}
			return j - i
		}
	}
	j := i
	if isSpace(rs[i]) {
		for j < n && isSpace(rs[j]) {
			j++
		}
		return j - i
	}
	for j < n && !isSpace(rs[j]) && !isLetter(rs[j]) && !isNumber(rs[j]) {
		j++
	}
	return j - i
}
