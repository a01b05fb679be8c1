// Package fittext is FitText (Zheng et al.): tool retrieval that does not
// search with the user's query but with descriptions of the tools the
// agent wishes it had (pseudo-tools, written between Begin and End),
// refined against the tools they retrieve (DBD), sampled and voted on
// (Scattershot), refined together in one global prompt (IBI), or evolved
// by a memetic algorithm with a memory of what was already tried (Memetic,
// and its extension Memetic V2). The knowledge base is MemTool's
// (memtool.KB); the model is any LLM with a temperature.
package fittext

import (
	"context"
	"fmt"
	"hash/fnv"
	"regexp"
	"strings"
	"sync"

	"github.com/agemem/agemem/internal/valid"
	"github.com/agemem/agemem/llm"
	"github.com/agemem/agemem/model/chat"
)

// The pseudo-tool delimiters (the authors' special tokens; the paper
// writes them {BEGIN} and {END}).
const (
	Begin = "<|begin_func_description|>"
	End   = "<|end_func_description|>"
)

var block = regexp.MustCompile(`(?s)` + regexp.QuoteMeta(Begin) + `(.*?)` + regexp.QuoteMeta(End))

// ParseBlocks is PARSEBLOCKS: every non-empty pseudo-tool in text.
func ParseBlocks(text string) []string {
	var out []string
	for _, m := range block.FindAllStringSubmatch(text, -1) {
		if s := strings.TrimSpace(m[1]); s != "" {
			out = append(out, s)
		}
	}
	return out
}

// ParseSingle is PARSESINGLE: the first non-empty pseudo-tool, or "".
func ParseSingle(text string) string {
	if bs := ParseBlocks(text); len(bs) > 0 {
		return bs[0]
	}
	return ""
}

// LLM is the model the strategies call: one user prompt, one reply, at a
// temperature (the paper's operators differ: refinement at most 0.7, the
// memetic operators and Scattershot at 1.5).
type LLM interface {
	Generate(ctx context.Context, prompt string, temperature float64) (string, error)
}

// LLMFunc is an LLM from a function.
type LLMFunc func(ctx context.Context, prompt string, temperature float64) (string, error)

// Generate implements LLM.
func (f LLMFunc) Generate(ctx context.Context, prompt string, t float64) (string, error) {
	return f(ctx, prompt, t)
}

// Strategies are the retrieval strategies, in the paper's order (Memetic
// V2 is its Appendix C.1).
var Strategies = []string{"query", "single", "ibi", "dbd", "scattershot", "memetic", "memetic-v2"}

// Config is the "fittext" section: the paper's defaults (Table 8), and
// the authors' code's variants where the two differ.
type Config struct {
	// K tools per retrieval (RET's top-k) and B, the voting budget.
	K int `yaml:"k"`
	B int `yaml:"b"`
	// Exemplars is how many retrieved tools' descriptions ground a prompt
	// (the authors' example_num is 15 for ToolRet; the paper retrieves k).
	Exemplars int `yaml:"exemplars"`
	// Turns of DBD refinement (T: 3 or 5) and its temperature (≤ 0.7).
	Turns      int     `yaml:"turns"`
	RefineTemp float64 `yaml:"refine_temperature"`
	// Scattershot: S probes at ScatterTemp (the paper: 1.5; the authors'
	// code: 0.9).
	Scatter     int     `yaml:"scatter"`
	ScatterTemp float64 `yaml:"scatter_temperature"`
	// Memetic V1: population N, G generations, early stop at fitness
	// Theta, crossover probability, operator temperature (1.5).
	Population  int     `yaml:"population"`
	Generations int     `yaml:"generations"`
	Theta       float64 `yaml:"theta"`
	Crossover   float64 `yaml:"crossover"`
	MemeticTemp float64 `yaml:"memetic_temperature"`
	// MemoryPenalty is how fitness is penalised for repeating what was
	// tried: tools (the paper, Eq. 7: Jaccard of the retrieved tool sets,
	// counted above 0.3, weight 0.5) or text (the authors' code: Jaccard of
	// the words of the pseudo-tool and of the remembered ones).
	MemoryPenalty string `yaml:"memory_penalty"`
	// AnalysisTemp is the temperature of the first call, which writes the
	// ancestors (the paper does not give it).
	AnalysisTemp float64 `yaml:"analysis_temperature"`
	// IBIJudge asks, before each IBI refinement, whether the tools
	// retrieved so far suffice (the paper's j=1; its prompt is not given).
	IBIJudge bool `yaml:"ibi_judge"`
	// V2 is Memetic V2 (Algorithm 8; its temperature base T_b is
	// memetic_temperature, G generations and θ as V1's).
	V2 V2Config `yaml:"memetic_v2"`
	// DFSDT is the agent's tree search (Search).
	DFSDT SearchConfig `yaml:"dfsdt"`
}

