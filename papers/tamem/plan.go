package tamem

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"strings"
	"unicode"
)

// Windows is an extractor that needs no model, so that the database's
// retrieval can be measured before any model is involved: each page is w
// consecutive messages; its people are the speakers and the speakers it
// names, its keywords the capitalised words that do not start a sentence
// (names of places, pets, things), each message a fact of its speaker, its
// tag the session. What an extraction agent adds (summaries, resolved
// times, topic boundaries) is absent.
func Windows(w int) Extractor {
	return func(_ context.Context, session int, date string, lines []Line) ([]Page, error) {
		if w < 1 {
			return nil, fmt.Errorf("tamem: a window of %d messages", w)
		}
		speakers := map[string]bool{}
		for _, l := range lines {
			speakers[norm(l.Speaker)] = true
		}
		var notes []Note
		for lo := 0; lo < len(lines); lo += w {
			hi := min(lo+w, len(lines)) - 1
			nt := Note{Start: lo, End: hi, Summary: lines[lo].Text, Tag: fmt.Sprintf("session %d", session)}
			for _, l := range lines[lo : hi+1] {
				nt.Persons = appendNew(nt.Persons, l.Speaker)
				nt.Facts = append(nt.Facts, Fact{Person: l.Speaker, Fact: l.Text})
				for _, word := range nameWords(l.Text) {
					if speakers[norm(word)] {
						nt.Persons = appendNew(nt.Persons, word)
					} else {
						nt.Keywords = appendNew(nt.Keywords, word)
					}
				}
			}
			notes = append(notes, nt)
		}
		return Pages(session, date, lines, notes), nil
	}
}

func appendNew(xs []string, x string) []string {
	if slices.ContainsFunc(xs, func(y string) bool { return norm(y) == norm(x) }) {
		return xs
	}
	return append(xs, x)
}

// nameWords are a text's capitalised words that do not start a sentence,
// without punctuation or a possessive 's; "I" and its contractions are not
// names.
func nameWords(text string) []string {
	var out []string
	start := true
	for _, f := range strings.Fields(text) {
		w := strings.TrimFunc(f, func(r rune) bool { return !unicode.IsLetter(r) && !unicode.IsDigit(r) })
		w = strings.TrimSuffix(strings.TrimSuffix(w, "'s"), "’s")
		r := []rune(w)
		if len(r) > 0 && unicode.IsUpper(r[0]) && !start && w != "I" && !strings.HasPrefix(w, "I'") && !strings.HasPrefix(w, "I’") {
			out = append(out, w)
		}
		start = strings.ContainsAny(f[len(f)-1:], ".!?")
	}
	return out
}

// Retrieve is a fixed query plan over the multi-index database, the calls
// a retrieval agent makes most, with no model choosing them: match_facts
// on the question; the same restricted to each person the question names
// (the person and embedding indexes together); match_keyword for each
// indexed keyword the question contains. The page lists are fused by
// reciprocal rank (1/(60+rank)) and the dialogue ids of the best pages'
// own spans (not their overlap) returned, at most k, best first.
func (d *DB) Retrieve(ctx context.Context, ns, question string, k int) ([]string, error) {
	if k < 1 {
		return nil, fmt.Errorf("tamem: k %d: retrieve at least one turn", k)
	}
	words := map[string]bool{}
	for _, f := range strings.Fields(question) {
		w := strings.TrimFunc(f, func(r rune) bool { return !unicode.IsLetter(r) && !unicode.IsDigit(r) })
		w = strings.TrimSuffix(strings.TrimSuffix(w, "'s"), "’s")
		words[norm(w)] = true
	}
	pool := 4 * max(k, K)
	all, err := d.Similar(ctx, ns, "fact", question, pool)
	if err != nil {
		return nil, err
	}
	lists := [][]int{all}
	persons, err := d.Keys(ctx, ns, "person")
	if err != nil {
		return nil, err
	}
	for _, p := range persons {
		if words[norm(p)] {
			ids, err := d.SimilarOf(ctx, ns, "fact", p, question, pool)
			if err != nil {
				return nil, err
			}
			lists = append(lists, ids)
		}
	}
	keywords, err := d.Keys(ctx, ns, "keyword")
	if err != nil {
		return nil, err
	}
	for _, kw := range keywords {
		if words[norm(kw)] {
			ids, err := d.ByKey(ctx, ns, "keyword", kw)
			if err != nil {
				return nil, err
			}
			lists = append(lists, ids)
		}
	}
	score := map[int]float64{}
	first := map[int]int{} // ties go to the page the question's similarity ranks first
	for _, l := range lists {
		for r, p := range l {
			score[p] += 1 / float64(60+r+1)
		}
	}
	for r, p := range all {
		first[p] = r + 1
	}
	pages := make([]int, 0, len(score))
	for p := range score {
		pages = append(pages, p)
	}
	sort.Slice(pages, func(a, b int) bool {
		pa, pb := pages[a], pages[b]
		if score[pa] != score[pb] {
			return score[pa] > score[pb]
		}
		ra, rb := first[pa], first[pb]
		if (ra == 0) != (rb == 0) {
			return ra != 0
		}
		if ra != rb {
			return ra < rb
		}
		return pa < pb
	})
	var out []string
	for _, id := range pages {
		p, err := d.Page(ctx, ns, id)
		if err != nil {
			return nil, err
		}
		lo := max(p.Note.Start-Overlap, 0)
		for _, l := range p.Dialogue[p.Note.Start-lo : p.Note.End-lo+1] {
			if len(out) == k {
				return out, nil
			}
			out = append(out, l.DiaID)
		}
	}
	return out, nil
}
