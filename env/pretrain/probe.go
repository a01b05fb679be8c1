package pretrain

import (
	"fmt"
	"math/rand/v2"
	"strings"

	"github.com/agemem/agemem/env"
	"github.com/agemem/agemem/model/tokenizer"
)

// Verdicts is a model's teacher-forced accuracy on the reasoning teacher's
// "which was earlier" comparisons, each in the QA format pretraining
// teaches (pretrain.qa with pretrain.reason): the facts among distractor
// sentences, the question, then "<think>1905: Trugith Works. 1838: Wipynd
// Labs. The earlier is 1838: Wipynd Labs.</think>". At every position the
// model sees the teacher's tokens before it, so each step is scored on
// its own: restating the options, writing the earlier year, and the
// step the tiny policies fail, picking which name to copy after it.
type Verdicts struct {
	Tasks int // "which was earlier" questions probed
	// Year counts verdicts whose every year digit is the likeliest token.
	Year int
	// Name counts verdicts whose name's first token is the likeliest;
	// Other those where the other option's first token is instead.
	Name, Other int
	// Later and LaterN: the name's later tokens right, of all.
	Later, LaterN int
	// Listing and ListingN: the restated options' tokens right, of all.
	Listing, ListingN int
}

func (v Verdicts) String() string {
	return fmt.Sprintf("%d which-was-earlier questions: verdict year right %d, the name's first token right %d (the other option's %d), the name's later tokens %.3f, the restated options' tokens %.3f",
		v.Tasks, v.Year, v.Name, v.Other, ratio(v.Later, v.LaterN), ratio(v.Listing, v.ListingN))
}

func ratio(a, n int) float64 {
	if n == 0 {
		return 0
	}
	return float64(a) / float64(n)
}

// Forwarder returns the logits [len(ids) × vocab] of a sequence.
type Forwarder func(ids []int) ([]float32, error)

// ProbeVerdicts scores forward on the "which was earlier" questions among
// tasks (the others are skipped), their distractors drawn with seed.
func ProbeVerdicts(forward Forwarder, tok *tokenizer.Tokenizer, tasks []env.Task, seed uint64) (Verdicts, error) {
	var v Verdicts
	r := rand.New(rand.NewPCG(seed, 0x7665726469637473))
	for _, t := range tasks {
		s, ok := verdictSpans(r, tok, t)
		if !ok {
			continue
		}
		logits, err := forward(s.ids)
		if err != nil {
			return v, fmt.Errorf("task %s: %w", t.ID, err)
		}
		vocab := len(logits) / len(s.ids)
		// likeliest is the model's prediction of token i.
		likeliest := func(i int) int {
			row := logits[(i-1)*vocab : i*vocab]
			best := 0
			for j, x := range row {
				if x > row[best] {
					best = j
				}
			}
			return best
		}
		v.Tasks++
		year := true
		for i := s.year; i < s.name; i++ {
			year = year && likeliest(i) == s.ids[i]
		}
		if year {
			v.Year++
		}
		switch likeliest(s.name) {
		case s.ids[s.name]:
			v.Name++
		case s.other:
			v.Other++
		}
		for i := s.name + 1; i < s.end; i++ {
			v.LaterN++
			if likeliest(i) == s.ids[i] {
				v.Later++
			}
		}
		for i := s.list; i < s.verdict; i++ {
			v.ListingN++
			if likeliest(i) == s.ids[i] {
				v.Listing++
			}
		}
	}
	if v.Tasks == 0 {
		return v, fmt.Errorf("no \"which was earlier\" question with both years among %d tasks", len(tasks))
	}
	return v, nil
}

// spans are the token positions of one probed sequence: the restated
// options [list, verdict), the verdict's year [year, name), its name
// [name, end), and other, the first token of the option not chosen.
type spans struct {
	ids                                   []int
	list, verdict, year, name, end, other int
}

// verdictSpans builds t's QA sequence as Sequences does (each line
// tokenized on its own) and finds the spans in it; ok is false for tasks
// the teacher does not reason a year comparison for.
func verdictSpans(r *rand.Rand, tok *tokenizer.Tokenizer, t env.Task) (spans, bool) {
	lines := qaLines(r, t)
	ans, ok := env.Reasoning(t, strings.Join(lines, "\n"))
	if !ok || !strings.Contains(ans, "The earlier is ") {
		return spans{}, false
	}
	ans = env.ReasonedAnswer(t, strings.Join(lines, "\n"))
	var s spans
	for _, l := range append(lines, "Question: "+t.Question) {
		s.ids = append(s.ids, tok.Encode(l+"\n")...)
	}
	head := len(s.ids)
	s.ids = append(s.ids, tok.Encode(ans+"\n")...)
	// at is the position of the token that starts ans[off:]; every offset
	// used lies on a pre-token boundary, so the prefix encodes alone.
	at := func(off int) int { return head + len(tok.Encode(ans[:off])) }
	verdict := strings.Index(ans, "The earlier is ")
	year := verdict + len("The earlier is ")
	name := year + strings.Index(ans[year:], ": ") + len(": ")
	end := name + strings.Index(ans[name:], ".</think>")
	s.list, s.verdict, s.year, s.name, s.end = at(len("<think>")), at(verdict), at(year), at(name), at(end)
	other := optionsOf(t.Question, t.Answer)
	if other == "" {
		return spans{}, false
	}
	s.other = tok.Encode(other)[0]
	return s, true
}

// optionsOf returns the option of an "X or Y?" question that is not
// answer ("" when the question has no two options).
func optionsOf(q, answer string) string {
	_, opts, ok := strings.Cut(strings.TrimSuffix(q, "?"), ", ")
	a, b, ok2 := strings.Cut(opts, " or ")
	switch {
	case !ok || !ok2:
		return ""
	case a == answer:
		return b
	}
	return a
}
