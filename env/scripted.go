package env

import (
	"context"
	"encoding/json"
	"fmt"
	"hash/fnv"
	"math/rand/v2"
	"regexp"
	"slices"
	"strings"

	"github.com/agemem/agemem/llm"
	"github.com/agemem/agemem/memtools"
	"github.com/agemem/agemem/memtools/stm"
	"github.com/agemem/agemem/model/chat"
)

// Scripted is a policy that needs no model. As the oracle (UseMemory) it
// knows its task's supporting facts: in Stage 1 it stores each fact it is
// shown, in Stage 2 it filters each distractor, in Stage 3 it retrieves and
// answers. Without memory it never calls a tool. Either way it answers the
// gold answer only when every supporting fact is visible in its context,
// and otherwise guesses as a model would, so its score measures what memory
// made available. Error rates make the oracle imperfect, so that a policy
// trained on its episodes leaves RL room to improve.
type Scripted struct {
	Task      Task
	UseMemory bool
	// ForgetRate is the chance of not storing a fact it is shown.
	ForgetRate float64
	// ForgetRelayedRate is the chance of not storing a fact the user only
	// relayed ("A friend mentioned this: ...", Relayed), when above
	// ForgetRate: a blind spot. SFT makes a greedy policy do what its
	// teacher does most often, so a rate under one half anywhere vanishes
	// from it and one over a half everywhere leaves it storing nothing; a
	// blind spot over a half leaves it skipping those facts alone, while
	// sampling still stores some of them: room RL can find.
	ForgetRelayedRate float64
	// KeepDistractorRate is the chance of not filtering a distractor.
	KeepDistractorRate float64
	// Tools are the tools it may call (tools.subset); nil: all six. Without
	// Add_memory it stores nothing, without Filter_context it keeps the
	// distractors, without Retrieve_memory it answers from its context.
	Tools []string
	// Reason makes it think a comparison out before answering it from
	// facts it sees (Reasoning); otherwise its thought only says it can.
	Reason bool
	rng    *rand.Rand
}

// ReasoningAloud sets Reason, and returns s.
func (s *Scripted) ReasoningAloud(on bool) *Scripted {
	s.Reason = on
	return s
}

// Offering limits the tools s calls to tools, and returns s.
func (s *Scripted) Offering(tools []string) *Scripted {
	s.Tools = tools
	return s
}

func (s *Scripted) may(tool string) bool {
	return s.UseMemory && (s.Tools == nil || slices.Contains(s.Tools, tool))
}

// ForgettingRelayed sets ForgetRelayedRate, and returns s.
func (s *Scripted) ForgettingRelayed(rate float64) *Scripted {
	s.ForgetRelayedRate = rate
	return s
}

// NewOracle returns the memory-using scripted policy for t.
func NewOracle(t Task, forgetRate, keepDistractorRate float64, seed uint64) *Scripted {
	return &Scripted{Task: t, UseMemory: true, ForgetRate: forgetRate, KeepDistractorRate: keepDistractorRate, rng: taskRand(t, seed)}
}

// NewNoMemory returns the scripted policy that never calls tools.
func NewNoMemory(t Task) *Scripted { return &Scripted{Task: t, rng: taskRand(t, 0)} }

func taskRand(t Task, seed uint64) *rand.Rand {
	h := fnv.New64a()
	h.Write([]byte(t.ID))
	return rand.New(rand.NewPCG(h.Sum64(), seed))
}

// Complete implements llm.Model.
func (s *Scripted) Chat(_ context.Context, req llm.Request) (llm.Response, error) {
	text := s.respond(req.Messages)
	return llm.Reply(text), nil
}

