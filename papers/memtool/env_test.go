package memtool

import (
	"context"
	"math"
	"slices"
	"strings"
	"testing"

	"github.com/agemem/agemem/bench/stabletoolbench"
	"github.com/agemem/agemem/llm"
	"github.com/agemem/agemem/model/chat"
	"github.com/agemem/agemem/rl/rollout"
)

// counted counts a policy's calls.
type counted struct {
	llm.Model
	calls int
}

func (c *counted) Chat(ctx context.Context, req llm.Request) (llm.Response, error) {
	c.calls++
	return c.Model.Chat(ctx, req)
}

// hoarder searches for the query's gold tools and calls them, and never
// removes a tool.
func hoarder(o Oracle) llm.Model {
	return modelFunc(func(msgs []chat.Message, specs []chat.Function) (llm.Response, error) {
		var noRemove []chat.Function
		for _, s := range specs {
			if s.Name != RemoveTools {
				noRemove = append(noRemove, s)
			}
		}
		return o.Chat(context.Background(), llm.Request{Messages: msgs, Tools: noRemove})
	})
}

// The Autonomous mode as an environment: a policy that prunes (the oracle)
// calls every gold tool,
// removes what it added and stays under L; one that never removes hits L,
// fails the queries it cannot load tools for and scores less.
func TestEnvRewardsPruning(t *testing.T) {
	kb, qs := bench(t, 60, 24)
	c := cfg(Autonomous)
	c.Limit, c.TopK, c.Train.Turns = 16, 3, 6
	e, err := NewEnv(c, kb, qs)
	if err != nil {
		t.Fatal(err)
	}
	if e.Len() != 4 {
		t.Fatalf("24 queries in sessions of 6 make %d tasks", e.Len())
	}
	r := NewReward(c.Train)
	score := func(m llm.Model, task int) (Episode, float64, map[string]float64) {
		p := &counted{Model: m}
		ep, err := e.Play(context.Background(), p, task, 0)
		if err != nil {
			t.Fatal(err)
		}
		if p.calls < len(ep.Turns) {
			t.Fatalf("%d policy calls for %d turns", p.calls, len(ep.Turns))
		}
		s, err := r.Score(context.Background(), ep)
		if err != nil {
			t.Fatal(err)
		}
		return ep, s.Total, s.Parts
	}
	var oracleSum, hoarderSum float64
	hits := 0
	for task := range e.Len() {
		ep, total, parts := score(oracleFor(kb, qs), task)
		if parts["tool_correctness"] != 1 || parts["under_limit"] != 1 || parts["removal_ratio"] <= 0 {
			t.Fatalf("task %d, the oracle: %v (turns %+v)", task, parts, ep.Turns)
		}
		if want := parts["tool_correctness"] + 0.5*parts["removal_ratio"] + 0.5*parts["under_limit"]; math.Abs(total-want) > 1e-12 {
			t.Fatalf("total %v, the weighted parts make %v", total, want)
		}
		oracleSum += total
		ep, total, _ = score(hoarder(oracleFor(kb, qs)), task)
		for _, tr := range ep.Turns {
			hits += tr.LimitHits
			if len(tr.Removed) > 0 {
				t.Fatalf("the hoarder removed %v", tr.Removed)
			}
		}
		hoarderSum += total
	}
	t.Logf("mean reward: pruning %.3f, hoarding %.3f (%d limit hits)", oracleSum/4, hoarderSum/4, hits)
	if hits == 0 || hoarderSum >= oracleSum {
		t.Fatalf("hoarding: %d limit hits, reward %.3f against pruning's %.3f", hits, hoarderSum, oracleSum)
	}
}

