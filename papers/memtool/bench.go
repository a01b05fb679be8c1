package memtool

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"github.com/agemem/agemem/agent"
	"github.com/agemem/agemem/bench/stabletoolbench"
	"github.com/agemem/agemem/bench/toolret"
	"github.com/agemem/agemem/llm"
	"github.com/agemem/agemem/model/chat"
)

// Judge scores an answer's task completion in [0, 1] (Eq. 4), given what
// each of the query's gold tools returns (Bench's expected: the simulator's
// figure, or what a live tool returned in the turn; "" when it never ran).
type Judge interface {
	Score(ctx context.Context, q stabletoolbench.Query, answer string, expected map[string]string) (float64, error)
}

// ContainsJudge needs no model: the share of the query's gold tools whose
// expected result the answer states verbatim. It fits the generated
// benchmark, whose tools return known figures (stabletoolbench.Value); a live tool's whole
// result is stated verbatim by the oracle but rarely by a model, which the
// model judge grades instead.
type ContainsJudge struct{}

// Score implements Judge.
func (ContainsJudge) Score(_ context.Context, q stabletoolbench.Query, answer string, expected map[string]string) (float64, error) {
	if len(q.Gold) == 0 {
		return 0, nil
	}
	hit := 0
	for _, g := range q.Gold {
		if e := expected[g]; e != "" && strings.Contains(answer, e) {
			hit++
		}
	}
	return float64(hit) / float64(len(q.Gold)), nil
}

// ModelJudge asks a model for the alignment of the answer with what the
// query's tools return (DeepEval's task completion, which the paper used
// with GPT-4o mini, is such a score).
type ModelJudge struct{ Model llm.Model }

const judgePrompt = `You grade an assistant's answer. Given the user's question, the results the right tools return and the answer, reply with one number between 0 and 1: how completely and correctly the answer gives what the question asks for. Reply with the number only.`

var number = regexp.MustCompile(`[01](?:\.\d+)?|\.\d+`)

// Score implements Judge.
func (j ModelJudge) Score(ctx context.Context, q stabletoolbench.Query, answer string, expected map[string]string) (float64, error) {
	var exp []string
	for _, g := range q.Gold {
		if e := expected[g]; e != "" {
			exp = append(exp, g+" returns "+e)
		} else {
			exp = append(exp, g+" was not called, so what it returns is unknown")
		}
	}
	msg := fmt.Sprintf("Question: %s\nExpected tool results: %s\nAnswer: %s", q.Text, strings.Join(exp, "; "), answer)
	r, err := j.Model.Chat(ctx, llm.Request{Messages: []chat.Message{{Role: "system", Content: judgePrompt}, {Role: "user", Content: msg}}})
	if err != nil {
		return 0, fmt.Errorf("memtool: the judge: %w", err)
	}
	m := number.FindString(r.Message.Content)
	v, err := strconv.ParseFloat(m, 64)
	if err != nil {
		return 0, nil // no score given: no credit
	}
	return math.Min(math.Max(v, 0), 1), nil
}

// BenchOptions are a benchmark run's inputs.
type BenchOptions struct {
	Config            Config
	Modes             []string
	Agent, Controller llm.Model
	Judge             Judge
	KB                *agent.Catalog
	// Exec runs the domain tools: nil is the simulator (stabletoolbench.Simulate), whose
	// figures the judge knows; live tools (Upstream) are judged by what
	// they returned in the turn.
	Exec    Executor
	Queries []stabletoolbench.Query
	Log     io.Writer
}

// ModeReport is one mode's session.
type ModeReport struct {
	Mode    string       `json:"mode"`
	Metrics Metrics      `json:"metrics"`
	Counts  []int        `json:"tool_count_per_turn"`
	Turns   []TurnResult `json:"turns"`
}

// Report is a benchmark run.
type Report struct {
	Tools     int `json:"tools"`
	Turns     int `json:"turns"`
	Limit     int `json:"limit"`
	TopK      int `json:"top_k"`
	Retrieval struct {
		K      int     `json:"k"`
		Recall float64 `json:"recall"`
		NDCG   float64 `json:"ndcg"`
	} `json:"retrieval"`
	Modes []ModeReport `json:"modes"`
}

