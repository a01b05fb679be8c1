package console

import (
	"fmt"
	"net/http"
	"time"
	"unicode/utf8"

	"github.com/agemem/agemem/env"
	"github.com/agemem/agemem/memtools"
)

// Turn is one run of the agent loop as the console shows it, from a
// served request or a training rollout: what the user said, each policy
// call with its tool calls (arguments, results, the memories they touched,
// what Summary and Filter removed) and how large the context ended. Its
// JSON is what rollouts.jsonl records under "trajectory".
type Turn struct {
	ID      string    `json:"id,omitempty"`      // the completion's id
	Session string    `json:"session,omitempty"` // the session it continued ("": none)
	Time    time.Time `json:"time,omitzero"`
	User    string    `json:"user"`
	// Recalled are the memories Stage 1 retrieves by itself and appends
	// to the user's turn (Algorithm 3).
	Recalled      string `json:"recalled,omitempty"`
	Steps         []Step `json:"steps"`
	Answer        string `json:"answer,omitempty"`
	ContextTokens int    `json:"context_tokens,omitempty"`
	Error         string `json:"error,omitempty"`
}

// Step is one policy call.
type Step struct {
	Response         string   `json:"response"`
	PromptTokens     int      `json:"prompt_tokens"`
	CompletionTokens int      `json:"completion_tokens,omitempty"`
	Overflow         bool     `json:"overflow,omitempty"`
	Calls            []Call   `json:"calls,omitempty"`
	FormatErrors     []string `json:"format_errors,omitempty"`
}

// Call is one tool call and its result.
type Call struct {
	Name      string      `json:"name"`
	Arguments string      `json:"arguments,omitempty"`
	OK        bool        `json:"ok"`
	Result    string      `json:"result,omitempty"`
	Memories  []MemoryRef `json:"memories,omitempty"`
	// Removed, TokensBefore and TokensAfter are what Summary_context and
	// Filter_context did to the context.
	Removed      int `json:"removed,omitempty"`
	TokensBefore int `json:"tokens_before,omitempty"`
	TokensAfter  int `json:"tokens_after,omitempty"`
}

// MemoryRef is a memory a call added, updated, deleted or retrieved (with
// its similarity).
type MemoryRef struct {
	ID    string  `json:"id"`
	Score float64 `json:"score,omitempty"`
}

// Conversation sums up one conversation for the list.
type Conversation struct {
	ID            string // a session id, or a lone request's completion id
	Session       bool
	Turns         int
	Last          time.Time
	First         string // the first turn's user message
	ContextTokens int    // after the last turn
}

// TurnOf records a trace of the agent loop, each text clipped to limit
// bytes (0: whole).
func TurnOf(user string, tr memtools.Trace, limit int) Turn {
	t := Turn{User: clipBytes(user, limit), Steps: make([]Step, len(tr.Steps))}
	if tr.HasAnswer {
		t.Answer = clipBytes(tr.Answer, limit)
	}
	for i, st := range tr.Steps {
		s := Step{Response: clipBytes(st.Response.Message.Content, limit), PromptTokens: st.PromptTokens,
			CompletionTokens: st.Response.CompletionTokens, Overflow: st.Overflow, FormatErrors: st.Parsed.Errors}
		for j, c := range st.Parsed.Calls {
			call := Call{Name: c.Name, Arguments: clipBytes(string(c.Arguments), limit)}
			if j < len(st.Results) {
				res := st.Results[j]
				call.OK, call.Result = res.OK, clipBytes(res.Content, limit)
				call.Removed, call.TokensBefore, call.TokensAfter = res.Removed, res.TokensBefore, res.TokensAfter
				if res.Entry != nil {
					call.Memories = append(call.Memories, MemoryRef{ID: res.Entry.ID})
				}
				for _, m := range res.Retrieved {
					call.Memories = append(call.Memories, MemoryRef{ID: m.ID, Score: m.Score})
				}
			}
			s.Calls = append(s.Calls, call)
		}
		t.Steps[i] = s
	}
	return t
}

// Episode is a training rollout's trajectory: AgeMem's three stages of
// turns and the answer it was scored against.
type Episode struct {
	Gold   string    `json:"gold"`
	Stages [3][]Turn `json:"stages"`
}

// TrajectoryLimit clips each text of a rollout's trajectory, so that
// rollouts.jsonl stays a few kilobytes a rollout.
const TrajectoryLimit = 2000

// EpisodeOf records a played episode for rollouts.jsonl.
func EpisodeOf(r env.Result) Episode {
	ep := Episode{Gold: r.Gold}
	for s, turns := range r.Stages {
		for _, turn := range turns {
			text, recalled := env.SplitTurn(turn.User)
			t := TurnOf(text, turn.Trace, TrajectoryLimit)
			t.Recalled = clipBytes(recalled, TrajectoryLimit)
			ep.Stages[s] = append(ep.Stages[s], t)
		}
	}
	return ep
}

// clipBytes cuts s to at most limit bytes on a rune boundary, saying how
// much was cut.
func clipBytes(s string, limit int) string {
	if limit <= 0 || len(s) <= limit {
		return s
	}
	cut := limit
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + fmt.Sprintf("… [%d more bytes]", len(s)-cut)
}

func (c *Console) conversations(w http.ResponseWriter, r *http.Request) {
	ns, ok := c.withNamespace(w, r)
	if !ok {
		return
	}
	cs, err := c.o.Conversations.Conversations(r.Context(), ns)
	if err != nil {
		c.failErr(w, r, err)
		return
	}
	c.render(w, http.StatusOK, "conversations", c.nsPage(r, ns, "conversations", "Conversations in "+ns, cs))
}

type conversationData struct {
	ID    string
	Turns []Turn
}

func (c *Console) conversation(w http.ResponseWriter, r *http.Request) {
	ns, ok := c.withNamespace(w, r)
	if !ok {
		return
	}
	id := r.PathValue("id")
	ts, err := c.o.Conversations.Turns(r.Context(), ns, id)
	if err != nil {
		c.failErr(w, r, err)
		return
	}
	if len(ts) == 0 {
		c.fail(w, r, http.StatusNotFound, "no recent conversation "+id+" in namespace "+ns)
		return
	}
	c.render(w, http.StatusOK, "conversation", c.nsPage(r, ns, "conversations", "Conversation "+id, conversationData{ID: id, Turns: ts}))
}

func (c *Console) health(w http.ResponseWriter, r *http.Request) {
	p := c.page(r, "health", "Health", c.o.Health())
	p.Refresh = int(c.o.Config.Refresh.Seconds())
	c.render(w, http.StatusOK, "health", p)
}
