package memtool

import (
	"context"
	"fmt"
	"slices"

	"github.com/agemem/agemem/agent"
	"github.com/agemem/agemem/bench/stabletoolbench"
	"github.com/agemem/agemem/llm"
	"github.com/agemem/agemem/rl/rollout"
)

// Env is the Autonomous mode as an environment for the GRPO trainer
// (rollout.Env): a task is a session of a few user queries from an empty
// working set, and the policy is the agent, with SYS_SEARCH_TOOLS,
// SYS_REMOVE_TOOLS and the tools it loaded (the native engine renders them
// with its chat template and parses its calls), so each of its calls is a
// recorded experience. Small models fail to prune
// (the paper, Table 2); this is where one can learn to.
type Env struct {
	Config Config // Mode is set to Autonomous
	KB     *agent.Catalog
	// Sessions are the tasks: each a list of queries played in order.
	Sessions [][]stabletoolbench.Query
	// Exec runs the domain tools (nil: stabletoolbench.Simulate).
	Exec Executor
}

// NewEnv cuts the queries into sessions of c.Train.Turns (the last may be
// shorter) and checks that every gold tool is in the knowledge base.
func NewEnv(c Config, kb *agent.Catalog, qs []stabletoolbench.Query) (*Env, error) {
	c.Mode = Autonomous
	if err := c.Validate(); err != nil {
		return nil, err
	}
	if len(qs) == 0 {
		return nil, fmt.Errorf("memtool: no training queries")
	}
	e := &Env{Config: c, KB: kb}
	for i := 0; i < len(qs); i += c.Train.Turns {
		s := qs[i:min(i+c.Train.Turns, len(qs))]
		for _, q := range s {
			for _, g := range q.Gold {
				if _, ok := kb.Get(g); !ok {
					return nil, fmt.Errorf("memtool: query %s: gold tool %q is not in the knowledge base", q.ID, g)
				}
			}
		}
		e.Sessions = append(e.Sessions, s)
	}
	return e, nil
}

// Episode is what one rollout leaves for the reward: each turn's record
// and its gold tools.
type Episode struct {
	Turns []TurnResult
	Gold  [][]string
	// FailedCalls are the places, among the episode's recorded model
	// calls (rollout.Experience.Call), of the calls whose tool calls
	// failed.
	FailedCalls []int
	// AnswerCalls are, per turn, the place of the call that answered (a
	// reply without tool calls), -1 where the turn ended unanswered.
	AnswerCalls []int
	// WrongCalls are the places of the calls that ran a domain tool the
	// turn's question did not ask for.
	WrongCalls []int
}

// counter counts a policy's calls as the rollout recorder numbers its
// experiences: answered, with response tokens.
type counter struct {
	llm.Model
	n int
}

func (c *counter) Chat(ctx context.Context, r llm.Request) (llm.Response, error) {
	res, err := c.Model.Chat(ctx, r)
	if err == nil && len(res.ResponseIDs) > 0 {
		c.n++
	}
	return res, err
}

// Len implements rollout.Env.
func (e *Env) Len() int { return len(e.Sessions) }

// Play implements rollout.Env: the session's queries in order. A turn
// whose model call fails (a prompt past the model's context) is recorded
// as failed and the session goes on, as in the benchmark.
func (e *Env) Play(ctx context.Context, m llm.Model, t int, _ uint64) (Episode, error) {
	exec := e.Exec
	if exec == nil {
		exec = stabletoolbench.Simulate
	}
	cm := &counter{Model: m}
	s := &Conversation{Config: e.Config, Agent: cm, KB: e.KB, Exec: exec}
	var ep Episode
	for i, q := range e.Sessions[t] {
		res, err := s.Turn(ctx, q.Text)
		if err != nil {
			if ctx.Err() != nil {
				return ep, ctx.Err()
			}
			res.Error = fmt.Sprintf("turn %d (query %s): %v", i+1, q.ID, err)
		}
		// In Autonomous mode the agent's steps are a turn's last calls
		// (a summary of the history comes before them), one call each.
		first := cm.n - len(res.Trace.Steps)
		answer := -1
		for j, st := range res.Trace.Steps {
			if first+j < 0 {
				continue
			}
			if slices.ContainsFunc(st.Results, func(r agent.CallResult) bool { return !r.OK }) {
				ep.FailedCalls = append(ep.FailedCalls, first+j)
			}
			if slices.ContainsFunc(st.Results, func(r agent.CallResult) bool {
				return r.OK && r.Call.Name != SearchTools && r.Call.Name != RemoveTools && !slices.Contains(q.Gold, r.Call.Name)
			}) {
				ep.WrongCalls = append(ep.WrongCalls, first+j)
			}
			if len(st.Reply.Message.ToolCalls) == 0 {
				answer = first + j
			}
		}
		ep.AnswerCalls = append(ep.AnswerCalls, answer)
		ep.Turns = append(ep.Turns, res)
		ep.Gold = append(ep.Gold, q.Gold)
	}
	return ep, nil
}