// Bench plays the first Config.Bench.Turns queries as one session per
// mode and measures each, and the knowledge base's recall@TopK of the
// queries' gold tools (no LLM involved).
func Bench(ctx context.Context, o BenchOptions) (Report, error) {
	qs := o.Queries[:min(o.Config.Bench.Turns, len(o.Queries))]
	rep := Report{Tools: o.KB.Len(), Turns: len(qs), Limit: o.Config.Limit, TopK: o.Config.TopK}
	runs, qrels := map[string]toolret.Run{}, map[string]toolret.Qrels{}
	for i, q := range qs {
		sc, err := o.KB.Scores(ctx, q.Text, o.Config.TopK)
		if err != nil {
			return rep, err
		}
		id := strconv.Itoa(i)
		runs[id], qrels[id] = sc, toolret.Qrels{}
		for _, g := range q.Gold {
			qrels[id][g] = 1
		}
	}
	m, _, _ := toolret.Mean(runs, qrels, o.Config.TopK)
	rep.Retrieval.K, rep.Retrieval.Recall, rep.Retrieval.NDCG = o.Config.TopK, m.Recall, m.NDCG
	for _, mode := range o.Modes {
		c := o.Config
		c.Mode = mode
		exec := o.Exec
		if exec == nil {
			exec = stabletoolbench.Simulate
		}
		s := &Conversation{Config: c, Agent: o.Agent, Controller: o.Controller, KB: o.KB, Exec: exec}
		mr := ModeReport{Mode: mode}
		var gold [][]string
		var completion []float64
		for i, q := range qs {
			t, err := s.Turn(ctx, q.Text)
			if err != nil {
				if ctx.Err() != nil {
					return rep, err
				}
				// A model that fails a turn (a prompt past its context, a
				// server error after retries) fails that turn, not the
				// session, as an API rejecting too many tools would.
				t.Error = fmt.Sprintf("turn %d (query %s): %v", i+1, q.ID, err)
				if o.Log != nil {
					fmt.Fprintf(o.Log, "memtool %s: %s\n", mode, t.Error)
				}
			}
			score, err := o.Judge.Score(ctx, q, t.Answer, expected(q, t, o.Exec == nil))
			if err != nil {
				return rep, err
			}
			mr.Turns = append(mr.Turns, t)
			mr.Counts = append(mr.Counts, t.Count)
			gold = append(gold, q.Gold)
			completion = append(completion, score)
			if o.Log != nil && ((i+1)%10 == 0 || i+1 == len(qs)) {
				fmt.Fprintf(o.Log, "memtool %s: turn %d/%d, %d tools loaded\n", mode, i+1, len(qs), t.Count)
			}
		}
		mr.Metrics = Measure(mr.Turns, gold, completion)
		rep.Modes = append(rep.Modes, mr)
	}
	return rep, nil
}

// expected is what each of q's gold tools returns: the simulator's figure,
// or the result of the tool's last successful call in turn t.
func expected(q stabletoolbench.Query, t TurnResult, simulated bool) map[string]string {
	out := map[string]string{}
	if simulated {
		for _, g := range q.Gold {
			out[g] = stabletoolbench.Value(g)
		}
		return out
	}
	for _, st := range t.Trace.Steps {
		for _, r := range st.Results {
			if r.OK && slices.Contains(q.Gold, r.Call.Name) {
				out[r.Call.Name] = r.Result
			}
		}
	}
	return out
}

// Oracle is a scripted model that plays every role perfectly, knowing
// each query's gold tools: as the agent it removes the loaded tools the
// query does not need (when it can), searches for the missing ones by
// their descriptions, calls the gold tools and answers with their results;
// as the controller it prunes and searches the same way. It checks the
// modes' control flow and the metrics, and is the benchmark's ceiling.
type Oracle struct {
	Gold map[string][]string // query text → gold tool names
	KB   *agent.Catalog
}

