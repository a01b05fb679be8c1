package locomo

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"strings"
	"time"
)

// Synth writes synthetic conversations in locomo10.json's exact layout
// (speakers, dated sessions of turns with dia_ids, a qa list of all five
// categories with evidence ids, and the event_summary, observation and
// session_summary fields), for tests and the demo; the real file is read
// by Load the same way.
func Synth(samples, sessions int, seed uint64) ([]byte, error) {
	r := rand.New(rand.NewPCG(seed, 0x6c6f636f))
	first := []string{"Caroline", "Melanie", "Jon", "Gina", "John", "Maria", "Joanna", "Nate", "Tim", "Audrey", "Andrew", "Deborah", "Evan", "Sam", "Calvin", "Dave"}
	pets := []string{"Oscar", "Luna", "Biscuit", "Pepper", "Milo", "Juniper", "Toby", "Hazel"}
	species := []string{"dog", "cat", "parrot", "rabbit"}
	hobbies := []string{"painting", "hiking", "pottery", "running", "chess", "gardening", "surfing", "baking"}
	cities := []string{"Paris", "Lisbon", "Kyoto", "Oslo", "Toronto", "Nairobi", "Lima", "Prague"}
	var out []map[string]any
	for si := range samples {
		a, b := first[r.IntN(len(first))], ""
		for b == "" || b == a {
			b = first[r.IntN(len(first))]
		}
		conv := map[string]any{"speaker_a": a, "speaker_b": b}
		date := time.Date(2023, time.Month(1+r.IntN(6)), 1+r.IntN(27), 10+r.IntN(9), 0, 0, 0, time.UTC)
		type fact struct {
			who, kind, value, dia, date string
		}
		var facts []fact
		sessionSummary, events, observations := map[string]any{}, map[string]any{}, map[string]any{}
		for s := 1; s <= sessions; s++ {
			date = date.AddDate(0, 0, 3+r.IntN(20))
			stamp := date.Format("3:04 pm on 2 January, 2006")
			var turns []map[string]any
			say := func(who, text string) string {
				id := fmt.Sprintf("D%d:%d", s, len(turns)+1)
				turns = append(turns, map[string]any{"speaker": who, "dia_id": id, "text": text})
				return id
			}
			for t := 0; t < 3+r.IntN(3); t++ {
				who := []string{a, b}[t%2]
				switch r.IntN(4) {
				case 0:
					p, sp := pets[r.IntN(len(pets))], species[r.IntN(len(species))]
					id := say(who, fmt.Sprintf("I adopted a %s last week, we named it %s!", sp, p))
					facts = append(facts, fact{who, "pet", p, id, ""})
				case 1:
					h := hobbies[r.IntN(len(hobbies))]
					id := say(who, fmt.Sprintf("Lately I've been really into %s, it calms me down.", h))
					facts = append(facts, fact{who, "hobby", h, id, ""})
				case 2:
					c := cities[r.IntN(len(cities))]
					id := say(who, fmt.Sprintf("I just got back from a trip to %s yesterday.", c))
					facts = append(facts, fact{who, "trip", c, id, date.Format("2 January 2006")})
				default:
					say(who, "How have you been? It's been a busy week.")
				}
			}
			conv[fmt.Sprintf("session_%d", s)] = turns
			conv[fmt.Sprintf("session_%d_date_time", s)] = stamp
			sessionSummary[fmt.Sprintf("session_%d_summary", s)] = fmt.Sprintf("%s and %s talked on %s.", a, b, stamp)
			events[fmt.Sprintf("events_session_%d", s)] = map[string]any{a: []string{}, b: []string{}, "date": stamp}
			observations[fmt.Sprintf("session_%d_observation", s)] = map[string]any{a: [][]string{}, b: [][]string{}}
		}
		var qa []map[string]any
		ask := func(q string, answer any, evidence []string, cat int) {
			m := map[string]any{"question": q, "evidence": evidence, "category": cat}
			if cat == 5 {
				m["adversarial_answer"] = answer
			} else {
				m["answer"] = answer
			}
			qa = append(qa, m)
		}
		hobbyOf := map[string][]fact{}
		for _, f := range facts {
			switch f.kind {
			case "pet":
				ask(fmt.Sprintf("What is the name of %s's pet?", f.who), f.value, []string{f.dia}, 4)
				other := map[string]string{a: b, b: a}[f.who]
				ask(fmt.Sprintf("What is the name of %s's pet?", other), f.value, []string{f.dia}, 5)
			case "trip":
				ask(fmt.Sprintf("When did %s come back from %s?", f.who, f.value), "The day before "+f.date, []string{f.dia}, 2)
			case "hobby":
				hobbyOf[f.who] = append(hobbyOf[f.who], f)
				ask(fmt.Sprintf("Would %s enjoy a quiet weekend workshop?", f.who), "Likely yes; they enjoy "+f.value, []string{f.dia}, 3)
			}
		}
		for who, hs := range hobbyOf {
			if len(hs) < 2 {
				continue
			}
			var names, ev []string
			for _, h := range hs {
				names = append(names, h.value)
				ev = append(ev, h.dia)
			}
			ask(fmt.Sprintf("What hobbies does %s have?", who), strings.Join(names, ", "), ev, 1)
		}
		if len(qa) == 0 {
			ask(fmt.Sprintf("Where does %s live?", a), "Not mentioned", []string{}, 5)
		}
		out = append(out, map[string]any{"sample_id": fmt.Sprintf("conv-%d", si+1), "conversation": conv, "qa": qa,
			"event_summary": events, "observation": observations, "session_summary": sessionSummary})
	}
	return json.MarshalIndent(out, "", "  ")
}
