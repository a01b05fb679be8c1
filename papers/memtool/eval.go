package memtool

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"sync"

	"github.com/agemem/agemem/agent"
	"github.com/agemem/agemem/bench/stabletoolbench"
	"github.com/agemem/agemem/llm"
)

// EvalOptions are a held-out evaluation: sessions of queries, each from
// an empty working set, played by one agent in Config.Mode.
type EvalOptions struct {
	Config   Config
	KB       *agent.Catalog
	Sessions [][]stabletoolbench.Query
	Agent    llm.Model
	Judge    Judge
	// Exec runs the domain tools (nil: the simulator, stabletoolbench.Simulate).
	Exec Executor
	// Parallel sessions are played at once (a batching engine decodes
	// their calls together); at least 1.
	Parallel int
}

// SessionScore is one session's measures.
type SessionScore struct {
	Metrics Metrics `json:"metrics"`
	// LimitTurns is the share of turns in which a search hit L;
	// FormatErrors the share of the agent's calls that never reached a
	// tool (TurnResult.FormatErrors), 0 for a session without calls.
	LimitTurns   float64 `json:"limit_turns"`
	FormatErrors float64 `json:"format_errors"`
	// UnderLimit is the share of turns that neither hit L nor failed (the
	// reward's third part).
	UnderLimit float64 `json:"under_limit"`
	Calls      int     `json:"calls"`
}

// EvalSessions cuts queries into n sessions of turns queries each, in
// order; it is an error when there are too few.
func EvalSessions(qs []stabletoolbench.Query, n, turns int) ([][]stabletoolbench.Query, error) {
	if n < 1 || turns < 1 {
		return nil, fmt.Errorf("memtool: %d sessions of %d turns: want at least one of one", n, turns)
	}
	if len(qs) < n*turns {
		return nil, fmt.Errorf("memtool: %d sessions of %d turns need %d queries, there are %d", n, turns, n*turns, len(qs))
	}
	out := make([][]stabletoolbench.Query, n)
	for i := range out {
		out[i] = qs[i*turns : (i+1)*turns]
	}
	return out, nil
}

// Evaluate plays every session and scores it: the paper's metrics of its
// turns, the share of turns at the limit and of malformed calls. A turn
// whose model call fails is recorded as failed and the session goes on, as
// in Bench.
func Evaluate(ctx context.Context, o EvalOptions) ([]SessionScore, error) {
	out := make([]SessionScore, len(o.Sessions))
	errs := make([]error, len(o.Sessions))
	exec := o.Exec
	if exec == nil {
		exec = stabletoolbench.Simulate
	}
	sem := make(chan struct{}, max(o.Parallel, 1))
	var wg sync.WaitGroup
	for i, qs := range o.Sessions {
		wg.Go(func() {
			sem <- struct{}{}
			defer func() { <-sem }()
			out[i], errs[i] = evalSession(ctx, o, exec, qs)
		})
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			return nil, fmt.Errorf("session %d: %w", i+1, err)
		}
	}
	return out, nil
}

func evalSession(ctx context.Context, o EvalOptions, exec Executor, qs []stabletoolbench.Query) (SessionScore, error) {
	s := &Conversation{Config: o.Config, Agent: o.Agent, KB: o.KB, Exec: exec}
	var turns []TurnResult
	var gold [][]string
	var completion []float64
	var sc SessionScore
	limited, bad, under := 0, 0, 0
	for i, q := range qs {
		t, err := s.Turn(ctx, q.Text)
		if err != nil {
			if ctx.Err() != nil {
				return sc, ctx.Err()
			}
			t.Error = fmt.Sprintf("turn %d (query %s): %v", i+1, q.ID, err)
		}
		score, err := o.Judge.Score(ctx, q, t.Answer, expected(q, t, o.Exec == nil))
		if err != nil {
			return sc, err
		}
		turns = append(turns, t)
		gold = append(gold, q.Gold)
		completion = append(completion, score)
		if t.LimitHits > 0 {
			limited++
		} else if t.Error == "" {
			under++
		}
		sc.Calls += t.Calls
		bad += t.FormatErrors
	}
	sc.Metrics = Measure(turns, gold, completion)
	sc.LimitTurns = float64(limited) / float64(len(qs))
	sc.UnderLimit = float64(under) / float64(len(qs))
	if sc.Calls > 0 {
		sc.FormatErrors = float64(bad) / float64(sc.Calls)
	}
	return sc, nil
}

