package tamem

import (
	"context"
	"encoding/json"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/agemem/agemem/agent"
	"github.com/agemem/agemem/embed"
	"github.com/agemem/agemem/llm"
	"github.com/agemem/agemem/model/chat"
)

func lines(texts ...string) []Line {
	var out []Line
	for i, t := range texts {
		sp, msg, _ := strings.Cut(t, ": ")
		out = append(out, Line{DiaID: "D1:" + string(rune('1'+i)), Speaker: sp, Text: msg})
	}
	return out
}

var session = lines("Caroline: I went to an LGBTQ support group yesterday.", "Melanie: Wow, how did it feel?",
	"Caroline: Powerful. Also I am moving to Boston next month.", "Melanie: I painted a lake sunrise last year.")

var notes = []Note{
	{Start: 0, End: 1, Summary: "Caroline went to a support group.", Keywords: []string{"LGBTQ support group"}, Persons: []string{"Caroline", "Melanie"},
		Events: []Event{{Person: "Caroline", Event: "went to an LGBTQ support group", Time: "2023-05-07"}}, Tag: "support group"},
	{Start: 2, End: 2, Summary: "Caroline is moving to Boston.", Keywords: []string{"Boston"}, Persons: []string{"Caroline"},
		Events: []Event{{Person: "Caroline", Event: "moves to Boston", Time: "2023-06"}}, Facts: []Fact{{Person: "Caroline", Fact: "Caroline will live in Boston"}}, Tag: "moving"},
	{Start: 3, End: 3, Summary: "Melanie paints.", Keywords: []string{"lake sunrise"}, Persons: []string{"Melanie"},
		Events: []Event{{Person: "Melanie", Event: "painted a lake sunrise", Time: "2022"}}, Facts: []Fact{{Person: "Melanie", Fact: "Melanie paints landscapes"}}, Tag: "painting"},
}

func openDB(t *testing.T, path string) *DB {
	t.Helper()
	d, err := Open(path, embed.NewHashing(256, []int{3}))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	return d
}

// TestDatabaseIndexes: pages are found by person, keyword and tag (case
// and spacing ignored), by similarity of their events and facts (each page
// once), and people's profiles list their events in time order; the
// database survives a reopen and keeps conversations apart.
func TestDatabaseIndexes(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "m.db")
	d := openDB(t, path)
	if err := d.Add(ctx, "conv-1", Pages(1, "8 May 2023", session, notes)); err != nil {
		t.Fatal(err)
	}
	d.Add(ctx, "conv-2", Pages(1, "1 Jan 2024", session[:1], []Note{{Start: 0, End: 0, Persons: []string{"Zed"}, Tag: "other"}}))
	d.Close()
	d = openDB(t, path)
	for _, c := range []struct {
		kind, key string
		want      []int
	}{{"person", "caroline", []int{0, 1}}, {"person", "  MELANIE ", []int{0, 2}}, {"keyword", "boston", []int{1}}, {"tag", "Painting", []int{2}}, {"person", "Zed", nil}} {
		got, err := d.ByKey(ctx, "conv-1", c.kind, c.key)
		if err != nil || !slices.Equal(got, c.want) {
			t.Errorf("%s %q: %v %v, want %v", c.kind, c.key, got, err, c.want)
		}
	}
	if keys, _ := d.Keys(ctx, "conv-1", "person"); strings.Join(keys, ",") != "Caroline,Melanie" {
		t.Errorf("person keys %v", keys)
	}
	if got, _ := d.Similar(ctx, "conv-1", "event", "painted a picture of a sunrise over a lake", 1); !slices.Equal(got, []int{2}) {
		t.Errorf("events like a painting: %v", got)
	}
	if got, _ := d.Similar(ctx, "conv-1", "event", "anything", 10); len(got) != 3 {
		t.Errorf("every event's page once: %v", got)
	}
	evs, _ := d.Profile(ctx, "conv-1", "event", "Caroline")
	if len(evs) != 2 || evs[0].Time != "2023-05-07" || evs[1].Event != "moves to Boston" {
		t.Errorf("Caroline's events %+v", evs)
	}
	p, err := d.Page(ctx, "conv-1", 1)
	if err != nil || p.Time != "8 May 2023" || len(p.Dialogue) != 3 || p.Dialogue[0].DiaID != "D1:2" {
		t.Errorf("page 1 with one message of overlap each side: %+v %v", p, err)
	}
}

