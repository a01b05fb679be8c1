package env

import (
	"fmt"
	"math/rand/v2"
	"strings"
)

// Synth generates HotpotQA-format two-hop questions about fictional
// entities: bridge questions (the answer needs a fact about an entity named
// in another fact) and comparison questions (two facts compared). Every
// question comes with four distractor paragraphs that reuse the names and
// words of its facts, so that shallow matching is misled. The same seed
// gives the same file.
type Synth struct {
	r    *rand.Rand
	used map[string]bool
}

// NewSynth returns a generator seeded with seed.
func NewSynth(seed uint64) *Synth { return NewSynthStream(seed, 0x73796e74) }

// NewSynthStream returns a generator on another random stream: whatever
// its seed, it draws none of the task files NewSynth's seeds give (copy
// pretraining draws its sentences from one, so that no held-out task file
// is ever trained on).
func NewSynthStream(seed, stream uint64) *Synth {
	return &Synth{r: rand.New(rand.NewPCG(seed, stream)), used: map[string]bool{}}
}

// Sentences are the sentences of a record's paragraphs.
func (rec HotpotRecord) Sentences() []string {
	var out []string
	for _, c := range rec.Context {
		if sents, ok := c[1].([]string); ok {
			out = append(out, sents...)
		}
	}
	return out
}

var (
	onsets  = []string{"b", "br", "d", "f", "g", "gr", "h", "k", "l", "m", "n", "p", "qu", "r", "s", "st", "t", "tr", "v", "w", "z"}
	vowels  = []string{"a", "e", "i", "o", "u", "ai", "ea", "ou", "y"}
	codas   = []string{"", "", "n", "r", "l", "s", "th", "m", "x", "nd"}
	citySfx = []string{"ford", "holm", "stead", "mere", "wick", "dale", "port", "burg"}
	landSfx = []string{"ia", "land", "mark", "ovia"}
	coSfx   = []string{"Industries", "Works", "Labs", "Trading Company"}
	bandSfx = []string{"Collective", "Orchestra", "Quartet", "Brothers"}
	profs   = []string{"painter", "botanist", "composer", "architect", "novelist", "chemist", "sculptor", "cartographer"}
	trades  = []string{"shipbuilding", "textile", "software", "glassmaking", "mining", "publishing"}
	genres  = []string{"folk", "jazz", "post-rock", "synth-pop", "bluegrass", "choral"}
	known   = []string{"a series of lakeside studies", "an unfinished atlas", "a long-running radio programme", "two award-winning collections", "a controversial manifesto"}
)

func title(s string) string { return strings.ToUpper(s[:1]) + s[1:] }

func (g *Synth) pick(xs []string) string { return xs[g.r.IntN(len(xs))] }

func (g *Synth) word(syl int) string {
	var b strings.Builder
	for range syl {
		b.WriteString(g.pick(onsets) + g.pick(vowels))
	}
	b.WriteString(g.pick(codas))
	return title(b.String())
}

// fresh returns a name not used before in this generator's output. A
// family of look-alike names can run out (a town stem has eight suffixes),
// so after a few tries a name is drawn from fallback instead.
func (g *Synth) fresh(make func() string) string {
	return g.freshOr(make, nil)
}

func (g *Synth) freshOr(make, fallback func() string) string {
	for try := 0; ; try++ {
		if try == 32 && fallback != nil {
			make = fallback
		}
		if s := make(); !g.used[s] {
			g.used[s] = true
			return s
		}
	}
}

func (g *Synth) person() string {
	return g.fresh(func() string { return g.word(2) + " " + g.word(2) })
}

// personLike shares the first or the last name of p.
func (g *Synth) personLike(p string) string {
	first, last, _ := strings.Cut(p, " ")
	return g.freshOr(func() string {
		if g.r.IntN(2) == 0 {
			return first + " " + g.word(2)
		}
		return g.word(2) + " " + last
	}, func() string { return g.word(2) + " " + g.word(2) })
}

func (g *Synth) city() string {
	return g.fresh(func() string { return g.word(1+g.r.IntN(2)) + g.pick(citySfx) })
}

