package reward

import (
	"context"

	"github.com/agemem/agemem/env"
	"github.com/agemem/agemem/memtools"
	"github.com/agemem/agemem/model/chat"
)

// Observation is what the reward reads from a played episode, before any
// judgement: a pure function of the trace.
type Observation struct {
	Answered      bool
	Answer        string
	ContextTokens int // T_used when the answer was given (Eq. 19)
	// Reduced: a Summary_context or Filter_context succeeded;
	// OverflowBeforeReduction: a prompt overflowed before the first one.
	Reduced, OverflowBeforeReduction bool
	Overflowed                       bool // some prompt exceeded T_max or the agent's budget
	RoundsOver                       bool // some turn ran out of steps
	Maintained                       bool // an Update_memory or Delete_memory succeeded
	// FinalPrompt is the context the last call saw (Eq. 21).
	FinalPrompt []chat.Message
	Stored      []string // the entries Stage 1 added (Eq. 23)
	Retrieved   []string // the memories Stage 3 retrieved (Eq. 25)
	// FormatErrors counts the replies that broke the format
	// (env.Result.FormatErrors).
	FormatErrors int
}

// Observe walks an episode's steps in order.
func Observe(r env.Result, tmax int) Observation {
	o := Observation{Answered: r.HasAnswer, Answer: r.Answer, ContextTokens: r.ContextTokens, FormatErrors: r.FormatErrors()}
	for stage, turns := range r.Stages {
		for _, turn := range turns {
			o.RoundsOver = o.RoundsOver || turn.Trace.StepLimitHit
			for _, s := range turn.Trace.Steps {
				if s.Overflow || s.PromptTokens > tmax {
					o.Overflowed = true
					o.OverflowBeforeReduction = o.OverflowBeforeReduction || !o.Reduced
				}
				o.FinalPrompt = s.Prompt
				for _, res := range s.Results {
					if !res.OK {
						continue
					}
					switch res.Name {
					case memtools.ToolSummary, memtools.ToolFilter:
						o.Reduced = true
					case memtools.ToolUpdate, memtools.ToolDelete:
						o.Maintained = true
					case memtools.ToolAdd:
						if stage == 0 && res.Entry != nil {
							o.Stored = append(o.Stored, res.Entry.Content)
						}
					case memtools.ToolRetrieve:
						if stage == 2 {
							for _, m := range res.Retrieved {
								o.Retrieved = append(o.Retrieved, m.Content)
							}
						}
					}
				}
			}
		}
	}
	return o
}

// Verdicts are the judges' answers about an observation.
type Verdicts struct {
	Task       float64 // S_judge(A_pred, A_q) of Eq. 17
	StoredGood int     // the stored entries judged high quality (Eq. 23)
	Relevance  float64 // S_LLM(R, q) of Eq. 25; 0 when nothing was retrieved
}

// Ask puts to the judges what the equations need judged.
func Ask(ctx context.Context, j Judges, t env.Task, o Observation) (Verdicts, error) {
	var v Verdicts
	var err error
	if o.Answered {
		if v.Task, err = j.Task.Score(ctx, t.Question, t.Answer, o.Answer); err != nil {
			return v, err
		}
	}
	for _, e := range o.Stored {
		good, err := j.Storage.HighQuality(ctx, t, e)
		if err != nil {
			return v, err
		}
		if good {
			v.StoredGood++
		}
	}
	if len(o.Retrieved) > 0 {
		if v.Relevance, err = j.Relevance.Relevance(ctx, t.Question, o.Retrieved); err != nil {
			return v, err
		}
	}
	return v, nil
}