// TestToolsCacheWhatTheyReturned: the ten tools; a page or profile already
// returned for this question comes back as a mention, not again; a key
// that matches nothing points at the listing.
func TestToolsCacheWhatTheyReturned(t *testing.T) {
	ctx := context.Background()
	d := openDB(t, ":memory:")
	d.Add(ctx, "c", Pages(1, "8 May 2023", session, notes))
	s := d.NewRetrieval("c", K)
	ts, err := agent.NewToolset(s.Tools()...)
	if err != nil {
		t.Fatal(err)
	}
	if n := len(ts.Functions()); n != 10 {
		t.Fatalf("%d tools", n)
	}
	call := func(name, args string) string {
		out, _, err := ts.Execute(ctx, chat.ToolCall{Name: name, Arguments: args})
		if err != nil {
			t.Fatal(err)
		}
		return out
	}
	first := call("match_keyword", `{"keyword":"Boston"}`)
	if !strings.Contains(first, "moving to Boston") || !strings.Contains(first, `"time":"8 May 2023"`) {
		t.Fatalf("keyword: %s", first)
	}
	if again := call("match_person", `{"person":"Caroline"}`); !strings.Contains(again, `"already_retrieved":true`) || !strings.Contains(again, "support group yesterday") {
		t.Fatalf("person after keyword: %s", again)
	}
	if got := call("match_tag", `{"tag":"travel"}`); !strings.Contains(got, "list_tags") {
		t.Fatalf("no such tag: %s", got)
	}
	if got := call("person_events", `{"person":"caroline"}`); !strings.Contains(got, `"time":"2023-05-07"`) {
		t.Fatalf("events: %s", got)
	}
	if got := call("person_events", `{"person":"Caroline"}`); !strings.Contains(got, "already retrieved") {
		t.Fatalf("profile twice: %s", got)
	}
	if got := call("list_keywords", `{}`); got != "Boston; lake sunrise; LGBTQ support group" {
		t.Fatalf("keywords: %q", got)
	}
	if got := call("person_facts", `{"person":"Melanie"}`); got != `["Melanie paints landscapes"]` {
		t.Fatalf("facts: %s", got)
	}
	if !slices.Equal(s.Pages(), []int{1, 0}) {
		t.Fatalf("pages returned %v", s.Pages())
	}
}

// TestParseNotes: the extractor's reply must hold a JSON array of notes
// within the session; errors say what is wrong.
func TestParseNotes(t *testing.T) {
	good, _ := json.Marshal(notes)
	if got, err := ParseNotes("Here you go:\n"+string(good)+"\nDone.", 4); err != nil || len(got) != 3 || got[1].Facts[0].Person != "Caroline" {
		t.Fatalf("%v %+v", err, got)
	}
	// A bracketed aside before the array is skipped, as is an array of
	// something else.
	if got, err := ParseNotes("Messages [0-3], as [\"asked\"]:\n"+string(good), 4); err != nil || len(got) != 3 {
		t.Fatalf("after an aside: %v %+v", err, got)
	}
	for reply, want := range map[string]string{
		"I cannot do that.":            "no JSON array",
		`[{"start": 0, "end": "two"}]`: "not valid JSON",
		`[]`:                           "no notes",
		`[{"start": 2, "end": 9}]`:     "spans messages 2-9 of a session of 4",
		`[{"start": 3, "end": 1}]`:     "spans messages 3-1",
	} {
		if _, err := ParseNotes(reply, 4); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: %v, want %q", reply, err, want)
		}
	}
}