func (s *Scripted) respond(msgs []chat.Message) string {
	if len(msgs) == 0 {
		return answer("There is nothing to respond to.", "Hello.")
	}
	last := msgs[len(msgs)-1]
	if last.Role != stm.User {
		// A tool result came back: finish the turn.
		if s.isQueryTurn(msgs) {
			return s.answerQuery(msgs)
		}
		return answer("The memory operation is done; acknowledge the user.", "Noted.")
	}
	text, _ := SplitTurn(last.Content)
	switch {
	case strings.Contains(text, s.Task.Question):
		if s.may(memtools.ToolRetrieve) {
			k := max(3, len(s.Task.SupportingFacts))
			return call("The answer depends on facts from earlier conversations; retrieve them from long-term memory.",
				memtools.ToolRetrieve, map[string]any{"query": s.Task.Question, "top_k": k})
		}
		return s.answerQuery(msgs)
	case s.may(memtools.ToolAdd) && s.factsIn(text) != nil:
		var calls []toolCall
		forget := s.ForgetRate
		if Relayed(text) {
			forget = max(forget, s.ForgetRelayedRate)
		}
		for _, f := range s.factsIn(text) {
			if s.rng.Float64() < forget {
				continue
			}
			calls = append(calls, toolCall{memtools.ToolAdd, map[string]any{"content": f, "memory_type": "fact"}})
		}
		if len(calls) == 0 {
			return answer("Nothing here needs storing.", "Noted.")
		}
		return callMany("This is a concrete fact that may be needed later; store it in long-term memory.", calls)
	case s.may(memtools.ToolFilter) && s.isDistractor(text):
		if s.rng.Float64() < s.KeepDistractorRate {
			return answer("This does not concern anything I need.", "Noted.")
		}
		// The first sentence names the distractor's subject; it is short,
		// so the call itself does not re-add what it removes, and it
		// clears theta against the whole message.
		return call("This message is unrelated to what I need; filter it out of the context.",
			memtools.ToolFilter, map[string]any{"criteria": firstSentence(text)})
	}
	return answer("No memory operation is needed.", "Noted.")
}

func (s *Scripted) factsIn(text string) []string {
	var out []string
	for _, f := range s.Task.SupportingFacts {
		if strings.Contains(text, f) {
			out = append(out, f)
		}
	}
	return out
}

func (s *Scripted) isDistractor(text string) bool {
	for _, d := range s.Task.Distractors {
		if strings.TrimSpace(text) == d {
			return true
		}
	}
	return false
}

// isQueryTurn reports whether the latest user message is the Stage 3 query.
func (s *Scripted) isQueryTurn(msgs []chat.Message) bool {
	for i := len(msgs) - 1; i >= 0; i-- {
		if msgs[i].Role == stm.User {
			return strings.Contains(msgs[i].Content, s.Task.Question)
		}
	}
	return false
}

func (s *Scripted) answerQuery(msgs []chat.Message) string {
	if FactsVisible(msgs, s.Task.SupportingFacts) {
		if s.Reason {
			return ReasonedAnswer(s.Task, contextText(msgs, nil))
		}
		return answer(factsVisibleThought, s.Task.Answer)
	}
	return answer("I do not have the facts needed; I can only guess.", Guess(s.Task.Question))
}

// contextText is the messages' text, tool results unescaped (they are
// JSON), each passed through norm when it is not nil.
func contextText(msgs []chat.Message, norm func(string) string) string {
	var all strings.Builder
	for _, m := range msgs {
		c := m.Content
		if m.Role == stm.Tool {
			var v any
			if json.Unmarshal([]byte(c), &v) == nil {
				c = fmt.Sprint(v)
			}
		}
		if norm != nil {
			c = norm(c)
		}
		all.WriteString(c)
		all.WriteString(" | ")
	}
	return all.String()
}

// FactsVisible reports whether every fact appears, after HotpotQA
// normalisation, in the messages (tool results included).
func FactsVisible(msgs []chat.Message, facts []string) bool {
	text := contextText(msgs, NormalizeAnswer)
	for _, f := range facts {
		if !strings.Contains(text, NormalizeAnswer(f)) {
			return false
		}
	}
	return true
}

var optionsRe = regexp.MustCompile(`,\s*(.+?)\s+or\s+(.+?)\?$`)

// Guess is what an agent without the facts answers: the first option of an
// "X or Y?" question, "yes" to a yes/no question, otherwise that it does not
// know.
func Guess(q string) string {
	if m := optionsRe.FindStringSubmatch(q); m != nil {
		return m[1]
	}
	for _, w := range []string{"Are ", "Is ", "Was ", "Were ", "Did ", "Do ", "Does "} {
		if strings.HasPrefix(q, w) {
			return "yes"
		}
	}
	return "I don't know"
}

func answer(think, ans string) string {
	return "<think>" + think + "</think>\n<answer>" + ans + "</answer>"
}

func call(think, name string, args map[string]any) string {
	return callMany(think, []toolCall{{name, args}})
}

// toolCall is written name first, as the prompt's example has it: the
// policy picks the tool, then writes the arguments that tool takes (with
// "arguments" first, a map's order, a small model had to name the tool
// after writing its arguments, and often named the wrong one).
type toolCall struct {
	Name      string         `json:"name"`
	Arguments map[string]any `json:"arguments"`
}

func callMany(think string, calls []toolCall) string {
	b, _ := json.Marshal(calls)
	return "<think>" + think + "</think>\n<tool_call>" + string(b) + "</tool_call>"
}

func firstSentence(s string) string {
	if i := strings.Index(s, ". "); i >= 0 {
		return s[:i+1]
	}
	return s
}
