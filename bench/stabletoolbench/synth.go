package stabletoolbench

import (
	"context"
	"encoding/json"
	"fmt"
	"hash/fnv"
	"math/rand/v2"
	"strconv"
	"strings"

	"github.com/agemem/agemem/agent"
	"github.com/agemem/agemem/internal/jsonerr"
)

// A ScaleMCP-like benchmark (ScaleMCP itself is not redistributable
// here): fictional companies, each an MCP server of a few financial-metric
// tools ("<metric>_for_<company>"), and multi-turn sessions of questions
// about one to four (company, metric) pairs, some following up on the
// previous question's company. Tools return deterministic values, so an
// answer can be checked against them.

var metrics = []struct{ name, unit, desc string }{
	{"Stock Price", "USD", "the latest closing stock price"},
	{"Analyst Price Target", "USD", "the consensus analyst price target"},
	{"Revenue", "USD millions", "the total revenue of the last fiscal year"},
	{"Net Income", "USD millions", "the net income of the last fiscal year"},
	{"Market Cap", "USD millions", "the market capitalisation"},
	{"Earnings Per Share", "USD", "the diluted earnings per share"},
	{"Dividend Yield", "percent", "the trailing dividend yield"},
	{"Operating Margin", "percent", "the operating margin"},
	{"Free Cash Flow", "USD millions", "the free cash flow of the last fiscal year"},
	{"Total Debt", "USD millions", "the total debt on the balance sheet"},
}

var (
	coOnsets = []string{"b", "br", "c", "d", "f", "g", "h", "k", "l", "m", "n", "p", "qu", "r", "s", "st", "t", "tr", "v", "z"}
	coVowels = []string{"a", "e", "i", "o", "u", "ai", "ea", "ou"}
	coSfx    = []string{"Corp", "Industries", "Holdings", "Systems", "Group", "Technologies", "Energy", "Foods", "Motors", "Financial"}
)

// SynthBench is a generated benchmark: the tool collection (as
// LoadCollection reads it) and the queries (as LoadQueries reads them).
type SynthBench struct {
	Collection []byte
	Queries    []byte
}

type synthCompany struct {
	name, ticker string
	metrics      []int
}

// Synth generates a benchmark of companies × perCompany tools and n
// queries; the same seed gives the same files.
func Synth(seed uint64, companies, perCompany, n int) (SynthBench, error) {
	return SynthQuestions(seed, 0, companies, perCompany, n)
}

