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
	kb, qs := bench(t, 40, 12)
	c := cfg(Autonomous)
	c.Limit, c.TopK, c.Train.Turns, c.Train.WFailedCall = 16, 3, 6, 0.75
	e, err := NewEnv(c, kb, qs)
	if err != nil {
		t.Fatal(err)
	}
	rs, exps, err := rollout.Run(context.Background(), &blunderer{o: oracleFor(kb, qs)}, rollout.Env[Episode](e), []int{1}, rollout.Options{K: 1})
	if err != nil {
		t.Fatal(err)
	}
	sc, err := NewReward(c.Train).Score(context.Background(), rs[0].Result)
	if err != nil {
		t.Fatal(err)
	}
	blunders := 0
	for _, x := range exps {
		want := 0.0
		if x.ResponseIDs[1] == 1 {
			want = -0.75
			blunders++
		}
		got := 0.0
		if x.Call < len(sc.Calls) {
			got = sc.Calls[x.Call]
		}
		if got != want {
			t.Fatalf("call %d (reply %v) is shaped %v, want %v; failed calls %v", x.Call, x.ResponseIDs, got, want, rs[0].Result.FailedCalls)
		}
	}
	if blunders < 3 || len(rs[0].Result.FailedCalls) != blunders || sc.Parts["failed_calls"] != float64(blunders) {
		t.Fatalf("%d blunders in %d calls, failed calls %v (part %v)", blunders, len(exps), rs[0].Result.FailedCalls, sc.Parts["failed_calls"])
	}
	// Without the weight the calls are not shaped.
	c.Train.WFailedCall = 0
	if sc, _ = NewReward(c.Train).Score(context.Background(), rs[0].Result); sc.Calls != nil {
		t.Fatalf("w_failed_call 0 shaped the calls: %v", sc.Calls)
	}
}

// quitter is the oracle answering in place of every other message in
// which the oracle would call domain tools: those turns end with none of
// their gold tools called (the oracle calls them all in one message).
// Its reply's second token marks the early answers.
type quitter struct {
	o    Oracle
	n, k int
}

func (q *quitter) Chat(ctx context.Context, req llm.Request) (llm.Response, error) {
	r, err := q.o.Chat(ctx, req)
	if err != nil {
		return r, err
	}
	early := 0
	if len(r.Message.ToolCalls) > 0 && !slices.ContainsFunc(r.Message.ToolCalls, func(c chat.ToolCall) bool { return c.Name == SearchTools || c.Name == RemoveTools }) {
		if q.k++; q.k%2 == 1 {
			r.Message.ToolCalls, r.Message.Content, early = nil, "I could not find that.", 1
		}
	}
	r.ResponseIDs = []int{q.n, early}
	q.n++
	return r, nil
}

// TestMissedToolsChargeTheAnswer: a turn that answers before calling its
// gold tools has w_missed_tool times the share it missed charged to the
// answering call, by the place the rollout recorder gives it; answers
// after the gold tools ran, and every other call, are not charged.
func TestMissedToolsChargeTheAnswer(t *testing.T) {
	kb, qs := bench(t, 40, 12)
	c := cfg(Autonomous)
	c.Limit, c.TopK, c.Train.Turns, c.Train.WMissedTool = 16, 3, 6, 0.5
	e, err := NewEnv(c, kb, qs)
	if err != nil {
		t.Fatal(err)
	}
	rs, exps, err := rollout.Run(context.Background(), &quitter{o: oracleFor(kb, qs)}, rollout.Env[Episode](e), []int{0}, rollout.Options{K: 1})
	if err != nil {
		t.Fatal(err)
	}
	sc, err := NewReward(c.Train).Score(context.Background(), rs[0].Result)
	if err != nil {
		t.Fatal(err)
	}
	quits := 0
	for _, x := range exps {
		want := 0.0
		if x.ResponseIDs[1] == 1 {
			want = -0.5
			quits++
		}
		got := 0.0
		if x.Call < len(sc.Calls) {
			got = sc.Calls[x.Call]
		}
		if got != want {
			t.Fatalf("call %d (reply %v) is shaped %v, want %v; answer calls %v", x.Call, x.ResponseIDs, got, want, rs[0].Result.AnswerCalls)
		}
	}
	if quits != 3 || sc.Parts["missed_at_answer"] != 3 || len(rs[0].Result.AnswerCalls) != 6 {
		t.Fatalf("%d early answers in %d calls, part %v, answer calls %v", quits, len(exps), sc.Parts["missed_at_answer"], rs[0].Result.AnswerCalls)
	}
	c.Train.WMissedTool = 0
	if sc, _ = NewReward(c.Train).Score(context.Background(), rs[0].Result); sc.Calls != nil {
		t.Fatalf("w_missed_tool 0 shaped the calls: %v", sc.Calls)
	}
}

// strayer is the oracle adding, to every other message in which it calls
// domain tools, a call of a loaded tool that message does not call (one
// the question did not ask for). Its reply's second token marks those.
type strayer struct {
	o    Oracle
	n, k int
}

func (s *strayer) Chat(ctx context.Context, req llm.Request) (llm.Response, error) {
	r, err := s.o.Chat(ctx, req)
	if err != nil {
		return r, err
	}
	stray := 0
	calls := r.Message.ToolCalls
	if len(calls) > 0 && !slices.ContainsFunc(calls, func(c chat.ToolCall) bool { return c.Name == SearchTools || c.Name == RemoveTools }) {
		if s.k++; s.k%2 == 1 {
			for _, f := range req.Tools {
				if f.Name != SearchTools && f.Name != RemoveTools && !slices.ContainsFunc(calls, func(c chat.ToolCall) bool { return c.Name == f.Name }) {
					r.Message.ToolCalls, stray = append(calls, chat.ToolCall{ID: "stray", Name: f.Name, Arguments: "{}"}), 1
					break
				}
			}
		}
	}
	r.ResponseIDs = []int{s.n, stray}
	s.n++
	return r, nil
}

// TestWrongToolsChargeTheirCall: a call that runs a loaded tool the
// question did not ask for has w_wrong_tool charged to it alone.
func TestWrongToolsChargeTheirCall(t *testing.T) {
	kb, qs := bench(t, 40, 12)
	c := cfg(Autonomous)
	c.Limit, c.TopK, c.Train.Turns, c.Train.WWrongTool = 16, 3, 6, 0.25
	e, err := NewEnv(c, kb, qs)
	if err != nil {
		t.Fatal(err)
	}
	rs, exps, err := rollout.Run(context.Background(), &strayer{o: oracleFor(kb, qs)}, rollout.Env[Episode](e), []int{1}, rollout.Options{K: 1})
	if err != nil {
		t.Fatal(err)
	}
	sc, err := NewReward(c.Train).Score(context.Background(), rs[0].Result)
	if err != nil {
		t.Fatal(err)
	}
	strays := 0
	for _, x := range exps {
		want := 0.0
		if x.ResponseIDs[1] == 1 {
			want = -0.25
			strays++
		}
		got := 0.0
		if x.Call < len(sc.Calls) {
			got = sc.Calls[x.Call]
		}
		if got != want {
			t.Fatalf("call %d (reply %v) is shaped %v, want %v; wrong calls %v", x.Call, x.ResponseIDs, got, want, rs[0].Result.WrongCalls)
		}
	}
	if strays < 2 || sc.Parts["wrong_calls"] != float64(strays) {
		t.Fatalf("%d stray calls in %d calls, part %v", strays, len(exps), sc.Parts["wrong_calls"])
	}
}
