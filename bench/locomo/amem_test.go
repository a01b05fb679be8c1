package locomo

import (
	"encoding/json"
	"math"
	"math/rand/v2"
	"os"
	"os/exec"
	"strings"
	"testing"
)

// TestAMemMetrics: A-Mem's F1 and BLEU-1 on hand-worked pairs.
func TestAMemMetrics(t *testing.T) {
	// Set F1: "the cat the dog" vs "the dog": sets {the, cat, dog} and {the, dog}: P 2/3, R 1.
	if f := AMemF1("The cat the dog.", "the dog"); math.Abs(f-0.8) > 1e-12 {
		t.Errorf("F1 %v, want 0.8", f)
	}
	if AMemF1("", "x") != 0 || AMemF1("x", " ") != 0 || AMemF1("a", "b") != 0 {
		t.Error("empty or disjoint sides score 0")
	}
	// BLEU-1: hypothesis "paris france" (2 tokens), reference "paris" (1):
	// longer than the reference, no penalty; 1 of 2 unigrams match.
	if b := BLEU1("Paris France", "Paris"); math.Abs(b-0.5) > 1e-12 {
		t.Errorf("BLEU-1 %v, want 0.5", b)
	}
	// Shorter than the reference: penalty exp(1 - 3/1), precision 1.
	if b := BLEU1("Paris", "in Paris France"); math.Abs(b-math.Exp(-2)) > 1e-12 {
		t.Errorf("BLEU-1 %v, want e^-2", b)
	}
	// Clipping: "the the the" against "the cat": one "the" counts; longer
	// than the reference, no penalty; precision 1/3.
	if b := BLEU1("the the the", "the cat"); math.Abs(b-1.0/3) > 1e-12 {
		t.Errorf("BLEU-1 %v, want 1/3", b)
	}
	if BLEU1("dog", "cat") != 0 || BLEU1("", "cat") != 0 {
		t.Error("no match or an empty prediction scores 0")
	}
	if got := strings.Join(WordTokenize(`She said "I can't go," then left (at 3:30). Isn't it?`), " "); got != "She said `` I ca n't go , '' then left ( at 3:30 ) . Is n't it ?" {
		t.Errorf("tokens %q", got)
	}
}

// TestWordTokenizeMatchesNLTK holds WordTokenize to NLTK's
// NLTKWordTokenizer and BLEU1 to its sentence_bleu (weights (1,0,0,0),
// smoothing method 1) when a Python with NLTK is installed (Debian's
// python3-nltk; .ci/run installs it): every line of this repository's
// README, strings built to reach each rule, and random answer pairs.
func TestWordTokenizeMatchesNLTK(t *testing.T) {
	py := "/usr/bin/python3"
	if err := exec.Command(py, "-c", "import nltk").Run(); err != nil {
		t.Skip("no Python with NLTK (apt-get install python3-nltk)")
	}
	var texts []string
	raw, _ := os.ReadFile("../../README.md")
	for _, l := range strings.Split(string(raw), "\n") {
		if l = strings.TrimSpace(l); l != "" {
			texts = append(texts, l)
		}
	}
	texts = append(texts, `"Hello," he said.`, "I can't, won't, shouldn't; 'tis true 'twas so.", "gonna wanna gimme lemme gotta cannot d'ye more'n",
		"wanna\tgo", "I'm you're we'll he'd they've O'Neil 'a 'b 'x' rock 'n' roll", "«quoted» “curly” ‘single’ „low“", "``twice'' and ''",
		"a--b -- c---d", "Good muffins cost $3.88 (roughly 3,36 euros) in New York.", "Wait... what?! Yes!!", "ratio 3:2, time 10:30, x:y",
		"tags <a> [b] {c}", "end with quote.'", "end with paren.)", "a @b #c %d &e *f", "naïve café résumé's", "it's 1,000,000", "Mr. Smith went.")
	r := rand.New(rand.NewPCG(4, 4))
	words := strings.Fields("the a paris france 2023 may she he went to cat dog , . 's n't")
	var pairs [][2]string
	for range 300 {
		mk := func() string {
			n := 1 + r.IntN(6)
			var w []string
			for range n {
				w = append(w, words[r.IntN(len(words))])
			}
			return strings.Join(w, " ")
		}
		pairs = append(pairs, [2]string{mk(), mk()})
	}
	in, _ := json.Marshal(map[string]any{"texts": texts, "pairs": pairs})
	cmd := exec.Command(py, "-c", `import json, sys
from nltk.tokenize import NLTKWordTokenizer
from nltk.translate.bleu_score import sentence_bleu, SmoothingFunction
d = json.load(sys.stdin)
tok = NLTKWordTokenizer()
sm = SmoothingFunction().method1
out = {"tokens": [tok.tokenize(t) for t in d["texts"]],
       "bleu": [sentence_bleu([tok.tokenize(g.lower())], tok.tokenize(p.lower()), weights=(1, 0, 0, 0), smoothing_function=sm) for p, g in d["pairs"]]}
print(json.dumps(out))`)
	cmd.Stdin = strings.NewReader(string(in))
	out, err := cmd.Output()
	if err != nil {
		t.Fatal(err)
	}
	var want struct {
		Tokens [][]string `json:"tokens"`
		BLEU   []float64  `json:"bleu"`
	}
	if err := json.Unmarshal(out, &want); err != nil {
		t.Fatal(err)
	}
	bad := 0
	for i, text := range texts {
		if got := WordTokenize(text); strings.Join(got, "\x00") != strings.Join(want.Tokens[i], "\x00") {
			bad++
			if bad <= 8 {
				t.Errorf("%q:\n ours %q\n NLTK %q", text, got, want.Tokens[i])
			}
		}
	}
	for i, p := range pairs {
		if got := BLEU1(p[0], p[1]); math.Abs(got-want.BLEU[i]) > 1e-9 {
			bad++
			if bad <= 12 {
				t.Errorf("BLEU1(%q, %q) = %v, NLTK %v", p[0], p[1], got, want.BLEU[i])
			}
		}
	}
	t.Logf("%d texts, %d answer pairs; %d differ from NLTK", len(texts), len(pairs), bad)
}