// SynthQuestions is Synth whose queries are drawn from their own seed
// (0: the world's): the same tools as Synth(seed, ...) with other
// questions, a held-out set over the collection a policy trained on.
func SynthQuestions(seed, querySeed uint64, companies, perCompany, n int) (SynthBench, error) {
	if companies < 1 || perCompany < 1 || perCompany > len(metrics) || n < 1 {
		return SynthBench{}, fmt.Errorf("memtool: synth needs at least one company, 1-%d tools each and one query", len(metrics))
	}
	r := rand.New(rand.NewPCG(seed, 0x6d656d74))
	used := map[string]bool{}
	var cos []synthCompany
	for len(cos) < companies {
		var b strings.Builder
		for range 2 + r.IntN(2) {
			b.WriteString(coOnsets[r.IntN(len(coOnsets))] + coVowels[r.IntN(len(coVowels))])
		}
		stem := strings.ToUpper(b.String()[:1]) + b.String()[1:]
		name := stem + " " + coSfx[r.IntN(len(coSfx))]
		if used[name] {
			continue
		}
		used[name] = true
		ticker := strings.ToUpper(stem[:min(4, len(stem))])
		cos = append(cos, synthCompany{name: name, ticker: ticker, metrics: r.Perm(len(metrics))[:perCompany]})
	}
	type tool struct {
		Name        string         `json:"name"`
		Description string         `json:"description"`
		InputSchema map[string]any `json:"inputSchema"`
	}
	type server struct {
		Name        string                       `json:"name"`
		Description string                       `json:"description"`
		Category    string                       `json:"category"`
		Tools       map[string]map[string][]tool `json:"tools"`
	}
	schema := map[string]any{"type": "object", "properties": map[string]any{
		"date": map[string]any{"type": "string", "description": "Date of the figure, YYYY-MM-DD (default: the latest)"}}}
	var servers []server
	for _, c := range cos {
		var ts []tool
		for _, m := range c.metrics {
			ts = append(ts, tool{Name: ToolBenchName(c.name, metrics[m].name),
				Description: fmt.Sprintf("%s %s Tool: returns %s of %s (ticker %s), in %s.", c.name, metrics[m].name, metrics[m].desc, c.name, c.ticker, metrics[m].unit),
				InputSchema: schema})
		}
		servers = append(servers, server{Name: c.name, Description: fmt.Sprintf("Financial data for %s (%s)", c.name, c.ticker),
			Category: "Finance", Tools: map[string]map[string][]tool{c.name: {"tools": ts}}})
	}
	// The writer shares the loader's declaration of the layout, so the two
	// cannot drift apart.
	apiOf := func(c synthCompany, m int) stbAPI {
		return stbAPI{Category: "Finance", ToolName: c.name, APIName: metrics[m].name, Description: fmt.Sprintf("Returns %s of %s.", metrics[m].desc, c.name),
			Required: []stbParam{}, Optional: []stbParam{{Name: "date", Type: "STRING", Description: "YYYY-MM-DD", Default: ""}}, Method: "GET"}
	}
	if querySeed != 0 {
		r = rand.New(rand.NewPCG(querySeed, 0x71756572))
	}
	var qs []stbQuery
	prev := -1
	for i := range n {
		k := 1 + r.IntN(4)
		var pairs [][2]int
		seen := map[[2]int]bool{}
		for len(pairs) < k {
			ci := r.IntN(len(cos))
			if prev >= 0 && len(pairs) == 0 && r.IntN(5) < 2 { // a follow-up on the last company
				ci = prev
			}
			p := [2]int{ci, cos[ci].metrics[r.IntN(perCompany)]}
			if !seen[p] {
				seen[p] = true
				pairs = append(pairs, p)
			}
		}
		prev = pairs[len(pairs)-1][0]
		q := stbQuery{QueryID: json.RawMessage(strconv.Itoa(i + 1))}
		var asks []string
		for _, p := range pairs {
			c := cos[p[0]]
			asks = append(asks, fmt.Sprintf("the %s of %s", strings.ToLower(metrics[p[1]].name), c.name))
			q.APIList = append(q.APIList, apiOf(c, p[1]))
			q.Relevant = append(q.Relevant, []string{c.name, metrics[p[1]].name})
		}
		// An API of the same company that the question does not need, as
		// StableToolBench's api_lists hold more than the relevant APIs.
		c := cos[pairs[0][0]]
		for _, m := range c.metrics {
			if !seen[[2]int{pairs[0][0], m}] {
				q.APIList = append(q.APIList, apiOf(c, m))
				break
			}
		}
		q.Query = questionText(r, asks)
		qs = append(qs, q)
	}
	col, err := json.MarshalIndent(servers, "", " ")
	if err != nil {
		return SynthBench{}, err
	}
	qb, err := json.MarshalIndent(qs, "", " ")
	return SynthBench{Collection: col, Queries: qb}, err
}

func questionText(r *rand.Rand, asks []string) string {
	list := asks[0]
	if len(asks) > 1 {
		list = strings.Join(asks[:len(asks)-1], ", ") + " and " + asks[len(asks)-1]
	}
	switch r.IntN(3) {
	case 0:
		return "What is " + list + "?"
	case 1:
		return "Can you look up " + list + " for me?"
	}
	return "I need " + list + "."
}

// Simulate is the benchmark's tool executor: a deterministic result for
// each tool (the same value whatever the arguments, so that the expected
// answer is known), as JSON.
func Simulate(_ context.Context, t agent.CatalogTool, args json.RawMessage) (string, error) {
	var a map[string]any
	if len(args) > 0 {
		if err := json.Unmarshal(args, &a); err != nil {
			return "", fmt.Errorf("arguments are not a JSON object: %w", jsonerr.Explain(err))
		}
	}
	out := map[string]any{"tool": t.Name, "value": Value(t.Name)}
	if d, ok := a["date"].(string); ok && d != "" {
		out["date"] = d
	}
	b, err := json.Marshal(out)
	return string(b), err
}

// Value is the figure Simulate returns for a tool: a number with two
// decimals drawn from the tool's name.
func Value(name string) string {
	h := fnv.New64a()
	h.Write([]byte(name))
	v := h.Sum64()
	return fmt.Sprintf("%d.%02d", 1+v%9000, (v/9000)%100)
}