// scripted is a model for the tests: the extractor replies with notes
// (or garbage), the retrieval agent follows a plan of calls then answers
// from the last result.
type scripted struct {
	extract string
	plan    []chat.ToolCall
	calls   int
}

func (m *scripted) Chat(_ context.Context, req llm.Request) (llm.Response, error) {
	if strings.HasPrefix(req.Messages[0].Content, "You build a memory") {
		m.calls++
		return llm.Response{Message: chat.Message{Content: m.extract}}, nil
	}
	step := 0
	for _, msg := range req.Messages {
		if msg.Role == "assistant" {
			step++
		}
	}
	if req.Tools != nil && step < len(m.plan) {
		return llm.Response{Message: chat.Message{ToolCalls: []chat.ToolCall{m.plan[step]}}}, nil
	}
	last := req.Messages[len(req.Messages)-1].Content
	if i := strings.Index(last, `"time":"`); i >= 0 {
		return llm.Response{Message: chat.Message{Content: strings.SplitN(last[i+8:], `"`, 2)[0]}}, nil
	}
	return llm.Response{Message: chat.Message{Content: "Not mentioned"}}, nil
}

// TestBuildAndAnswer: a conversation is extracted once (a second build
// reuses it), a failed extraction stores the session whole, and the
// retrieval agent answers from what its tools returned, its context the
// retrieved pages' dialogue; out of budget it is asked for an answer.
func TestBuildAndAnswer(t *testing.T) {
	ctx := context.Background()
	d := openDB(t, ":memory:")
	good, _ := json.Marshal(notes)
	m := &scripted{extract: string(good), plan: []chat.ToolCall{{Name: "list_persons", Arguments: "{}"}, {Name: "person_events", Arguments: `{"person":"Caroline"}`}}}
	c := Conversation{ID: "c", SpeakerA: "Caroline", SpeakerB: "Melanie", Sessions: []SessionText{{N: 1, Date: "8 May 2023", Lines: session}}}
	if failed, err := d.Build(ctx, ModelExtractor(m), c, nil); err != nil || failed != 0 || m.calls != 1 {
		t.Fatalf("build: %d failed, %v, %d calls", failed, err, m.calls)
	}
	d.Build(ctx, ModelExtractor(m), c, nil)
	if m.calls != 1 {
		t.Fatal("a built conversation was extracted again")
	}
	a, err := d.Answer(ctx, m, "c", "Caroline", "Melanie", "When did Caroline go to the LGBTQ support group?", 0)
	if err != nil || a.Answer != "2023-05-07" || !a.Finalized || a.Turns != 3 || strings.Join(a.Tools, ",") != "list_persons,person_events" {
		t.Fatalf("answer %+v %v", a, err)
	}
	m.plan = []chat.ToolCall{{Name: "match_keyword", Arguments: `{"keyword":"Boston"}`}}
	a, _ = d.Answer(ctx, m, "c", "Caroline", "Melanie", "Where is Caroline moving?", 0)
	if strings.Join(a.Context, ",") != "D1:2,D1:3,D1:4" {
		t.Fatalf("context %v", a.Context)
	}
	loop := make([]chat.ToolCall, MaxTurns+2)
	for i := range loop {
		loop[i] = chat.ToolCall{Name: "list_tags", Arguments: "{}"}
	}
	m.plan = loop
	if a, _ = d.Answer(ctx, m, "c", "Caroline", "Melanie", "What?", 0); a.Finalized || a.Turns != MaxTurns || a.Answer == "" {
		t.Fatalf("out of budget: %+v", a)
	}

	bad := &scripted{extract: "Sorry, I cannot."}
	c.ID = "c2"
	var logged string
	if failed, err := d.Build(ctx, ModelExtractor(bad), c, func(s string) { logged = s }); err != nil || failed != 1 || !strings.Contains(logged, "c2 session 1") {
		t.Fatalf("a failed extraction: %d %v %q", failed, err, logged)
	}
	if got, _ := d.Similar(ctx, "c2", "fact", "painted a lake sunrise", 1); len(got) != 1 {
		t.Fatal("a session stored whole is still found by its messages")
	}
}