// The reward of a hand-worked episode, and the environment's bad input.
func TestRewardHandWorkedAndEnvErrors(t *testing.T) {
	ep := Episode{
		Turns: []TurnResult{{Added: []string{"a", "b"}, Called: []string{"a"}},
			{Added: []string{"c"}, Removed: []string{"b"}, Called: []string{"c"}, LimitHits: 1},
			{Error: "turn 3: the prompt is too long"}},
		Gold: [][]string{{"a"}, {"c", "d"}, {"e"}},
	}
	s, err := Reward{WCorrect: 1, WRemoval: 0.5, WLimit: 2}.Score(context.Background(), ep)
	if err != nil {
		t.Fatal(err)
	}
	// correctness (1 + 1/2 + 0)/3; removal 1/3; under the limit 1/3 (turn 2
	// hit it, turn 3 failed).
	want := map[string]float64{"tool_correctness": 0.5, "removal_ratio": 1.0 / 3, "under_limit": 1.0 / 3}
	for k, v := range want {
		if math.Abs(s.Parts[k]-v) > 1e-12 {
			t.Errorf("%s = %v, want %v", k, s.Parts[k], v)
		}
	}
	if math.Abs(s.Total-(0.5+0.5/3+2.0/3)) > 1e-12 {
		t.Errorf("total %v", s.Total)
	}
	// A validated session's reward: the same parts, over its turns.
	if j := (Reward{WCorrect: 1, WRemoval: 0.5, WLimit: 2}).Session(SessionScore{Metrics: Metrics{ToolCorrectness: 0.5, RemovalRatio: 1.5}, UnderLimit: 0.25}); math.Abs(j-1.5) > 1e-12 {
		t.Errorf("a session's reward %v, want 0.5 + 0.5 x 1 + 2 x 0.25", j)
	}
	// Removing more than was added counts as complete, no more.
	s, _ = Reward{WRemoval: 1}.Score(context.Background(), Episode{Turns: []TurnResult{{Added: []string{"a"}}, {Removed: []string{"a", "x", "y"}}}, Gold: [][]string{nil, nil}})
	if s.Total != 1 {
		t.Errorf("removal ratio capped at 1: total %v", s.Total)
	}

	kb, qs := bench(t, 20, 6)
	c := cfg(Autonomous)
	if _, err := NewEnv(c, kb, nil); err == nil || !strings.Contains(err.Error(), "no training queries") {
		t.Errorf("no queries: %v", err)
	}
	bad := append([]stabletoolbench.Query{}, qs...)
	bad[2].Gold = []string{"NoSuchTool"}
	if _, err := NewEnv(c, kb, bad); err == nil || !strings.Contains(err.Error(), `"NoSuchTool"`) {
		t.Errorf("unknown gold tool: %v", err)
	}
	c.Train.Turns, c.Train.WRemoval = 0, math.NaN()
	if _, err := NewEnv(c, kb, qs); err == nil || !strings.Contains(err.Error(), "train.turns") || !strings.Contains(err.Error(), "train.w_removal") {
		t.Errorf("bad train section: %v", err)
	}
}

// blunderer is the oracle writing its search as a removal every other
// time it searches (the call a learning policy was seen to write: a
// removal with the search's arguments, which fails its schema). Each
// reply's token ids are (its call number, 1 when it blundered).
type blunderer struct {
	o        Oracle
	n, other int
}

func (b *blunderer) use(o Oracle) { b.o = o }

func (b *blunderer) Chat(ctx context.Context, req llm.Request) (llm.Response, error) {
	r, err := b.o.Chat(ctx, req)
	if err != nil {
		return r, err
	}
	bad := 0
	for i, c := range r.Message.ToolCalls {
		if c.Name == SearchTools {
			if b.other++; b.other%2 == 1 {
				r.Message.ToolCalls[i].Name, bad = RemoveTools, 1
			}
		}
	}
	r.ResponseIDs = []int{b.n, bad}
	b.n++
	return r, nil
}

// TestFailedCallsAreTheRecordedCalls: the calls whose tool calls failed
// are charged by their place among the calls the rollout recorder keeps,
// so the shaping lands on the blundered call's tokens and no other.
func TestFailedCallsAreTheRecordedCalls(t *testing.T) {
	c := cfg(Autonomous)
	c.Train.WFailedCall = 0.75
	blunders, sc, ep := shaped(t, c, &blunderer{}, 1, -0.75)
	if blunders < 3 || len(ep.FailedCalls) != blunders || sc.Parts["failed_calls"] != float64(blunders) {
		t.Fatalf("%d blunders, failed calls %v (part %v)", blunders, ep.FailedCalls, sc.Parts["failed_calls"])
	}
	// Without the weight the calls are not shaped.
	c.Train.WFailedCall = 0
	if sc, _ = NewReward(c.Train).Score(context.Background(), ep); sc.Calls != nil {
		t.Fatalf("w_failed_call 0 shaped the calls: %v", sc.Calls)
	}
}

// everyOther is the oracle with its reply edited in every other message
// in which the oracle calls domain tools (it calls all of a question's in
// one). Its reply's second token marks the edited replies.
type everyOther struct {
	o    Oracle
	n, k int
	edit func(llm.Request, *llm.Response) bool
}

func (e *everyOther) use(o Oracle) { e.o = o }

