package memtools

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/agemem/agemem/memtools/stm"
)

// Completion is a policy's reply to one prompt. Native policies also return
// the token ids of the prompt and the response with the log-probability of
// each sampled token, which training needs; other policies leave them nil.
type Completion struct {
	Text             string    `json:"text"`
	PromptTokens     int       `json:"prompt_tokens"`
	CompletionTokens int       `json:"completion_tokens"`
	PromptIDs        []int     `json:"-"`
	ResponseIDs      []int     `json:"-"`
	LogProbs         []float32 `json:"-"`
	// FinishReason is "stop" (the model ended its turn) or "length" (the
	// response budget ran out); empty where the policy does not say.
	FinishReason string `json:"finish_reason,omitempty"`
}

// ErrContextFull is what a Policy's error is (errors.Is) when the
// conversation no longer fits the model: the agent let its context grow past
// what the model can read. Episodes end there as failed tasks; serve answers
// 400 context_length_exceeded.
var ErrContextFull = errors.New("the conversation no longer fits the model's context")

// Policy turns a conversation into the next assistant message.
type Policy interface {
	Complete(ctx context.Context, msgs []stm.Message) (Completion, error)
}

// BatchPolicy completes many conversations at once: the K rollouts of a
// group, concurrent requests.
type BatchPolicy interface {
	Policy
	CompleteBatch(ctx context.Context, convs [][]stm.Message) ([]Completion, error)
}

// Limits bound one run of the loop.
type Limits struct {
	MaxSteps      int // policy calls for this turn
	ContextBudget int // T_max in tokens; exceeding it is an overflow
}

// Step is one policy call and what came of it: one experience e_t of
// Section 3.1 once the rollout adds rewards.
type Step struct {
	Prompt       []stm.Message `json:"prompt"`
	PromptTokens int           `json:"prompt_tokens"` // T of the context sent
	Completion   Completion    `json:"completion"`
	Parsed       Parsed        `json:"parsed"`
	Results      []Result      `json:"results"`
	Overflow     bool          `json:"overflow"` // the prompt exceeded the budget
}

// Trace is the record of one run.
type Trace struct {
	Steps        []Step `json:"steps"`
	Answer       string `json:"answer"`
	HasAnswer    bool   `json:"has_answer"`
	FormatErrors int    `json:"format_errors"` // responses that broke the format
	// ContextFull: the run stopped because the prompt no longer fit the
	// model (the policy's error was ErrContextFull).
	ContextFull  bool `json:"context_full,omitempty"`
	StepLimitHit bool `json:"step_limit_hit"`
}

// ToolCalls counts successful calls by tool name.
func (t Trace) ToolCalls() map[string]int {
	n := map[string]int{}
	for _, s := range t.Steps {
		for _, r := range s.Results {
			if r.OK {
				n[r.Name]++
			}
		}
	}
	return n
}

// Run lets the policy act on the runtime's context until it answers or uses
// up lim.MaxSteps: each step sends the context, appends the response,
// executes its tool calls in order and appends their results. A malformed
// response becomes a tool message saying what was wrong. The error return is
// for failures of the policy or the store, never of the model's output.
func Run(ctx context.Context, p Policy, rt *Runtime, lim Limits) (Trace, error) {
	var tr Trace
	for step := 0; step < max(lim.MaxSteps, 1); step++ {
		prompt := rt.Context.Messages()
		st := Step{Prompt: prompt, PromptTokens: rt.Context.Tokens()}
		st.Overflow = lim.ContextBudget > 0 && st.PromptTokens > lim.ContextBudget
		c, err := p.Complete(ctx, prompt)
		if err != nil {
			tr.ContextFull = errors.Is(err, ErrContextFull)
			return tr, fmt.Errorf("policy, step %d: %w", step+1, err)
		}
		st.Completion = c
		st.Parsed = Parse(c.Text)
		rt.Context.Append(stm.Message{Role: stm.Assistant, Content: c.Text})
		for _, call := range st.Parsed.Calls {
			r, err := rt.Execute(ctx, call)
			st.Results = append(st.Results, r)
			rt.Context.Append(stm.Message{Role: stm.Tool, Name: call.Name, Content: r.Content})
			if err != nil {
				tr.Steps = append(tr.Steps, st)
				return tr, fmt.Errorf("tool %s, step %d: %w", call.Name, step+1, err)
			}
		}
		if len(st.Parsed.Errors) > 0 {
			tr.FormatErrors++
			rt.Context.Append(stm.Message{Role: stm.Tool, Name: "format", Content: FormatErrorMessage(st.Parsed.Errors)})
		}
		tr.Steps = append(tr.Steps, st)
		if st.Parsed.HasAnswer {
			tr.Answer, tr.HasAnswer = st.Parsed.Answer, true
			return tr, nil
		}
	}
	tr.StepLimitHit = true
	return tr, nil
}

// FormatErrorMessage is the tool message a malformed response earns.
func FormatErrorMessage(errs []string) string {
	return toJSON(map[string]any{
		"status": "error",
		"error":  "response format: " + strings.Join(errs, "; "),
		"hint":   "Reply as <think>...</think> followed by exactly one <tool_call>[...]</tool_call> or <answer>...</answer>.",
	})
}