// V2Config is Memetic V2's section (Table 8 and Eqs. 15-21).
type V2Config struct {
	Population int `yaml:"population"` // N: 8
	// Fitness weights of Eq. 15: α s_ret + β LLM_score − γ mem − δ crowd.
	Alpha float64 `yaml:"alpha"`
	Beta  float64 `yaml:"beta"`
	Gamma float64 `yaml:"gamma"`
	Delta float64 `yaml:"delta"`
	// Crowding counts the other descriptions whose embeddings' cosine is
	// above it (θ_c: 0.85).
	Crowding float64 `yaml:"crowding"`
	// Tournament is the tournament size of selection (3).
	Tournament int `yaml:"tournament"`
	// Guided mutation steers away from the parent's GuidedTools
	// lowest-scoring retrieved tools when they score more than GuidedGap
	// under its best one (the paper gives neither m nor the test).
	GuidedTools int     `yaml:"guided_tools"`
	GuidedGap   float64 `yaml:"guided_gap"`
}

// DefaultConfig is the paper's setting.
func DefaultConfig() Config {
	return Config{K: 5, B: 5, Exemplars: 5, Turns: 3, RefineTemp: 0.7, Scatter: 5, ScatterTemp: 1.5,
		Population: 6, Generations: 3, Theta: 0.95, Crossover: 0.5, MemeticTemp: 1.5, MemoryPenalty: "tools", AnalysisTemp: 0,
		V2:    V2Config{Population: 8, Alpha: 0.5, Beta: 0.3, Gamma: 0.2, Delta: 1, Crowding: 0.85, Tournament: 3, GuidedTools: 2, GuidedGap: 0.1},
		DFSDT: DefaultSearch()}
}

// Validate checks every key.
func (c Config) Validate() error {
	var e valid.Errors
	e.AtLeast("k", c.K, 1)
	e.AtLeast("b", c.B, 1)
	e.AtLeast("exemplars", c.Exemplars, 1)
	e.AtLeast("turns", c.Turns, 0)
	e.AtLeast("scatter", c.Scatter, 1)
	e.AtLeast("population", c.Population, 2)
	e.AtLeast("generations", c.Generations, 1)
	e.Ratio("crossover", c.Crossover)
	for key, t := range map[string]float64{"refine_temperature": c.RefineTemp, "scatter_temperature": c.ScatterTemp,
		"memetic_temperature": c.MemeticTemp, "analysis_temperature": c.AnalysisTemp} {
		if t < 0 || t > 2 {
			e.Add(key, "%g is not in [0, 2]", t)
		}
	}
	e.OneOf("memory_penalty", c.MemoryPenalty, "tools", "text")
	v := c.V2
	e.AtLeast("memetic_v2.population", v.Population, 2)
	e.AtLeast("memetic_v2.tournament", v.Tournament, 1)
	e.AtLeast("memetic_v2.guided_tools", v.GuidedTools, 0)
	for key, w := range map[string]float64{"memetic_v2.alpha": v.Alpha, "memetic_v2.beta": v.Beta,
		"memetic_v2.gamma": v.Gamma, "memetic_v2.delta": v.Delta, "memetic_v2.guided_gap": v.GuidedGap} {
		e.NotNegative(key, w)
	}
	if !(v.Crowding >= -1 && v.Crowding <= 1) {
		e.Add("memetic_v2.crowding", "%g is not a cosine in [-1, 1]", v.Crowding)
	}
	c.DFSDT.validate(&e)
	c.DFSDT.validateRetrieval(&e)
	return e.Err()
}

// CheckStrategy names a strategy that does not exist.
func CheckStrategy(s string) error {
	for _, x := range Strategies {
		if s == x {
			return nil
		}
	}
	return fmt.Errorf("strategy %q: want one of %s", s, strings.Join(Strategies, ", "))
}

// ModelLLM asks a chat model: the prompt as one user message, sampled at
// the temperature the operator asks for, from a seed drawn from the prompt
// and how often it was asked before, so that a prompt asked again
// (Scattershot's probes) gets a new sample and a run gives the same text
// however its calls were batched.
type ModelLLM struct {
	Model llm.Model
	Seed  uint64
	mu    sync.Mutex
	asked map[uint64]uint64
}

// Generate implements LLM.
func (m *ModelLLM) Generate(ctx context.Context, prompt string, temperature float64) (string, error) {
	h := fnv.New64a()
	h.Write([]byte(prompt))
	key := h.Sum64()
	m.mu.Lock()
	if m.asked == nil {
		m.asked = map[uint64]uint64{}
	}
	n := m.asked[key]
	m.asked[key]++
	m.mu.Unlock()
	s := llm.Sampling{Temperature: temperature, Seed: m.Seed ^ key ^ (n * 0x9e3779b97f4a7c15)}
	r, err := m.Model.Chat(ctx, llm.Request{Messages: []chat.Message{{Role: "user", Content: prompt}}, Sampling: &s})
	if err != nil {
		return "", err
	}
	return r.Message.Content, nil
}
