package pretrain

import (
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/agemem/agemem/env"
	"github.com/agemem/agemem/model/tokenizer"
)

// probeWorld is synthetic tasks and a words tokenizer learned on them.
func probeWorld(t *testing.T) ([]env.Task, *tokenizer.Tokenizer) {
	g := env.NewSynthStream(3, 9)
	var tasks []env.Task
	var texts []string
	for i := range 120 {
		task, err := g.Next(i).Task()
		if err != nil {
			t.Fatal(err)
		}
		tasks = append(tasks, task)
		texts = append(texts, append(append([]string{task.Question}, task.Context...), task.Distractors...)...)
	}
	raw, err := tokenizer.Train(texts, tokenizer.TrainOptions{VocabSize: 700, Special: tokenizer.ChatML, Added: tokenizer.AgeMemTags, Pattern: tokenizer.WordsPattern})
	if err != nil {
		t.Fatal(err)
	}
	tok, err := tokenizer.Parse(raw)
	if err != nil {
		t.Fatal(err)
	}
	return tasks, tok
}

// The spans cut the teacher's reasoning where the probe says: decoded,
// each is the text it stands for.
func TestVerdictSpansHandChecked(t *testing.T) {
	tasks, tok := probeWorld(t)
	r := rand.New(rand.NewPCG(1, 2))
	n := 0
	for _, task := range tasks {
		s, ok := verdictSpans(r, tok, task)
		isEarlier := task.Type == "comparison" && !strings.HasPrefix(task.Question, "Are ")
		if ok != isEarlier {
			t.Fatalf("%q: probed %v", task.Question, ok)
		}
		if !ok {
			continue
		}
		n++
		dec := func(lo, hi int) string { return tok.Decode(s.ids[lo:hi], false) }
		year, _, _ := strings.Cut(dec(s.year, s.name), ":")
		listing := dec(s.list, s.verdict)
		if dec(s.name, s.end) != task.Answer || !strings.Contains(listing, year+": "+task.Answer+". ") ||
			!strings.HasPrefix(dec(s.verdict, s.year), "The earlier is ") || dec(s.year, s.name) != year+": " {
			t.Fatalf("%q: listing %q, verdict %q, year %q, name %q", task.Question, listing, dec(s.verdict, s.year), dec(s.year, s.name), dec(s.name, s.end))
		}
		other := optionsOf(task.Question, task.Answer)
		if !strings.HasPrefix(other, tok.Decode([]int{s.other}, false)) || other == task.Answer {
			t.Fatalf("%q: other option %q, token %q", task.Question, other, tok.Decode([]int{s.other}, false))
		}
	}
	if n < 10 {
		t.Fatalf("only %d which-was-earlier tasks probed of %d", n, len(tasks))
	}
}

// A model that predicts every next token scores every step; one that
// always predicts the same token scores none of them; one that predicts
// the other option's name at the verdict counts there as Other.
func TestProbeVerdictsScoring(t *testing.T) {
	tasks, tok := probeWorld(t)
	vocab := tok.VocabSize()
	// forward predicts ids[i+1] at position i, except where swap says.
	forward := func(swap map[int]int) Forwarder {
		return func(ids []int) ([]float32, error) {
			out := make([]float32, len(ids)*vocab)
			for i := 0; i+1 < len(ids); i++ {
				next := ids[i+1]
				if alt, ok := swap[i+1]; ok {
					next = alt
				}
				out[i*vocab+next] = 1
			}
			return out, nil
		}
	}
	v, err := ProbeVerdicts(forward(nil), tok, tasks, 5)
	if err != nil {
		t.Fatal(err)
	}
	if v.Tasks < 10 || v.Year != v.Tasks || v.Name != v.Tasks || v.Other != 0 || v.Later != v.LaterN || v.Listing != v.ListingN || v.ListingN < 10*v.Tasks {
		t.Fatalf("the teacher's own tokens: %+v", v)
	}
	constant := func(ids []int) ([]float32, error) {
		out := make([]float32, len(ids)*vocab)
		for i := range len(ids) {
			out[i*vocab+1] = 1 // a byte token no probed span holds
		}
		return out, nil
	}
	if v, err := ProbeVerdicts(constant, tok, tasks, 5); err != nil || v.Year+v.Name+v.Other+v.Later+v.Listing != 0 {
		t.Fatalf("a constant prediction: %+v %v", v, err)
	}
	// The other option at the name: the same sequences (same seed) with
	// the name's first token swapped.
	r := rand.New(rand.NewPCG(5, 0x7665726469637473))
	swaps := map[string]map[int]int{}
	shared := 0 // options whose names start with the same token: right either way
	for _, task := range tasks {
		if s, ok := verdictSpans(r, tok, task); ok {
			swaps[tok.Decode(s.ids, false)] = map[int]int{s.name: s.other}
			if s.other == s.ids[s.name] {
				shared++
			}
		}
	}
	swapping := func(ids []int) ([]float32, error) { return forward(swaps[tok.Decode(ids, false)])(ids) }
	if v, err := ProbeVerdicts(swapping, tok, tasks, 5); err != nil || v.Name != shared || v.Other != v.Tasks-shared || v.Year != v.Tasks || shared == v.Tasks {
		t.Fatalf("the other option's name (%d share a first token): %+v %v", shared, v, err)
	}
	if _, err := ProbeVerdicts(forward(nil), tok, nil, 5); err == nil || !strings.Contains(err.Error(), "which was earlier") {
		t.Fatalf("no tasks: %v", err)
	}
}
