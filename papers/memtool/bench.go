package memtool

import (
	"context"
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
		// OracleRecall is the recall@K of the gold tools when each is
		// searched for with the oracle's keyword (Oracle.Keyword): what
		// the knowledge base allows a perfect agent, beside Recall, what
		// the query text alone finds.
		OracleRecall float64 `json:"oracle_recall"`
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
	var err error
	if rep.Retrieval.OracleRecall, err = OracleRecall(ctx, o.KB, qs, o.Config.TopK); err != nil {
		return rep, err
	}
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

// OracleRecall is the mean over queries of the share of their gold tools
// that the oracle's keyword for each (Oracle.Keyword) retrieves within the
// top k.
func OracleRecall(ctx context.Context, kb *agent.Catalog, qs []stabletoolbench.Query, k int) (float64, error) {
	o := Oracle{KB: kb, TopK: k}
	var sum float64
	n := 0
	for _, q := range qs {
		if len(q.Gold) == 0 {
			continue
		}
		found := 0
		for _, g := range q.Gold {
			kw, err := o.Keyword(ctx, q.Text, g)
			if err != nil {
				return 0, err
			}
			if kw == "" {
				continue
			}
			hits, err := kb.Rank(ctx, []string{kw}, k)
			if err != nil {
				return 0, err
			}
			if slices.ContainsFunc(hits[0], func(h agent.Hit) bool { return h.Name == g }) {
				found++
			}
		}
		sum += float64(found) / float64(len(q.Gold))
		n++
	}
	if n == 0 {
		return 0, nil
	}
	return sum / float64(n), nil
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