// cityLike shares the stem of c with another suffix.
func (g *Synth) cityLike(c string) string {
	for _, s := range citySfx {
		if stem, ok := strings.CutSuffix(c, s); ok {
			return g.freshOr(func() string { return stem + g.pick(citySfx) }, func() string { return g.word(2) + g.pick(citySfx) })
		}
	}
	return g.city()
}

func (g *Synth) country() string {
	return g.fresh(func() string { return g.word(2) + g.pick(landSfx) })
}

func (g *Synth) company() string {
	return g.fresh(func() string { return g.word(2) + " " + g.pick(coSfx) })
}

func (g *Synth) band() string {
	return g.fresh(func() string { return "The " + g.word(2) + " " + g.pick(bandSfx) })
}

func (g *Synth) river() string {
	return g.fresh(func() string { return g.word(2) + " River" })
}

func (g *Synth) year() int { return 1820 + g.r.IntN(180) }

type paragraph struct {
	title string
	sents []string // sents[0] is the fact a question may need
}

func (g *Synth) bornIn(p, city string) paragraph {
	return paragraph{p, []string{
		fmt.Sprintf("%s is a %s who was born in %s.", p, g.pick(profs), city),
		fmt.Sprintf("%s is best known for %s.", p, g.pick(known)),
	}}
}

func (g *Synth) bornYear(p string, y int) paragraph {
	return paragraph{p, []string{
		fmt.Sprintf("%s is a %s born in %d.", p, g.pick(profs), y),
		fmt.Sprintf("%s is best known for %s.", p, g.pick(known)),
	}}
}

func (g *Synth) cityIn(city, country string) paragraph {
	return paragraph{city, []string{
		fmt.Sprintf("%s is a town in %s.", city, country),
		fmt.Sprintf("%s has a population of about %d people.", city, 2000+g.r.IntN(90000)),
	}}
}

func (g *Synth) cityRiver(city, river string) paragraph {
	return paragraph{city, []string{
		fmt.Sprintf("The %s flows through %s.", river, city),
		fmt.Sprintf("%s was granted a market charter in %d.", city, g.year()),
	}}
}

func (g *Synth) founded(co, p string) paragraph {
	return paragraph{co, []string{
		fmt.Sprintf("%s is a %s firm founded by %s.", co, g.pick(trades), p),
		fmt.Sprintf("%s employs around %d people.", co, 50+g.r.IntN(5000)),
	}}
}

func (g *Synth) foundedYear(co string, y int) paragraph {
	return paragraph{co, []string{
		fmt.Sprintf("%s is a %s firm founded in %d.", co, g.pick(trades), y),
		fmt.Sprintf("%s employs around %d people.", co, 50+g.r.IntN(5000)),
	}}
}

func (g *Synth) formedIn(band, city string) paragraph {
	return paragraph{band, []string{
		fmt.Sprintf("%s are a %s group formed in %s.", band, g.pick(genres), city),
		fmt.Sprintf("%s released their first record in %d.", band, g.year()),
	}}
}

// distinctYears returns two different years.
func (g *Synth) distinctYears() (int, int) {
	a := g.year()
	for {
		if b := g.year(); b != a {
			return a, b
		}
	}
}