func (e *everyOther) Chat(ctx context.Context, req llm.Request) (llm.Response, error) {
	r, err := e.o.Chat(ctx, req)
	if err != nil {
		return r, err
	}
	edited := 0
	calls := r.Message.ToolCalls
	if len(calls) > 0 && !slices.ContainsFunc(calls, func(c chat.ToolCall) bool { return c.Name == SearchTools || c.Name == RemoveTools }) {
		if e.k++; e.k%2 == 1 && e.edit(req, &r) {
			edited = 1
		}
	}
	r.ResponseIDs = []int{e.n, edited}
	e.n++
	return r, nil
}

// quitter answers in place of the edited messages: those turns end with
// none of their gold tools called.
func quitter() *everyOther {
	return &everyOther{edit: func(_ llm.Request, r *llm.Response) bool {
		r.Message.ToolCalls, r.Message.Content = nil, "I could not find that."
		return true
	}}
}

// strayer adds to the edited messages a call of a loaded tool they do not
// call (one the question did not ask for).
func strayer() *everyOther {
	return &everyOther{edit: func(req llm.Request, r *llm.Response) bool {
		calls := r.Message.ToolCalls
		for _, f := range req.Tools {
			if f.Name != SearchTools && f.Name != RemoveTools && !slices.ContainsFunc(calls, func(c chat.ToolCall) bool { return c.Name == f.Name }) {
				r.Message.ToolCalls = append(calls, chat.ToolCall{ID: "stray", Name: f.Name, Arguments: "{}"})
				return true
			}
		}
		return false
	}}
}

// TestMissedToolsChargeTheAnswer: a turn that answers before calling its
// gold tools has w_missed_tool times the share it missed charged to the
// answering call, by the place the rollout recorder gives it; answers
// after the gold tools ran, and every other call, are not charged.
func TestMissedToolsChargeTheAnswer(t *testing.T) {
	c := cfg(Autonomous)
	c.Train.WMissedTool = 0.5
	quits, sc, ep := shaped(t, c, quitter(), 0, -0.5)
	if quits != 3 || sc.Parts["missed_at_answer"] != 3 || len(ep.AnswerCalls) != 6 {
		t.Fatalf("%d early answers, part %v, answer calls %v", quits, sc.Parts["missed_at_answer"], ep.AnswerCalls)
	}
	c.Train.WMissedTool = 0
	if sc, _ = NewReward(c.Train).Score(context.Background(), ep); sc.Calls != nil {
		t.Fatalf("w_missed_tool 0 shaped the calls: %v", sc.Calls)
	}
}

// TestWrongToolsChargeTheirCall: a call that runs a loaded tool the
// question did not ask for has w_wrong_tool charged to it alone.
func TestWrongToolsChargeTheirCall(t *testing.T) {
	c := cfg(Autonomous)
	c.Train.WWrongTool = 0.25
	strays, sc, _ := shaped(t, c, strayer(), 1, -0.25)
	if strays < 2 || sc.Parts["wrong_calls"] != float64(strays) {
		t.Fatalf("%d stray calls, part %v", strays, sc.Parts["wrong_calls"])
	}
}

// shaped plays task t of the test world with the model m through
// rollout.Run (so calls are numbered as the trainer numbers them), scores
// it with c.Train's reward, and checks that every call whose reply's
// second token is 1 (what the model marked) is shaped by want and every
// other call by nothing. It returns the marked calls, the score and the
// episode.
func shaped(t *testing.T, c Config, m llm.Model, task int, want float64) (int, rollout.Score, Episode) {
	t.Helper()
	kb, qs := bench(t, 40, 12)
	c.Limit, c.TopK, c.Train.Turns = 16, 3, 6
	e, err := NewEnv(c, kb, qs)
	if err != nil {
		t.Fatal(err)
	}
	if o, ok := m.(interface{ use(Oracle) }); ok {
		o.use(oracleFor(kb, qs))
	}
	rs, exps, err := rollout.Run(context.Background(), m, rollout.Env[Episode](e), []int{task}, rollout.Options{K: 1})
	if err != nil {
		t.Fatal(err)
	}
	sc, err := NewReward(c.Train).Score(context.Background(), rs[0].Result)
	if err != nil {
		t.Fatal(err)
	}
	marked := 0
	for _, x := range exps {
		w := 0.0
		if x.ResponseIDs[1] == 1 {
			w = want
			marked++
		}
		got := 0.0
		if x.Call < len(sc.Calls) {
			got = sc.Calls[x.Call]
		}
		if got != w {
			t.Fatalf("call %d (reply %v) is shaped %v, want %v; episode %+v", x.Call, x.ResponseIDs, got, w, rs[0].Result)
		}
	}
	return marked, sc, rs[0].Result
}
