package env

import (
	"context"
	"fmt"
	"strings"

	"github.com/agemem/agemem/bench/locomo"
	"github.com/agemem/agemem/llm"
	"github.com/agemem/agemem/memtools"
	"github.com/agemem/agemem/memtools/stm"
	"github.com/agemem/agemem/model/chat"
)

// LoCoMo answers LoCoMo's questions with an AgeMem policy on the memory
// runtime: each session's turns arrive Chunk at a time as user messages
// from which the policy stores what it judges worth keeping (the context
// reset at each session, as Stage 1 plays a task's turns), then every
// question is asked in a fresh context (the system prompt and the
// question), where the policy retrieves from what it stored and answers.
type LoCoMo struct {
	// NewRuntime gives a conversation its runtime, a fresh long-term store.
	NewRuntime func(seed uint64) *memtools.Runtime
	System     string
	Limits     memtools.Limits
	// Chunk is how many turns one user message carries (at least 1).
	Chunk int
}

// sessionPrompt frames a chunk of a session for the policy.
const sessionPrompt = "From our conversation on %s:\n%s"

// qaQuestion is the question as the policy gets it (LoCoMo's short-answer
// instruction).
const qaQuestion = "Question: %s\nAnswer with a short phrase, in exact words from our conversations where possible."

// Answer plays sample s with policy p and returns a prediction for each of
// its questions. A turn whose prompt outgrows the model is skipped (what it
// would have stored is lost); a question whose prompt does is left
// unanswered. progress hears each question answered.
func (a LoCoMo) Answer(ctx context.Context, p llm.Model, s locomo.Sample, seed uint64, progress func()) ([]locomo.Prediction, error) {
	rt := a.NewRuntime(seed)
	reset := func() {
		rt.Context.Remove(func(int, chat.Message) bool { return true })
		rt.Context.Append(chat.Message{Role: stm.System, Content: a.System})
	}
	chunk := max(a.Chunk, 1)
	for _, ses := range s.Sessions {
		reset()
		for i := 0; i < len(ses.Turns); i += chunk {
			var lines []string
			for _, t := range ses.Turns[i:min(i+chunk, len(ses.Turns))] {
				text := t.Text
				if t.BlipCaption != "" {
					text += " [shares a photo: " + t.BlipCaption + "]"
				}
				lines = append(lines, t.Speaker+": "+text)
			}
			rt.Context.Append(chat.Message{Role: stm.User, Content: fmt.Sprintf(sessionPrompt, ses.DateTime, strings.Join(lines, "\n"))})
			if _, err := memtools.Run(ctx, p, rt, a.Limits); err != nil {
				return nil, fmt.Errorf("%s session %d: %w", s.ID, ses.N, err)
			}
		}
	}
	var out []locomo.Prediction
	for i, q := range s.QA {
		reset()
		rt.Context.Append(chat.Message{Role: stm.User, Content: fmt.Sprintf(qaQuestion, q.Question)})
		tr, err := memtools.Run(ctx, p, rt, a.Limits)
		if err != nil {
			return nil, fmt.Errorf("%s qa %d: %w", s.ID, i, err)
		}
		out = append(out, locomo.Prediction{SampleID: s.ID, QAIndex: i, Prediction: strings.TrimSpace(tr.Answer)})
		if progress != nil {
			progress()
		}
	}
	return out, nil
}
