// Package memtool is MemTool (Lumer et al., 2025): the short-term memory of
// an agent's tools. An agent with thousands of available tools keeps a
// working set of at most L of them in its context, searching a tool
// knowledge base to add tools and removing the ones it no longer needs, in
// one of three modes (Algorithms 1-3): Autonomous (the agent has the
// meta-tools SYS_SEARCH_TOOLS and SYS_REMOVE_TOOLS), Workflow (a prune call
// and a search call before an agent without meta-tools) and Hybrid (a prune
// call, then an agent that can only search). It runs on the function-calling
// loop of package agent, with any llm.Model.
package memtool

import (
	"math"

	"github.com/agemem/agemem/internal/valid"
)

// Modes are the three architectures of the paper.
const (
	Autonomous = "autonomous" // Algorithm 1
	Workflow   = "workflow"   // Algorithm 2
	Hybrid     = "hybrid"     // Algorithm 3
)

// Config is the "memtool" section.
type Config struct {
	// Mode is autonomous, workflow or hybrid.
	Mode string `yaml:"mode"`
	// Limit is L, the most tools one model call may carry, meta-tools
	// included (the API limit the paper standardises on: 128).
	Limit int `yaml:"limit"`
	// TopK tools are retrieved per search keyword (the paper: 5).
	TopK int `yaml:"top_k"`
	// MaxSteps bounds the agent's model calls per user query (the paper's
	// loop has no bound; a small model that never stops would hang it).
	MaxSteps int `yaml:"max_steps"`
	// History is the dialogue's manager H: truncate keeps the last
	// HistoryTurns user turns (0: none, the working set alone carries
	// over); summarize replaces the older ones by a summary the controller
	// writes. Neither touches the tools.
	History      string `yaml:"history"`
	HistoryTurns int    `yaml:"history_turns"`
	// Assistant and Background fill the paper's prompts (Figures 5-7),
	// whose text is about ScaleMCP's 5,000 financial tools.
	Assistant  string `yaml:"assistant"`
	Background string `yaml:"background"`
	// Date is {current_date} (YYYY-MM-DD; "" is today).
	Date string `yaml:"date"`
	// Prompt is the Autonomous agent's system message: paper (Figure 5,
	// about 600 words) or compact (its rules in three sentences, for a
	// policy trained from scratch, which reads no instructions and pays
	// for every token of every call).
	Prompt string `yaml:"prompt"`
	// Bench is `agemem-train memtool bench`.
	Bench BenchConfig `yaml:"bench"`
	// Train is `agemem-train memtool train`: the Autonomous mode as a GRPO
	// environment.
	Train TrainConfig `yaml:"train"`
	// Eval is `agemem-train memtool eval`.
	Eval EvalConfig `yaml:"eval"`
}

// EvalConfig is the held-out evaluation: Sessions sessions of Turns
// queries each, from an empty working set, cut from the start of
// bench.queries.
type EvalConfig struct {
	Sessions int `yaml:"sessions"`
	Turns    int `yaml:"turns"`
}

// TrainConfig is the GRPO environment of the Autonomous mode and its
// reward (the rl section says how it trains).
type TrainConfig struct {
	// Queries are the training queries ("" = those of bench.queries after
	// its first bench.turns, so the benchmark's session stays held out).
	Queries string `yaml:"queries"`
	// Turns are the user queries of one episode, a session from an empty
	// working set: enough for tools to pile up and pruning to matter.
	Turns int `yaml:"turns"`
	// The reward is WCorrect·tool correctness + WRemoval·removal ratio
	// (capped at 1) + WLimit·the share of turns that never hit L.
	WCorrect float64 `yaml:"w_correct"`
	WRemoval float64 `yaml:"w_removal"`
	WLimit   float64 `yaml:"w_limit"`
	// WFailedCall is charged to a single model call whose tool calls
	// failed (malformed, an unknown tool, arguments outside the schema,
	// a search refused at L): subtracted from that call's advantage
	// alone (rollout.Score.Calls), not from the episode's reward, so a
	// removal that earned its reward keeps it when the call after it
	// goes wrong.
	WFailedCall float64 `yaml:"w_failed_call"`
	// WMissedTool is charged to a turn's answering call, times the share
	// of the turn's gold tools not called by then: the answer is where the
	// policy chose to stop, so a turn that removed and then answered
	// without searching is charged there, not in its removal.
	WMissedTool float64 `yaml:"w_missed_tool"`
	// WWrongTool is charged to a call that ran a domain tool the turn's
	// question does not ask for (a tool left over from an earlier
	// question): the call where the policy used what it had instead of
	// searching for what it needs.
	WWrongTool float64 `yaml:"w_wrong_tool"`
	// Val are validation queries over the training tools (a memtool synth
	// file, disjoint from the held-out sets): with them GRPO plays
	// rl.val_tasks sessions of eval.turns greedily before the first step,
	// every rl.val_every steps and after the last, J being the reward's
	// mean over sessions, and rl.keep_best keeps the step that scored best
	// (a run of a small policy drifts from step to step).
	Val string `yaml:"val"`
}

