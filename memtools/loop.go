package memtools

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/agemem/agemem/llm"
	"github.com/agemem/agemem/memtools/stm"
	"github.com/agemem/agemem/model/chat"
)

// Limits bound one run of the loop.
type Limits struct {
	MaxSteps      int // policy calls for this turn
	ContextBudget int // T_max in tokens; exceeding it is an overflow
}

// Step is one policy call and what came of it: one experience e_t of
// Section 3.1 once the rollout adds rewards.
type Step struct {
	Prompt       []chat.Message `json:"prompt"`
	PromptTokens int            `json:"prompt_tokens"` // T of the context sent
	Response     llm.Response   `json:"response"`
	Parsed       Parsed         `json:"parsed"`
	Results      []Result       `json:"results"`
	Overflow     bool           `json:"overflow"` // the prompt exceeded the budget
}

// Trace is the record of one run.
type Trace struct {
	Steps        []Step `json:"steps"`
	Answer       string `json:"answer"`
	HasAnswer    bool   `json:"has_answer"`
	FormatErrors int    `json:"format_errors"` // responses that broke the format
	// ContextFull: the run stopped because the prompt no longer fit the
	// model (its error was llm.ErrContextFull).
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

// Run lets the model act on the runtime's context until it answers or uses
// up lim.MaxSteps: each step sends the context (AgeMem's text format: the
// model writes its calls as <tool_call> blocks in its reply, see
// FunctionCalling for models that call functions natively), appends the
// response, executes its tool calls in order and appends their results. A
// malformed response becomes a tool message saying what was wrong. The
// error return is for failures of the model or the store, never of the
// model's output.
func Run(ctx context.Context, m llm.Model, rt *Runtime, lim Limits) (Trace, error) {
	var tr Trace
	for step := 0; step < max(lim.MaxSteps, 1); step++ {
		prompt := rt.Context.Messages()
		st := Step{Prompt: prompt, PromptTokens: rt.Context.Tokens()}
		st.Overflow = lim.ContextBudget > 0 && st.PromptTokens > lim.ContextBudget
		r, err := m.Chat(ctx, llm.Request{Messages: prompt})
		if err != nil {
			tr.ContextFull = errors.Is(err, llm.ErrContextFull)
			return tr, fmt.Errorf("model, step %d: %w", step+1, err)
		}
		st.Response = r
		text := r.Message.Content
		st.Parsed = Parse(text)
		rt.Context.Append(chat.Message{Role: stm.Assistant, Content: text})
		for _, call := range st.Parsed.Calls {
			r, err := rt.Execute(ctx, call)
			st.Results = append(st.Results, r)
			rt.Context.Append(chat.Message{Role: stm.Tool, Name: call.Name, Content: r.Content})
			if err != nil {
				tr.Steps = append(tr.Steps, st)
				return tr, fmt.Errorf("tool %s, step %d: %w", call.Name, step+1, err)
			}
		}
		if len(st.Parsed.Errors) > 0 {
			tr.FormatErrors++
			rt.Context.Append(chat.Message{Role: stm.Tool, Name: "format", Content: FormatErrorMessage(st.Parsed.Errors)})
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