var userQuery = regexp.MustCompile("(?s)User Query: `(.*)` ")

// Chat implements llm.Model.
func (o Oracle) Chat(_ context.Context, req llm.Request) (llm.Response, error) {
	has := func(name string) bool {
		return slices.ContainsFunc(req.Tools, func(s chat.Function) bool { return s.Name == name })
	}
	call := func(name string, args any) llm.Response {
		b, _ := json.Marshal(args)
		return llm.Response{Message: chat.Message{Role: "assistant", ToolCalls: []chat.ToolCall{{Name: name, Arguments: string(b)}}}}
	}
	last := req.Messages[len(req.Messages)-1]
	switch {
	case has("remove_tools") || has("search_tools"): // the controller's prune or search
		m := userQuery.FindStringSubmatch(last.Content)
		if m == nil {
			return llm.Response{}, fmt.Errorf("oracle: no user query in %q", last.Content)
		}
		gold := o.Gold[m[1]]
		var existing []string
		if _, list, ok := strings.Cut(last.Content, "```\n"); ok {
			list, _, _ = strings.Cut(list, "```")
			for _, line := range strings.Split(strings.TrimSpace(list), "\n") {
				if name, _, ok := strings.Cut(line, ":"); ok {
					existing = append(existing, name)
				}
			}
		}
		if has("remove_tools") {
			return call("remove_tools", map[string][]string{"tool_names": without(existing, gold)}), nil
		}
		return call("search_tools", map[string][]string{"keywords": o.keywords(without(gold, existing))}), nil
	case len(req.Tools) == 0: // a summary
		return llm.Response{Message: chat.Message{Role: "assistant", Content: "The user asked for company figures, which were given."}}, nil
	}
	u := len(req.Messages) - 1
	for req.Messages[u].Role != "user" {
		u--
	}
	gold := o.Gold[req.Messages[u].Content]
	did := map[string]bool{}
	results := map[string]string{}
	for _, m := range req.Messages[u+1:] {
		for _, c := range m.ToolCalls {
			did[c.Name] = true
		}
		if m.Role == "tool" {
			results[m.Name] = m.Content
		}
	}
	var loaded []string
	for _, s := range req.Tools {
		if !strings.HasPrefix(s.Name, "SYS_") {
			loaded = append(loaded, s.Name)
		}
	}
	if extra := without(loaded, gold); has(RemoveTools) && !did[RemoveTools] && !did[SearchTools] && len(extra) > 0 {
		return call(RemoveTools, map[string][]string{"tool_names": extra}), nil
	}
	if missing := without(gold, loaded); has(SearchTools) && !did[SearchTools] && len(missing) > 0 {
		return call(SearchTools, map[string][]string{"keywords": o.keywords(missing)}), nil
	}
	var calls []chat.ToolCall
	for _, g := range gold {
		if slices.Contains(loaded, g) && !did[g] {
			calls = append(calls, chat.ToolCall{Name: g, Arguments: "{}"})
		}
	}
	if len(calls) > 0 {
		return llm.Response{Message: chat.Message{Role: "assistant", ToolCalls: calls}}, nil
	}
	var parts []string
	for _, g := range gold {
		if r, ok := results[g]; ok {
			parts = append(parts, g+": "+r)
		}
	}
	if len(parts) == 0 {
		return llm.Response{Message: chat.Message{Role: "assistant", Content: "I cannot answer the question with the available tools."}}, nil
	}
	return llm.Response{Message: chat.Message{Role: "assistant", Content: strings.Join(parts, "; ")}}, nil
}

// keywords are the tools' descriptions, which retrieve them.
func (o Oracle) keywords(names []string) []string {
	var out []string
	for _, n := range names {
		if t, ok := o.KB.Get(n); ok {
			out = append(out, t.Description)
		}
	}
	return out
}

func without(xs, drop []string) []string {
	var out []string
	for _, x := range xs {
		if !slices.Contains(drop, x) {
			out = append(out, x)
		}
	}
	return out
}