// Stat is a mean over sessions and its standard error (the sample
// standard deviation over √N); N counts the sessions where the measure is
// defined (RR3T and Resid3T are not where nothing was added).
type Stat struct {
	Mean float64 `json:"mean"`
	SE   float64 `json:"se"`
	N    int     `json:"n"`
}

// MarshalJSON writes an undefined mean or error (NaN) as null.
func (s Stat) MarshalJSON() ([]byte, error) {
	orNil := func(v float64) *float64 {
		if math.IsNaN(v) {
			return nil
		}
		return &v
	}
	return json.Marshal(struct {
		Mean *float64 `json:"mean"`
		SE   *float64 `json:"se"`
		N    int      `json:"n"`
	}{orNil(s.Mean), orNil(s.SE), s.N})
}

// EvalMeasures are the measures Summarize and Paired report, in order.
var EvalMeasures = []struct {
	Name string
	Of   func(SessionScore) float64
}{
	{"RR3T", func(s SessionScore) float64 { return s.Metrics.AvgRemovalRatio3T }},
	{"Resid3T", func(s SessionScore) float64 { return s.Metrics.AvgResidual3T }},
	{"ToolCorr", func(s SessionScore) float64 { return s.Metrics.ToolCorrectness }},
	{"TaskComp", func(s SessionScore) float64 { return s.Metrics.TaskCompletion }},
	{"LimitTurns", func(s SessionScore) float64 { return s.LimitTurns }},
	{"FormatErr", func(s SessionScore) float64 { return s.FormatErrors }},
}

// Summarize is each measure's mean and standard error over sessions.
func Summarize(scores []SessionScore) []Stat {
	out := make([]Stat, len(EvalMeasures))
	for i, m := range EvalMeasures {
		var xs []float64
		for _, s := range scores {
			xs = append(xs, m.Of(s))
		}
		out[i] = MeanSE(xs)
	}
	return out
}

// Paired is each measure's mean difference b − a over the sessions both
// played (the same sessions, in the same order), with the standard error
// of that mean: what changed, net of how hard each session is.
func Paired(a, b []SessionScore) ([]Stat, error) {
	if len(a) != len(b) {
		return nil, fmt.Errorf("memtool: paired differences of %d and %d sessions", len(a), len(b))
	}
	out := make([]Stat, len(EvalMeasures))
	for i, m := range EvalMeasures {
		xs := make([]float64, len(a))
		for j := range a {
			xs[j] = m.Of(b[j]) - m.Of(a[j])
		}
		out[i] = MeanSE(xs)
	}
	return out, nil
}

// MeanSE is the mean of xs and its standard error; it leaves out NaNs,
// and one value has no standard error (NaN).
func MeanSE(xs []float64) Stat {
	var sum float64
	var n int
	for _, x := range xs {
		if !math.IsNaN(x) {
			sum += x
			n++
		}
	}
	if n == 0 {
		return Stat{Mean: math.NaN(), SE: math.NaN()}
	}
	mean := sum / float64(n)
	if n == 1 {
		return Stat{Mean: mean, SE: math.NaN(), N: 1}
	}
	var ss float64
	for _, x := range xs {
		if !math.IsNaN(x) {
			ss += (x - mean) * (x - mean)
		}
	}
	return Stat{Mean: mean, SE: math.Sqrt(ss/float64(n-1)) / math.Sqrt(float64(n)), N: n}
}
