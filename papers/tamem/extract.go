package tamem

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"

	"github.com/agemem/agemem/llm"
	"github.com/agemem/agemem/model/chat"
)

// noteSchema is a note as the extractor writes it (Eq. 2).
const noteSchema = `{"start": first message number, "end": last message number,
 "summary": one or two sentences,
 "keywords": important words and phrases exactly as they appear,
 "persons": the people involved or mentioned,
 "facts": [{"person": who, "fact": a lasting fact about them}],
 "events": [{"person": who, "event": what happened or will happen, "time": the date it refers to, resolved against the session date (YYYY-MM-DD, or YYYY-MM, or YYYY)}],
 "tag": a short semantic tag for the topic}
`

// ExtractPrompt is the memory constructor's one-shot, multi-task
// instruction (the paper's is not published; this one asks for what its
// Eq. 2 holds, topic boundaries first, with one example).
const ExtractPrompt = `You build a memory of a conversation. Read the numbered messages of one session (its date is given) and split them into topic-coherent segments where the topic shifts. For each segment write one note as a JSON object:
` + noteSchema + `Answer with a JSON array of notes covering every message, and nothing else.

Example. Session date: 8 May 2023.
[0] Caroline: I went to an LGBTQ support group yesterday and it was so powerful.
[1] Melanie: That's great! I painted a lake sunrise last year.
Answer:
[{"start": 0, "end": 0, "summary": "Caroline went to an LGBTQ support group, which moved her.", "keywords": ["LGBTQ support group"], "persons": ["Caroline"], "facts": [], "events": [{"person": "Caroline", "event": "went to an LGBTQ support group", "time": "2023-05-07"}], "tag": "support group"},
 {"start": 1, "end": 1, "summary": "Melanie painted a lake sunrise.", "keywords": ["lake sunrise", "painted"], "persons": ["Melanie"], "facts": [{"person": "Melanie", "fact": "Melanie paints"}], "events": [{"person": "Melanie", "event": "painted a lake sunrise", "time": "2022"}], "tag": "painting"}]`

// Overlap is how many messages each page's dialogue reaches past its
// note's span on each side (the paper's "small amount of overlap" that
// smooths chunk boundaries; its size is not given).
const Overlap = 1

// Extract asks m for the notes of one session (a single call) and turns
// them into pages. A reply that is not a JSON array of notes, or notes
// outside the session, is an error naming what is wrong.
func Extract(ctx context.Context, m llm.Model, session int, date string, lines []Line) ([]Page, error) {
	notes, err := askNotes(ctx, m, ExtractPrompt, date, lines)
	if err != nil {
		return nil, err
	}
	return Pages(session, date, lines, notes), nil
}

// askNotes gives m the instruction and the numbered messages with their
// date (one call) and reads the notes it answers with.
func askNotes(ctx context.Context, m llm.Model, instruction, date string, lines []Line) ([]Note, error) {
	var b strings.Builder
	fmt.Fprintf(&b, "Session date: %s.\n", date)
	for i, l := range lines {
		fmt.Fprintf(&b, "[%d] %s: %s\n", i, l.Speaker, l.Text)
	}
	b.WriteString("Answer:")
	r, err := m.Chat(ctx, llm.Request{Messages: []chat.Message{{Role: "system", Content: instruction}, {Role: "user", Content: b.String()}}})
	if err != nil {
		return nil, err
	}
	return ParseNotes(r.Message.Content, len(lines))
}

// ParseNotes reads the extractor's reply: the first JSON array of notes
// in it (text around it, or a bracketed aside before it, is skipped), each
// note's span within the n messages.
func ParseNotes(reply string, n int) ([]Note, error) {
	var notes []Note
	var firstErr error
	from, tries := 0, 0
	for tries < maxArrayTries {
		i := strings.IndexByte(reply[from:], '[')
		if i < 0 {
			break
		}
		from += i
		tries++
		notes = nil
		err := json.NewDecoder(strings.NewReader(reply[from:])).Decode(&notes)
		if err == nil {
			break
		}
		if firstErr == nil {
			firstErr = fmt.Errorf("the notes are not valid JSON (%v): %.120q", err, reply[from:])
		}
		notes, from = nil, from+1
	}
	switch {
	case notes == nil && firstErr != nil:
		return nil, firstErr
	case notes == nil:
		return nil, fmt.Errorf("the reply holds no JSON array of notes: %.120q", reply)
	case len(notes) == 0:
		return nil, fmt.Errorf("no notes")
	}
	for k, nt := range notes {
		if nt.Start < 0 || nt.End < nt.Start || nt.End >= n {
			return nil, fmt.Errorf("note %d spans messages %d-%d of a session of %d", k, nt.Start, nt.End, n)
		}
	}
	return notes, nil
}

// maxArrayTries bounds how many '[' ParseNotes decodes from: a reply of
// brackets must not cost quadratic time.
const maxArrayTries = 64

// Pages wraps notes into pages: each note's span widened by Overlap on both
// sides, the session's date as the page's time.
func Pages(session int, date string, lines []Line, notes []Note) []Page {
	out := make([]Page, len(notes))
	for i, nt := range notes {
		lo, hi := max(nt.Start-Overlap, 0), min(nt.End+Overlap, len(lines)-1)
		out[i] = Page{Session: session, Time: date, Dialogue: append([]Line(nil), lines[lo:hi+1]...), Note: nt}
	}
	return out
}

// WholeSession is the page a session gets when its extraction failed: its
// whole dialogue, each message a fact of its speaker (so the fact index
// still reaches it), the speakers as its people and "session N" as its
// tag; nothing said is lost to retrieval.
func WholeSession(session int, date string, lines []Line) Page {
	nt := Note{Start: 0, End: len(lines) - 1, Summary: fmt.Sprintf("Session %d (not extracted).", session), Tag: fmt.Sprintf("session %d", session)}
	seen := map[string]bool{}
	for _, l := range lines {
		nt.Facts = append(nt.Facts, Fact{Person: l.Speaker, Fact: l.Text})
		if !seen[l.Speaker] {
			seen[l.Speaker] = true
			nt.Persons = append(nt.Persons, l.Speaker)
		}
	}
	return Page{Session: session, Time: date, Dialogue: lines, Note: nt}
}
