package memtool

import (
	"context"
	"math"
	"testing"

	"github.com/agemem/agemem/llm"
	"github.com/agemem/agemem/model/chat"
)

// Means and standard errors worked by hand: {1, 2, 3, NaN} has mean 2,
// sample deviation 1, SE 1/√3; the paired differences of {1, 2, 4} and
// {2, 2, 7} are {1, 0, 3}: mean 4/3, deviation √(7/3), SE √(7/9).
func TestSummaryHandWorked(t *testing.T) {
	s := MeanSE([]float64{1, 2, 3, math.NaN()})
	if s.N != 3 || s.Mean != 2 || math.Abs(s.SE-1/math.Sqrt(3)) > 1e-12 {
		t.Fatalf("%+v", s)
	}
	score := func(tc float64) SessionScore { return SessionScore{Metrics: Metrics{ToolCorrectness: tc}} }
	d, err := Paired([]SessionScore{score(1), score(2), score(4)}, []SessionScore{score(2), score(2), score(7)})
	if err != nil {
		t.Fatal(err)
	}
	tc := d[2]
	if EvalMeasures[2].Name != "ToolCorr" || math.Abs(tc.Mean-4.0/3) > 1e-12 || math.Abs(tc.SE-math.Sqrt(7.0/9)) > 1e-12 {
		t.Fatalf("paired tool correctness %+v", tc)
	}
	if one := MeanSE([]float64{5}); one.Mean != 5 || !math.IsNaN(one.SE) {
		t.Fatalf("one session: %+v", one)
	}
	if _, err := Paired(make([]SessionScore, 2), make([]SessionScore, 3)); err == nil {
		t.Fatal("sessions of different sets paired")
	}
	if b, _ := MeanSE(nil).MarshalJSON(); string(b) != `{"mean":null,"se":null,"n":0}` {
		t.Fatalf("undefined stat as %s", b)
	}
}

// Held-out sessions: the pruning oracle never hits L and calls every gold
// tool; the never-removing agent (the oracle without removals) hits L in
// most turns and calls fewer; an agent that calls a tool it never loaded
// has every call counted as a format error.
func TestEvaluate(t *testing.T) {
	kb, qs := bench(t, 40, 48)
	c := cfg(Autonomous)
	c.Limit, c.TopK = 6, 1
	sessions, err := EvalSessions(qs, 8, 6)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := EvalSessions(qs, 9, 6); err == nil {
		t.Fatal("54 queries cut from 48")
	}
	run := func(m llm.Model) []Stat {
		sc, err := Evaluate(context.Background(), EvalOptions{Config: c, KB: kb, Sessions: sessions, Agent: m, Judge: ContainsJudge{}, Parallel: 3})
		if err != nil {
			t.Fatal(err)
		}
		if len(sc) != 8 {
			t.Fatalf("%d sessions scored", len(sc))
		}
		for _, s := range sc { // no turn fails here: a turn is at the limit or under it
			if s.Metrics.Failed > 0 || math.Abs(s.UnderLimit+s.LimitTurns-1) > 1e-12 {
				t.Fatalf("turns under the limit %v and at it %v (%d failed)", s.UnderLimit, s.LimitTurns, s.Metrics.Failed)
			}
		}
		return Summarize(sc)
	}
	o := oracleFor(kb, qs)
	o.TopK = 1
	best := run(o)
	o.SkipRemoval = 1
	keep := run(o)
	t.Logf("oracle %+v\nnever-removing %+v", best, keep)
	if best[2].Mean != 1 || best[4].Mean != 0 || best[0].Mean < 0.7 || best[5].Mean != 0 {
		t.Fatalf("oracle: %+v", best)
	}
	if keep[0].Mean != 0 || keep[4].Mean < 0.3 || keep[2].Mean > 0.7 || keep[1].Mean <= best[1].Mean {
		t.Fatalf("never-removing: %+v", keep)
	}
	wild := modelFunc(func(msgs []chat.Message, _ []chat.Function) (llm.Response, error) {
		if msgs[len(msgs)-1].Role == "tool" {
			return answer("done"), nil
		}
		return callReply("no_such_tool", map[string]any{}), nil
	})
	if fe := run(wild)[5]; fe.Mean != 1 || fe.SE != 0 {
		t.Fatalf("format errors of an agent calling an unknown tool: %+v", fe)
	}
}
