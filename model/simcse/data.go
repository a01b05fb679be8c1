package simcse

import (
	"fmt"
	"math/rand/v2"
	"sort"
	"strings"
)

// The synthetic corpus: facts about invented people, towns, rivers, firms
// and bands, each relation written several ways. Names are built from a
// fixed syllable inventory, so a vocabulary of syllables covers names the
// corpus never showed.

var syllables = strings.Fields("ba bel bor da del dor fa fen gar ka kel kor la len lor ma mar mel na nor pa pel ra ren ros sa sel tor va vel wen za zel an er in on ul ix")

type relation struct {
	name  string
	forms []string // %[1]s subject, %[2]s object
}

var relations = []relation{
	{"born_in", []string{"%[1]s was born in %[2]s.", "%[2]s is the birthplace of %[1]s.", "%[1]s is a native of %[2]s.", "the birthplace of %[1]s is %[2]s."}},
	{"lives_in", []string{"%[1]s lives in %[2]s.", "%[1]s has a home in %[2]s.", "%[2]s is where %[1]s resides."}},
	{"town_in", []string{"%[1]s is a town in %[2]s.", "%[1]s lies in %[2]s.", "the town of %[1]s is located in %[2]s."}},
	{"river", []string{"the %[1]s river flows through %[2]s.", "%[2]s sits on the %[1]s river.", "the %[1]s river runs past %[2]s."}},
	{"founded", []string{"%[2]s was founded by %[1]s.", "%[1]s founded %[2]s.", "the founder of %[2]s is %[1]s."}},
	{"formed", []string{"the band %[1]s formed in %[2]s.", "%[1]s are a group from %[2]s.", "%[2]s is the home town of the band %[1]s."}},
}

// Fact is one relation between two names.
type Fact struct {
	Rel      int
	Sub, Obj string
}

// Text writes the fact with form f (modulo the relation's forms).
func (f Fact) Text(form int) string {
	r := relations[f.Rel]
	s := fmt.Sprintf(r.forms[form%len(r.forms)], f.Sub, f.Obj)
	return strings.ToUpper(s[:1]) + s[1:]
}

// Forms is how many ways the fact's relation is written.
func (f Fact) Forms() int { return len(relations[f.Rel].forms) }

// Generator makes facts, corpora and STS pairs.
type Generator struct{ r *rand.Rand }

// NewGenerator seeds a generator; different seeds give disjoint-looking
// names (held-out sets use another seed).
func NewGenerator(seed uint64) *Generator { return &Generator{rand.New(rand.NewPCG(seed, 0x73696d63))} }

func (g *Generator) name() string {
	n := 2 + g.r.IntN(2)
	var b strings.Builder
	for range n {
		b.WriteString(syllables[g.r.IntN(len(syllables))])
	}
	s := b.String()
	return strings.ToUpper(s[:1]) + s[1:]
}

// Fact draws a fact.
func (g *Generator) Fact() Fact { return Fact{g.r.IntN(len(relations)), g.name(), g.name()} }

// Corpus is n sentences for unsupervised SimCSE: facts in random forms.
func (g *Generator) Corpus(n int) []string {
	out := make([]string, n)
	for i := range out {
		f := g.Fact()
		out[i] = f.Text(g.r.IntN(f.Forms()))
	}
	return out
}

// Triples are n supervised examples: a fact, the same fact written
// another way (entailment), and a contradiction (the same subject and
// relation with another object).
func (g *Generator) Triples(n int) []Example {
	out := make([]Example, n)
	for i := range out {
		f := g.Fact()
		a := g.r.IntN(f.Forms())
		b := (a + 1 + g.r.IntN(f.Forms()-1)) % f.Forms()
		neg := f
		neg.Obj = g.name()
		out[i] = Example{f.Text(a), f.Text(b), neg.Text(a)}
	}
	return out
}

// STS draws n graded pairs: 5 the same fact written another way, 3 the
// same subject and relation with another object, 2 the same subject in
// another relation, 1 the same wording about other names, 0 unrelated.
func (g *Generator) STS(n int) []Pair {
	out := make([]Pair, n)
	for i := range out {
		f := g.Fact()
		a := g.r.IntN(f.Forms())
		other := (a + 1 + g.r.IntN(f.Forms()-1)) % f.Forms()
		var p Pair
		switch score := i % 5; score {
		case 0:
			p = Pair{f.Text(a), f.Text(other), 5}
		case 1:
			h := f
			h.Obj = g.name()
			p = Pair{f.Text(a), h.Text(other), 3}
		case 2:
			h := g.Fact()
			for h.Rel == f.Rel {
				h = g.Fact()
			}
			h.Sub = f.Sub
			p = Pair{f.Text(a), h.Text(g.r.IntN(h.Forms())), 2}
		case 3:
			h := Fact{f.Rel, g.name(), g.name()}
			p = Pair{f.Text(a), h.Text(a), 1}
		case 4:
			h := g.Fact()
			for h.Rel == f.Rel {
				h = g.Fact()
			}
			p = Pair{f.Text(a), h.Text(g.r.IntN(h.Forms())), 0}
		}
		out[i] = p
	}
	return out
}

// Vocab is a WordPiece vocabulary for a corpus: BERT's specials, the
// words the corpus uses at least minCount times (lowercased, punctuation
// apart), every syllable as a word start and as a continuation, and single
// characters, so any name is covered.
func Vocab(corpus []string, minCount int) []string {
	v := []string{"[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"}
	seen := map[string]bool{}
	add := func(s string) {
		if !seen[s] {
			seen[s] = true
			v = append(v, s)
		}
	}
	count := map[string]int{}
	var order []string
	for _, line := range corpus {
		for _, w := range strings.FieldsFunc(strings.ToLower(line), func(r rune) bool {
			return r == ' ' || r == '.' || r == ',' || r == '?' || r == '!' || r == '\'' || r == '"'
		}) {
			if count[w] == 0 {
				order = append(order, w)
			}
			count[w]++
		}
	}
	for _, p := range strings.Split(".,?!'\"-()", "") {
		add(p)
	}
	for _, w := range order {
		if count[w] >= minCount {
			add(w)
		}
	}
	// Frequent word starts and continuations (2 to 5 characters), a crude
	// WordPiece training: names the corpus never showed whole still split
	// into pieces seen often, not into single letters.
	pieces := map[string]int{}
	for w, c := range count {
		rs := []rune(w)
		for lo := range rs {
			for n := 2; n <= 5 && lo+n <= len(rs); n++ {
				p := string(rs[lo : lo+n])
				if lo > 0 {
					p = "##" + p
				}
				pieces[p] += c
			}
		}
	}
	var cands []string
	for p, c := range pieces {
		if c >= 5*minCount {
			cands = append(cands, p)
		}
	}
	sort.Slice(cands, func(i, j int) bool {
		if pieces[cands[i]] != pieces[cands[j]] {
			return pieces[cands[i]] > pieces[cands[j]]
		}
		return cands[i] < cands[j]
	})
	for _, p := range cands[:min(len(cands), 3000)] {
		add(p)
	}
	for _, s := range syllables {
		add(s)
		add("##" + s)
	}
	for c := 'a'; c <= 'z'; c++ {
		add(string(c))
		add("##" + string(c))
	}
	for c := '0'; c <= '9'; c++ {
		add(string(c))
		add("##" + string(c))
	}
	return v
}