// Next generates one task record.
func (g *Synth) Next(id int) HotpotRecord {
	var gold [2]paragraph
	var q, a, typ string
	var dis []paragraph
	switch g.r.IntN(6) {
	case 0: // bridge: person -> birthplace -> country
		p, c, land := g.person(), g.city(), g.country()
		gold = [2]paragraph{g.bornIn(p, c), g.cityIn(c, land)}
		q, a, typ = fmt.Sprintf("In which country was %s born?", p), land, "bridge"
		p2 := g.personLike(p)
		c2 := g.cityLike(c)
		dis = []paragraph{g.bornIn(p2, c2), g.cityIn(c2, g.country()), g.bornIn(g.personLike(p), g.city()), g.cityIn(g.cityLike(c), g.country())}
	case 1: // bridge: company -> founder -> birth year
		co, p, y := g.company(), g.person(), g.year()
		gold = [2]paragraph{g.founded(co, p), g.bornYear(p, y)}
		q, a, typ = fmt.Sprintf("In what year was the founder of %s born?", co), fmt.Sprint(y), "bridge"
		p2 := g.personLike(p)
		dis = []paragraph{g.founded(g.company(), p2), g.bornYear(p2, g.year()), g.bornYear(g.personLike(p), g.year()), g.foundedYear(g.company(), g.year())}
	case 2: // bridge: band -> city -> river
		b, c, rv := g.band(), g.city(), g.river()
		gold = [2]paragraph{g.formedIn(b, c), g.cityRiver(c, rv)}
		q, a, typ = fmt.Sprintf("Which river flows through the town where %s were formed?", b), rv, "bridge"
		c2 := g.cityLike(c)
		dis = []paragraph{g.formedIn(g.band(), c2), g.cityRiver(c2, g.river()), g.cityRiver(g.cityLike(c), g.river()), g.cityIn(c, g.country())}
	case 3: // comparison: birth years
		p1, p2 := g.person(), g.person()
		y1, y2 := g.distinctYears()
		gold = [2]paragraph{g.bornYear(p1, y1), g.bornYear(p2, y2)}
		q, typ = fmt.Sprintf("Who was born first, %s or %s?", p1, p2), "comparison"
		a = p1
		if y2 < y1 {
			a = p2
		}
		dis = []paragraph{g.bornYear(g.personLike(p1), g.year()), g.bornYear(g.personLike(p2), g.year()), g.bornIn(g.personLike(p1), g.city()), g.bornIn(g.personLike(p2), g.city())}
	case 4: // comparison: founding years
		c1, c2 := g.company(), g.company()
		y1, y2 := g.distinctYears()
		gold = [2]paragraph{g.foundedYear(c1, y1), g.foundedYear(c2, y2)}
		q, typ = fmt.Sprintf("Which was founded earlier, %s or %s?", c1, c2), "comparison"
		a = c1
		if y2 < y1 {
			a = c2
		}
		dis = []paragraph{g.foundedYear(g.company(), g.year()), g.foundedYear(g.company(), g.year()), g.founded(c1, g.person()), g.founded(c2, g.person())}
	default: // comparison, yes/no: same country?
		c1, c2, land := g.city(), g.city(), g.country()
		land2 := land
		if g.r.IntN(2) == 0 {
			land2 = g.country()
		}
		gold = [2]paragraph{g.cityIn(c1, land), g.cityIn(c2, land2)}
		q, typ = fmt.Sprintf("Are %s and %s in the same country?", c1, c2), "comparison"
		a = "no"
		if land == land2 {
			a = "yes"
		}
		dis = []paragraph{g.cityIn(g.cityLike(c1), g.country()), g.cityIn(g.cityLike(c2), land), g.cityRiver(g.cityLike(c1), g.river()), g.cityRiver(g.cityLike(c2), g.river())}
	}
	// A distractor about a gold entity needs its own title: titles key the
	// supporting facts.
	titles := map[string]bool{gold[0].title: true, gold[1].title: true}
	for i := range dis {
		for titles[dis[i].title] {
			dis[i].title += " (other)"
		}
		titles[dis[i].title] = true
	}
	all := append([]paragraph{gold[0], gold[1]}, dis...)
	g.r.Shuffle(len(all), func(i, j int) { all[i], all[j] = all[j], all[i] })
	rec := HotpotRecord{
		ID:       fmt.Sprintf("synth-%06d", id),
		Question: q, Answer: a, Type: typ,
		Level:           []string{"easy", "medium", "hard"}[g.r.IntN(3)],
		SupportingFacts: [][]any{{gold[0].title, 0}, {gold[1].title, 0}},
	}
	for _, p := range all {
		rec.Context = append(rec.Context, []any{p.title, p.sents})
	}
	return rec
}

// Generate returns n records.
func (g *Synth) Generate(n int) []HotpotRecord {
	out := make([]HotpotRecord, n)
	for i := range out {
		out[i] = g.Next(i)
	}
	return out
}