// Reward scores an episode by the three aims: call the gold tools
// (tool correctness, Eq. 5), remove what was added (the removal ratio,
// Eq. 1, capped at 1: removing tools of an earlier episode cannot count
// more than complete), and never ask for more than L tools (the share of
// turns without a limit hit).
// WFailedCall, WMissedTool and WWrongTool shape single calls
// (TrainConfig).
type Reward struct{ WCorrect, WRemoval, WLimit, WFailedCall, WMissedTool, WWrongTool float64 }

// NewReward is the reward of the train section.
func NewReward(c TrainConfig) Reward {
	return Reward{WCorrect: c.WCorrect, WRemoval: c.WRemoval, WLimit: c.WLimit, WFailedCall: c.WFailedCall, WMissedTool: c.WMissedTool, WWrongTool: c.WWrongTool}
}

// Session is the reward of an evaluated session (what validation
// compares): the episode's reward, over the session's turns.
func (r Reward) Session(sc SessionScore) float64 {
	return r.WCorrect*sc.Metrics.ToolCorrectness + r.WRemoval*min(sc.Metrics.RemovalRatio, 1) + r.WLimit*sc.UnderLimit
}

// Score implements rl.Reward.
func (r Reward) Score(_ context.Context, ep Episode) (rollout.Score, error) {
	m := Measure(ep.Turns, ep.Gold, nil)
	under := 0.0
	for _, t := range ep.Turns {
		if t.LimitHits == 0 && t.Error == "" {
			under++
		}
	}
	if n := len(ep.Turns); n > 0 {
		under /= float64(n)
	}
	removal := min(m.RemovalRatio, 1)
	parts := map[string]float64{"tool_correctness": m.ToolCorrectness, "removal_ratio": removal, "under_limit": under,
		"answered": m.Answered, "max_count": float64(m.MaxCount)}
	total := r.WCorrect*m.ToolCorrectness + r.WRemoval*removal + r.WLimit*under
	var called []string
	for _, t := range ep.Turns {
		called = append(called, t.Called...)
	}
	sc := rollout.Score{Total: total, Parts: parts, Info: map[string]any{"called": slices.Compact(called), "failed_turns": m.Failed}}
	charge := func(call int, w float64) {
		if call < 0 || w == 0 {
			return
		}
		if call >= len(sc.Calls) {
			sc.Calls = append(sc.Calls, make([]float64, call+1-len(sc.Calls))...)
		}
		sc.Calls[call] -= w
	}
	for _, c := range ep.FailedCalls {
		charge(c, r.WFailedCall)
	}
	for _, c := range ep.WrongCalls {
		charge(c, r.WWrongTool)
	}
	var early float64
	for i, c := range ep.AnswerCalls {
		if i < len(ep.Gold) && len(ep.Gold[i]) > 0 && c >= 0 {
			miss := missed(ep.Turns[i].Called, ep.Gold[i])
			charge(c, r.WMissedTool*miss)
			early += miss
		}
	}
	parts["failed_calls"] = float64(len(ep.FailedCalls))
	parts["missed_at_answer"] = early
	parts["wrong_calls"] = float64(len(ep.WrongCalls))
	return sc, nil
}

// missed is the share of gold tools not among called.
func missed(called, gold []string) float64 {
	n := 0
	for _, g := range gold {
		if !slices.Contains(called, g) {
			n++
		}
	}
	return float64(n) / float64(len(gold))
}
