package tamem

import (
	"context"
	"fmt"
	"strings"

	"github.com/agemem/agemem/agent"
	"github.com/agemem/agemem/llm"
	"github.com/agemem/agemem/model/chat"
)

// MaxTurns is the retrieval agent's budget (the paper's 7).
const MaxTurns = 7

// AnswerPrompt is the retrieval agent's instruction (the paper's is not
// published; this one says what it describes: the tools, the QA task, use
// the timestamps to prefer the latest information, and go to the key
// listings when a query returns nothing).
const AnswerPrompt = `You answer a question about a long conversation between %s and %s, held over many dated sessions. Its memory is a database of pages (a span of the dialogue with its time, a summary and a tag) that you query with tools: by keyword, person or tag (exact keys; list_keywords, list_persons and list_tags give them), by similarity to events or facts, and the events or facts of a person. Query until you have what the question needs, then answer without calling a tool. If a query returns nothing, list the available keys and use one of them. Dates: each page's time is when it was said; resolve "yesterday" or "last week" against it, and when memories conflict prefer the latest. Answer with a short phrase, in exact words from the dialogue where possible; if the conversation does not say, answer "Not mentioned".`

// Answered is one question's answer with what the retrieval did.
type Answered struct {
	Answer string
	// Pages are the pages the tools returned, in order; Context their
	// dialogue ids (for evidence recall).
	Pages   []int
	Context []string
	Turns   int
	// Finalized: the agent answered within the budget on its own (the
	// paper's success rate); otherwise it was asked for an answer after it.
	Finalized bool
	Tools     []string // the tools called, in order
	// Tokens are the agent's prompt and completion tokens over its
	// calls, as the model reported them (the paper's token usage).
	Tokens int
	Trace  agent.Trace
}

// Answer runs the retrieval agent on one question of conversation ns,
// with at most budget tool-calling turns (below 1: MaxTurns, the paper's;
// its Figure 3 sweeps it).
func (d *DB) Answer(ctx context.Context, m llm.Model, ns, speakerA, speakerB, question string, budget int) (Answered, error) {
	if budget < 1 {
		budget = MaxTurns
	}
	s := d.NewRetrieval(ns, K)
	ts, err := agent.NewToolset(s.Tools()...)
	if err != nil {
		return Answered{}, err
	}
	msgs := []chat.Message{{Role: "system", Content: fmt.Sprintf(AnswerPrompt, speakerA, speakerB)}, {Role: "user", Content: question}}
	tr, err := agent.Run(ctx, m, ts, msgs, agent.Limits{MaxSteps: budget})
	if err != nil {
		return Answered{}, err
	}
	a := Answered{Turns: len(tr.Steps), Finalized: tr.HasAnswer, Answer: strings.TrimSpace(tr.Answer), Trace: tr}
	for _, st := range tr.Steps {
		a.Tokens += st.Reply.PromptTokens + st.Reply.CompletionTokens
		for _, r := range st.Results {
			a.Tools = append(a.Tools, r.Call.Name)
		}
	}
	if !tr.HasAnswer {
		// Out of budget: one more turn, no tools, for the answer.
		r, err := m.Chat(ctx, llm.Request{Messages: append(tr.Messages, chat.Message{Role: "user", Content: "Answer the question now with what you found."})})
		if err != nil {
			return Answered{}, err
		}
		a.Answer = strings.TrimSpace(r.Message.Content)
		a.Tokens += r.PromptTokens + r.CompletionTokens
	}
	a.Pages = s.Pages()
	seen := map[string]bool{}
	for _, id := range a.Pages {
		p, err := d.Page(ctx, ns, id)
		if err != nil {
			return Answered{}, err
		}
		for _, l := range p.Dialogue {
			if !seen[l.DiaID] {
				seen[l.DiaID] = true
				a.Context = append(a.Context, l.DiaID)
			}
		}
	}
	return a, nil
}

// Conversation is what the constructor reads: its sessions' dates and
// dialogue.
type Conversation struct {
	ID                 string
	SpeakerA, SpeakerB string
	Sessions           []SessionText
}

// SessionText is one session.
type SessionText struct {
	N     int
	Date  string
	Lines []Line
}

// Extractor turns one session into pages: the extraction agent
// (ModelExtractor) or, to measure the database without a model, Windows.
type Extractor func(ctx context.Context, session int, date string, lines []Line) ([]Page, error)

// ModelExtractor is the extraction agent on m: one call a session.
func ModelExtractor(m llm.Model) Extractor {
	return func(ctx context.Context, session int, date string, lines []Line) ([]Page, error) {
		return Extract(ctx, m, session, date, lines)
	}
}

// Build extracts every session of c into the database under c.ID, one
// extractor call a session, unless it already holds pages (a database is
// built once and asked many times). A session whose extraction fails is
// stored whole (WholeSession) and counted; log hears why.
func (d *DB) Build(ctx context.Context, extract Extractor, c Conversation, log func(string)) (failed int, err error) {
	n, err := d.Count(ctx, c.ID)
	if err != nil || n > 0 {
		return 0, err
	}
	var pages []Page
	for _, s := range c.Sessions {
		if len(s.Lines) == 0 {
			continue
		}
		ps, err := extract(ctx, s.N, s.Date, s.Lines)
		if ctx.Err() != nil {
			return failed, ctx.Err()
		}
		if err != nil {
			failed++
			if log != nil {
				log(fmt.Sprintf("%s session %d: extraction failed, stored whole: %v", c.ID, s.N, err))
			}
			ps = []Page{WholeSession(s.N, s.Date, s.Lines)}
		}
		pages = append(pages, ps...)
	}
	return failed, d.Add(ctx, c.ID, pages)
}
