package locomo

import (
	"encoding/json"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"testing"
)

// TestStemHandWorked: the paper's examples and NLTK's extensions, worked
// by hand from the rules.
func TestStemHandWorked(t *testing.T) {
	for word, want := range map[string]string{
		"caresses": "caress", "ponies": "poni", "ties": "tie", "caress": "caress", "cats": "cat",
		"feed": "feed", "agreed": "agre", "plastered": "plaster", "bled": "bled", "motoring": "motor", "sing": "sing",
		"conflated": "conflat", "troubled": "troubl", "sized": "size", "hopping": "hop", "tanned": "tan",
		"falling": "fall", "hissing": "hiss", "fizzed": "fizz", "failing": "fail", "filing": "file",
		"happy": "happi", "sky": "sky", "enjoy": "enjoy", "relational": "relat", "conditional": "condit",
		"generalization": "gener", "running": "run", "flies": "fli", "dies": "die", "dying": "die",
		"was": "wa", "oslo": "oslo", "Oslo": "oslo", "is": "is", "a": "a", "spied": "spi", "died": "die",
		"archaeology": "archaeolog", "skies": "sky", "news": "news", "hopefully": "hope", "electrical": "electr",
	} {
		if got := Stem(word); got != want {
			t.Errorf("Stem(%q) = %q, want %q", word, got, want)
		}
	}
}

// TestStemMatchesNLTK holds Stem to NLTK's PorterStemmer (the one LoCoMo's
// scorer imports) on every word of this repository's README and on words
// built to reach each rule, when a Python with NLTK is installed (Debian's
// python3-nltk; .ci/run installs it).
func TestStemMatchesNLTK(t *testing.T) {
	py := "/usr/bin/python3"
	if err := exec.Command(py, "-c", "import nltk").Run(); err != nil {
		t.Skip("no Python with NLTK (apt-get install python3-nltk)")
	}
	seen := map[string]bool{}
	var words []string
	add := func(w string) {
		if w != "" && !seen[w] {
			seen[w] = true
			words = append(words, w)
		}
	}
	raw, _ := os.ReadFile("../../README.md")
	for _, w := range regexp.MustCompile(`[\p{L}\p{N}]+`).FindAllString(string(raw), -1) {
		add(w)
	}
	stems := []string{"relat", "condit", "valen", "hesit", "digit", "conform", "radic", "differ", "vile", "analog",
		"vietnam", "predic", "electr", "hope", "good", "format", "sensit", "sensibl", "triplic", "formal", "crim",
		"hop", "tann", "fil", "fail", "sky", "tr", "y", "bay", "oat", "ivy", "oe", "ey", "syzyg", "geo", "theo", "lov"}
	suffixes := []string{"", "s", "es", "ies", "ied", "ed", "eed", "ing", "ational", "tional", "enci", "anci", "izer",
		"bli", "abli", "alli", "entli", "eli", "ousli", "ization", "ation", "ator", "alism", "iveness", "fulness",
		"ousness", "aliti", "iviti", "biliti", "fulli", "logi", "icate", "ative", "alize", "iciti", "ical", "ful",
		"ness", "al", "ance", "ence", "er", "ic", "able", "ible", "ant", "ement", "ment", "ent", "sion", "tion",
		"ou", "ism", "ate", "iti", "ous", "ive", "ize", "e", "ll", "y", "ly", "ally", "fully", "tionally"}
	for _, s := range stems {
		for _, x := range suffixes {
			add(s + x)
		}
	}
	in, _ := json.Marshal(words)
	cmd := exec.Command(py, "-c", `import json, sys
from nltk.stem import PorterStemmer
ps = PorterStemmer()
print(json.dumps([ps.stem(w) for w in json.load(sys.stdin)]))`)
	cmd.Stdin = strings.NewReader(string(in))
	out, err := cmd.Output()
	if err != nil {
		t.Fatal(err)
	}
	var want []string
	if err := json.Unmarshal(out, &want); err != nil {
		t.Fatal(err)
	}
	bad := 0
	for i, w := range words {
		if got := Stem(w); got != want[i] {
			bad++
			if bad <= 10 {
				t.Errorf("Stem(%q) = %q, NLTK %q", w, got, want[i])
			}
		}
	}
	t.Logf("%d words, %d differ from NLTK", len(words), bad)
}
