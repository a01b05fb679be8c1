package serve

import (
	"context"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/agemem/agemem/console"
	"github.com/agemem/agemem/memtools"
	"github.com/agemem/agemem/memtools/stm"
	"github.com/agemem/agemem/model/chat"
)

// journal keeps the agent's recent turns for the console's conversation
// pages: at most serve.console.turns in all and turns_per_namespace of one
// namespace, the oldest going first, so one busy tenant cannot push out
// the others' history. It lives in memory, as sessions do: it shows what
// this process served lately, not an archive.
type journal struct {
	mu    sync.Mutex
	max   int
	maxNS int
	byNS  map[string][]*journalTurn // each namespace's turns, oldest first
	order []*journalTurn            // every turn, oldest first, and some gone
	head  int                       // order[:head] are dropped
	live  int                       // turns kept
	now   func() time.Time
}

type journalTurn struct {
	ns   string
	t    console.Turn
	gone bool // dropped by its namespace's cap; order drops it when it reaches it
}

// turnLimit clips each text a turn records, bounding the journal's memory.
const turnLimit = 8 << 10

func newJournal(max, maxNS int) *journal {
	return &journal{max: max, maxNS: maxNS, byNS: map[string][]*journalTurn{}, now: time.Now}
}

// record keeps one request's turn: the user's messages of the turn, the
// agent loop's trace, the context's size after it and its error.
func (j *journal) record(ns, session, id string, turn []chat.Message, tr memtools.Trace, contextTokens int, failed *apiError) {
	if j.max == 0 || j.maxNS == 0 {
		return
	}
	var user []string
	for _, m := range turn {
		if m.Role == stm.User {
			user = append(user, m.Content)
		}
	}
	t := console.TurnOf(strings.Join(user, "\n\n"), tr, turnLimit)
	t.ID, t.Session, t.Time, t.ContextTokens = id, session, j.now(), contextTokens
	if failed != nil {
		t.Error = failed.Message
	}
	j.mu.Lock()
	defer j.mu.Unlock()
	e := &journalTurn{ns: ns, t: t}
	j.byNS[ns] = append(j.byNS[ns], e)
	j.order = append(j.order, e)
	j.live++
	if own := j.byNS[ns]; len(own) > j.maxNS {
		own[0].gone = true
		j.byNS[ns] = own[1:]
		j.live--
	}
	for j.live > j.max {
		old := j.order[j.head]
		j.order[j.head] = nil
		j.head++
		if old.gone {
			continue
		}
		own := j.byNS[old.ns]
		j.byNS[old.ns] = own[1:] // the oldest kept overall is its namespace's oldest
		if len(own) == 1 {
			delete(j.byNS, old.ns)
		}
		j.live--
	}
	// Drop what is gone from order now and then, so that a busy tenant's
	// dropped turns do not pile up behind a quiet tenant's old one.
	if len(j.order)-j.head > 2*j.max {
		kept := make([]*journalTurn, 0, j.live)
		for _, x := range j.order[j.head:] {
			if !x.gone {
				kept = append(kept, x)
			}
		}
		j.order, j.head = kept, 0
	}
}

// Conversations implements console.Conversations.
func (j *journal) Conversations(_ context.Context, ns string) ([]console.Conversation, error) {
	j.mu.Lock()
	defer j.mu.Unlock()
	at := map[string]int{}
	var out []console.Conversation
	for _, e := range j.byNS[ns] {
		id, session := conversationOf(e.t)
		i, ok := at[id]
		if !ok {
			i = len(out)
			at[id] = i
			out = append(out, console.Conversation{ID: id, Session: session, First: e.t.User})
		}
		c := &out[i]
		c.Turns++
		c.Last, c.ContextTokens = e.t.Time, e.t.ContextTokens
	}
	sort.SliceStable(out, func(a, b int) bool { return out[a].Last.After(out[b].Last) })
	return out, nil
}

// Turns implements console.Conversations.
func (j *journal) Turns(_ context.Context, ns, id string) ([]console.Turn, error) {
	j.mu.Lock()
	defer j.mu.Unlock()
	var out []console.Turn
	for _, e := range j.byNS[ns] {
		if cid, _ := conversationOf(e.t); cid == id {
			out = append(out, e.t)
		}
	}
	return out, nil
}

// conversationOf is the conversation a turn belongs to: its session, or
// itself when it was sent without one.
func conversationOf(t console.Turn) (string, bool) {
	if t.Session != "" {
		return t.Session, true
	}
	return t.ID, false
}