// BenchConfig is the ScaleMCP-style benchmark.
type BenchConfig struct {
	// Tools is the knowledge base: a JSON list of MCP servers and their
	// tools ("" takes the tools of the queries' api_lists).
	Tools string `yaml:"tools"`
	// Queries is a StableToolBench solvable_queries file with gold tools.
	Queries string `yaml:"queries"`
	// Turns is the session's length in user queries (the paper: 100).
	Turns int `yaml:"turns"`
	// Judge scores task completion: contains (the share of the expected
	// values the answer states) or model (an LLM's 0-1 alignment score,
	// the judge model the command names).
	Judge string `yaml:"judge"`
	// Out receives report.json, tools.png and the traces.
	Out string `yaml:"out"`
}

// DefaultConfig is the paper's setting.
func DefaultConfig() Config {
	return Config{Mode: Autonomous, Limit: 128, TopK: 5, MaxSteps: 10, History: "truncate", HistoryTurns: 5, Prompt: "paper",
		Assistant:  "financial Assistant that has access to 5,000 external financial tools for the fortune 1,000 companies",
		Background: "These tools are highly decomposed and specific for the company and financial metric.\n- For example, a tool could be \"Apple Revenue Tool\" or \"Amazon Stock Price\".",
		Bench:      BenchConfig{Queries: "data/memtool/queries.json", Tools: "data/memtool/tools.json", Turns: 100, Judge: "contains", Out: "runs/memtool"},
		Train:      TrainConfig{Turns: 4, WCorrect: 1, WRemoval: 0.5, WLimit: 0.5},
		Eval:       EvalConfig{Sessions: 40, Turns: 6}}
}

// Validate checks every key.
func (c Config) Validate() error {
	var e valid.Errors
	e.OneOf("mode", c.Mode, Autonomous, Workflow, Hybrid)
	e.AtLeast("limit", c.Limit, 3)
	e.AtLeast("top_k", c.TopK, 1)
	e.AtLeast("max_steps", c.MaxSteps, 1)
	e.OneOf("history", c.History, "truncate", "summarize")
	e.AtLeast("history_turns", c.HistoryTurns, 0)
	e.OneOf("prompt", c.Prompt, "paper", "compact")
	if c.Date != "" && !dateRe.MatchString(c.Date) {
		e.Add("date", "%q is not YYYY-MM-DD", c.Date)
	}
	e.AtLeast("bench.turns", c.Bench.Turns, 1)
	e.OneOf("bench.judge", c.Bench.Judge, "contains", "model")
	e.AtLeast("train.turns", c.Train.Turns, 1)
	e.AtLeast("eval.sessions", c.Eval.Sessions, 1)
	e.AtLeast("eval.turns", c.Eval.Turns, 1)
	for _, w := range []struct {
		key string
		v   float64
	}{{"train.w_correct", c.Train.WCorrect}, {"train.w_removal", c.Train.WRemoval}, {"train.w_limit", c.Train.WLimit}, {"train.w_failed_call", c.Train.WFailedCall}, {"train.w_missed_tool", c.Train.WMissedTool}, {"train.w_wrong_tool", c.Train.WWrongTool}} {
		if !(w.v >= 0) || math.IsInf(w.v, 0) {
			e.Add(w.key, "%v is not a finite weight of at least 0", w.v)
		}
	}
	if c.Bench.Queries == "" {
		e.Add("bench.queries", "a query file is needed")
	}
	return e.Err()
}