// Windows stores a session with no model: pages of w messages, speakers
// and the speakers named as people, capitalised words past a sentence's
// start as keywords, each message a fact of its speaker; Retrieve's query
// plan then finds a message by the keyword it holds even when plain
// similarity ranks it below messages that share the question's words, and
// by the person the question names.
func TestWindowsAndRetrieve(t *testing.T) {
	ctx := context.Background()
	lines := []Line{
		{DiaID: "D1:1", Speaker: "Tim", Text: "Where did you travel to last month? Tell me where you travel."},
		{DiaID: "D1:2", Speaker: "Nate", Text: "I flew to Kyoto with Tim's sister."},
		{DiaID: "D1:3", Speaker: "Tim", Text: "Did you travel there alone, or did you travel with friends?"},
		{DiaID: "D1:4", Speaker: "Nate", Text: "My rabbit is called Biscuit."},
		{DiaID: "D1:5", Speaker: "Tim", Text: "My rabbit is called Milo."},
	}
	pages, err := Windows(2)(ctx, 1, "6 June 2023", lines)
	if err != nil {
		t.Fatal(err)
	}
	if len(pages) != 3 || pages[0].Note.Start != 0 || pages[0].Note.End != 1 || pages[2].Note.Start != 4 || len(pages[1].Dialogue) != 4 {
		t.Fatalf("pages of two messages: %+v", pages)
	}
	n := pages[0].Note
	if !slices.Equal(n.Persons, []string{"Tim", "Nate"}) || !slices.Equal(n.Keywords, []string{"Kyoto"}) || len(n.Facts) != 2 || n.Facts[1] != (Fact{Person: "Nate", Fact: lines[1].Text}) {
		t.Fatalf("note: %+v", n)
	}
	if _, err := Windows(0)(ctx, 1, "", lines); err == nil {
		t.Fatal("a window of 0 messages was accepted")
	}

	d := openDB(t, ":memory:")
	c := Conversation{ID: "c", SpeakerA: "Tim", SpeakerB: "Nate", Sessions: []SessionText{{N: 1, Date: "6 June 2023", Lines: lines}}}
	if _, err := d.Build(ctx, Windows(1), c, nil); err != nil {
		t.Fatal(err)
	}
	q := "Where did Nate travel to in Kyoto?"
	plain, _ := d.Similar(ctx, "c", "fact", q, 5)
	if plain[0] == 1 {
		t.Fatalf("similarity alone already ranks the Kyoto message first (%v): the test shows nothing", plain)
	}
	if got, err := d.Retrieve(ctx, "c", q, 1); err != nil || !slices.Equal(got, []string{"D1:2"}) {
		t.Fatalf("Retrieve(%q) = %v, %v; want the Kyoto message", q, got, err)
	}
	if got, _ := d.Retrieve(ctx, "c", "What is the name of Tim's rabbit?", 1); !slices.Equal(got, []string{"D1:5"}) {
		t.Fatalf("Tim's rabbit: %v", got)
	}
	if got, _ := d.Retrieve(ctx, "c", "What is the name of Nate's rabbit?", 1); !slices.Equal(got, []string{"D1:4"}) {
		t.Fatalf("Nate's rabbit: %v", got)
	}
	if got, _ := d.Retrieve(ctx, "c", q, 10); len(got) != 5 {
		t.Fatalf("k past the conversation: %v", got)
	}
	// k below 1 is an error, not a crash (a negative k sliced past the
	// hits' start).
	if _, err := d.Retrieve(ctx, "c", q, 0); err == nil {
		t.Error("Retrieve with k 0: no error")
	}
	if _, err := d.Similar(ctx, "c", "fact", q, -1); err == nil {
		t.Error("Similar with k -1: no error")
	}
}
