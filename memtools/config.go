package memtools

import (
	"slices"

	"github.com/agemem/agemem/internal/valid"
)

// Options are the tools' defaults (config section "tools", Appendix A.1).
type Options struct {
	// TopK is Retrieve_memory's top_k when the model gives none (3).
	TopK int `yaml:"retrieve_top_k"`
	// MaxTopK caps the top_k a model may ask for.
	MaxTopK int `yaml:"max_top_k"`
	// FilterThreshold is theta of Eq. 15 (0.6).
	FilterThreshold float64 `yaml:"filter_threshold"`
	// Summarizer is "extractive" (deterministic), "policy" (the paper's
	// summarisation prompt sent to the configured policy), "ollama" or
	// "openai" (the same prompt sent to SummarizerModel on that server).
	Summarizer      string `yaml:"summarizer"`
	SummarizerModel string `yaml:"summarizer_model"`
	// SummaryMaxTokens bounds an extractive summary.
	SummaryMaxTokens int `yaml:"summary_max_tokens"`
	// Subset is the tools offered (the paper's component ablation): "all",
	// "ltm" (Add, Update, Delete, Retrieve: AgeMem-RAG, Figure 4's +LT) or
	// "stm" (Summary, Filter). The prompt lists only these; a call to
	// another is refused with a message the model reads.
	Subset string `yaml:"subset"`
}

// Tool subsets (tools.subset).
const (
	SubsetAll = "all"
	SubsetLTM = "ltm"
	SubsetSTM = "stm"
)

// SubsetTools are the tools of a subset, in the order of ToolNames.
func SubsetTools(subset string) []string {
	switch subset {
	case SubsetLTM:
		return []string{ToolRetrieve, ToolAdd, ToolUpdate, ToolDelete}
	case SubsetSTM:
		return []string{ToolSummary, ToolFilter}
	}
	return ToolNames
}

// Offered is the tools this configuration offers.
func (o Options) Offered() []string { return SubsetTools(o.Subset) }

// Offers reports whether tool name is offered.
func (o Options) Offers(name string) bool { return slices.Contains(o.Offered(), name) }

// DefaultOptions are the paper's defaults.
func DefaultOptions() Options {
	return Options{TopK: 3, MaxTopK: 50, FilterThreshold: 0.6, Summarizer: "extractive", SummaryMaxTokens: 256, Subset: SubsetAll}
}

// Validate checks every key.
func (o Options) Validate() error {
	var e valid.Errors
	e.AtLeast("retrieve_top_k", o.TopK, 1)
	e.AtLeast("max_top_k", o.MaxTopK, o.TopK)
	if o.FilterThreshold <= 0 || o.FilterThreshold > 1 {
		e.Add("filter_threshold", "%g is outside (0, 1]", o.FilterThreshold)
	}
	e.OneOf("summarizer", o.Summarizer, "extractive", "policy", "ollama", "openai")
	if (o.Summarizer == "ollama" || o.Summarizer == "openai") && o.SummarizerModel == "" {
		e.Add("summarizer_model", "must name a model when tools.summarizer is %s", o.Summarizer)
	}
	e.AtLeast("summary_max_tokens", o.SummaryMaxTokens, 8)
	e.OneOf("subset", o.Subset, SubsetAll, SubsetLTM, SubsetSTM)
	return e.Err()
}

// Agent bounds the agent loop and says how the policy is prompted
// (config section "agent").
type Agent struct {
	// MaxSteps is the number of policy calls allowed for one user turn.
	MaxSteps int `yaml:"max_steps"`
	// ContextBudget is T_max, the context budget in tokens (C.4).
	ContextBudget int `yaml:"context_budget"`
	// ResponseBudget is the maximum response length in tokens (C.4).
	ResponseBudget int `yaml:"response_budget"`
	// SystemPrompt is "paper" (Appendix A.1) or "compact" (the same tools
	// and format in a tenth of the tokens, for tiny CPU-trained models).
	SystemPrompt string `yaml:"system_prompt"`
}

// DefaultAgent is the paper's: 8192-token context, 2048-token responses.
func DefaultAgent() Agent {
	return Agent{MaxSteps: 4, ContextBudget: 8192, ResponseBudget: 2048, SystemPrompt: PromptPaper}
}

// Validate checks every key.
func (a Agent) Validate() error {
	var e valid.Errors
	e.AtLeast("max_steps", a.MaxSteps, 1)
	e.AtLeast("context_budget", a.ContextBudget, 64)
	e.AtLeast("response_budget", a.ResponseBudget, 1)
	e.OneOf("system_prompt", a.SystemPrompt, PromptPaper, PromptCompact)
	return e.Err()
}

// Limits bound one run of the loop.
func (a Agent) Limits() Limits { return Limits{MaxSteps: a.MaxSteps, ContextBudget: a.ContextBudget} }

// Prompt is the system prompt of the configured style, listing tools.
func (a Agent) Prompt(tools []string) string {
	p, _ := SystemPromptWith(a.SystemPrompt, tools) // validated
	return p
}
