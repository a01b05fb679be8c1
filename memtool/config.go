package memtool

import "github.com/agemem/agemem/internal/valid"

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
	// HistoryTurns user turns; summarize replaces the older ones by a
	// summary the controller writes. Neither touches the tools.
	History      string `yaml:"history"`
	HistoryTurns int    `yaml:"history_turns"`
	// Assistant and Background fill the paper's prompts (Figures 5-7),
	// whose text is about ScaleMCP's 5,000 financial tools.
	Assistant  string `yaml:"assistant"`
	Background string `yaml:"background"`
	// Date is {current_date} (YYYY-MM-DD; "" is today).
	Date string `yaml:"date"`
	// Bench is `agemem-train memtool bench`.
	Bench BenchConfig `yaml:"bench"`
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
	return Config{Mode: Autonomous, Limit: 128, TopK: 5, MaxSteps: 10, History: "truncate", HistoryTurns: 5,
		Assistant:  "financial Assistant that has access to 5,000 external financial tools for the fortune 1,000 companies",
		Background: "These tools are highly decomposed and specific for the company and financial metric.\n- For example, a tool could be \"Apple Revenue Tool\" or \"Amazon Stock Price\".",
		Bench:      BenchConfig{Queries: "data/memtool/queries.json", Tools: "data/memtool/tools.json", Turns: 100, Judge: "contains", Out: "runs/memtool"}}
}

// Validate checks every key.
func (c Config) Validate() error {
	var e valid.Errors
	e.OneOf("mode", c.Mode, Autonomous, Workflow, Hybrid)
	e.AtLeast("limit", c.Limit, 3)
	e.AtLeast("top_k", c.TopK, 1)
	e.AtLeast("max_steps", c.MaxSteps, 1)
	e.OneOf("history", c.History, "truncate", "summarize")
	e.AtLeast("history_turns", c.HistoryTurns, 1)
	if c.Date != "" && !dateRe.MatchString(c.Date) {
		e.Add("date", "%q is not YYYY-MM-DD", c.Date)
	}
	e.AtLeast("bench.turns", c.Bench.Turns, 1)
	e.OneOf("bench.judge", c.Bench.Judge, "contains", "model")
	if c.Bench.Queries == "" {
		e.Add("bench.queries", "a query file is needed")
	}
	return e.Err()
}
