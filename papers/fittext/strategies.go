package fittext

import (
	"context"
	"fmt"
	"hash/fnv"
	"math"
	"math/rand/v2"
	"slices"
	"sort"
	"strings"
	"unicode"

	"github.com/agemem/agemem/agent"
)

// Retriever runs the strategies over a knowledge base.
type Retriever struct {
	Config Config
	KB     *agent.Catalog
	// LLM writes the ancestors (the paper's analysis model); Refiner runs
	// every other operator (nil: LLM). The paper pairs GPT-4.1 with
	// GPT-4.1-mini or Qwen3-30B this way.
	LLM, Refiner LLM
	// Seed draws selection, crossover and mutation: each query from its
	// own generator seeded with (Seed, the query's hash), so a run is
	// reproducible whatever order or concurrency the queries run in.
	Seed uint64
}

// Result is one query's retrieval.
type Result struct {
	Query     string      `json:"query"`
	Strategy  string      `json:"strategy"`
	Ancestors []string    `json:"ancestors,omitempty"`
	Finals    []string    `json:"finals,omitempty"` // the descriptions each lineage ended with
	Ranking   []agent.Hit `json:"ranking"`          // best first, each tool once
	Calls     int         `json:"llm_calls"`
}

// Probes is the tool memory 𝓜 of one invocation: what was tried, with
// its generation index and the tools it retrieved (Eq. 7 compares tool
// sets; App. C.2 stores intent strings: both are kept).
type Probes []Probe

// Probe is one remembered probe.
type Probe struct {
	Intent string
	Gen    int
	Tools  []string
}

type run struct {
	r     *Retriever
	query string
	mem   *Probes
	res   *Result
	rand  *rand.Rand
}

func (x *run) gen(ctx context.Context, llm LLM, prompt string, t float64) (string, error) {
	x.res.Calls++
	out, err := llm.Generate(ctx, prompt, t)
	if err != nil {
		return "", fmt.Errorf("fittext: %s: the model: %w", x.res.Strategy, err)
	}
	return out, nil
}

func (x *run) refiner() LLM {
	if x.r.Refiner != nil {
		return x.r.Refiner
	}
	return x.r.LLM
}

// ret is RET for several descriptions at once.
func (x *run) ret(ctx context.Context, ds []string, k int) ([][]agent.Hit, error) {
	return x.r.KB.Rank(ctx, ds, k)
}

func names(hs []agent.Hit) []string {
	out := make([]string, len(hs))
	for i, h := range hs {
		out[i] = h.Name
	}
	return out
}

func blurbs(kb *agent.Catalog, hs []agent.Hit) []string {
	out := make([]string, 0, len(hs))
	for _, h := range hs {
		t, _ := kb.Get(h.Name)
		out = append(out, t.Description)
	}
	return out
}

// Retrieve runs strategy (one of Strategies) for query: the analysis call
// writes the ancestors, then the strategy runs on them with a fresh tool
// memory.
func (r *Retriever) Retrieve(ctx context.Context, strategy, query string) (Result, error) {
	x, err := r.start(strategy, query, query, &Probes{})
	if err != nil {
		return Result{}, err
	}
	res := x.res
	if strategy == "query" { // the static baseline: no model
		hits, err := x.ret(ctx, []string{query}, r.Config.K)
		if err != nil {
			return *res, err
		}
		res.Ranking = hits[0]
		return *res, nil
	}
	out, err := x.gen(ctx, r.LLM, analysisPrompt(query), r.Config.AnalysisTemp)
	if err != nil {
		return *res, err
	}
	ancestors := ParseBlocks(out)
	if len(ancestors) == 0 {
		// A model that writes no block: its reply (or the query) is the one
		// ancestor, so that every strategy still retrieves.
		a := strings.TrimSpace(out)
		if a == "" {
			a = query
		}
		ancestors = []string{a}
	}
	err = x.expand(ctx, ancestors)
	return *res, err
}

// Expand runs strategy on pseudo-tools an agent already wrote (FitText's
// agent loop: no analysis call) with mem, the tool memory of the whole
// invocation, which it extends. Its draws are seeded by the query and the
// ancestors.
func (r *Retriever) Expand(ctx context.Context, strategy, query string, ancestors []string, mem *Probes) (Result, error) {
	if strategy == "query" || len(ancestors) == 0 {
		return Result{}, fmt.Errorf("fittext: Expand needs pseudo-tools and a strategy that uses them, not %q", strategy)
	}
	x, err := r.start(strategy, query, query+"\x00"+strings.Join(ancestors, "\x00"), mem)
	if err != nil {
		return Result{}, err
	}
	err = x.expand(ctx, ancestors)
	return *x.res, err
}

func (r *Retriever) start(strategy, query, seed string, mem *Probes) (*run, error) {
	if err := CheckStrategy(strategy); err != nil {
		return nil, err
	}
	if err := r.Config.Validate(); err != nil {
		return nil, err
	}
	if strategy != "query" && r.LLM == nil {
		return nil, fmt.Errorf("fittext: strategy %s needs a model", strategy)
	}
	h := fnv.New64a()
	h.Write([]byte(seed))
	return &run{r: r, query: query, mem: mem, res: &Result{Query: query, Strategy: strategy},
		rand: rand.New(rand.NewPCG(r.Seed, h.Sum64()))}, nil
}

// expand runs the strategy on the ancestors into x.res.
func (x *run) expand(ctx context.Context, ancestors []string) error {
	c := x.r.Config
	res := x.res
	res.Ancestors = ancestors
	if res.Strategy == "ibi" { // one global refinement of all the ancestors
		finals, lists, err := x.ibi(ctx, ancestors)
		if err != nil {
			return err
		}
		res.Finals, res.Ranking = finals, merge(lists)
		return nil
	}
	var lists [][]agent.Hit
	for _, a := range ancestors {
		var list []agent.Hit
		var final string
		var err error
		switch res.Strategy {
		case "single":
			final = a
			hits, err := x.ret(ctx, []string{a}, c.K)
			if err != nil {
				return err
			}
			list = hits[0]
			x.remember(Probe{Intent: a, Tools: names(list)})
		case "dbd":
			final, list, err = x.dbd(ctx, a)
		case "scattershot":
			final, list, err = x.scattershot(ctx, a)
		case "memetic":
			final, list, err = x.memetic(ctx, a, false)
		case "memetic-v2":
			final, list, err = x.memetic(ctx, a, true)
		}
		if err != nil {
			return err
		}
		res.Finals = append(res.Finals, final)
		lists = append(lists, list)
	}
	res.Ranking = merge(lists)
	return nil
}

func (x *run) remember(es ...Probe) { *x.mem = append(*x.mem, es...) }

// merge concatenates the lineages' lists, each tool once (the first time).
func merge(lists [][]agent.Hit) []agent.Hit {
	seen := map[string]bool{}
	var out []agent.Hit
	for _, l := range lists {
		for _, h := range l {
			if !seen[h.Name] {
				seen[h.Name] = true
				out = append(out, h)
			}
		}
	}
	return out
}

// dbd is Algorithm 3 for one lineage: T refinements, each grounded in the
// lineage's deduplicated exemplars with the ancestor as anchor.
func (x *run) dbd(ctx context.Context, a string) (string, []agent.Hit, error) {
	c := x.r.Config
	d := a
	var ex []agent.Hit
	for range c.Turns {
		hits, err := x.ret(ctx, []string{d}, c.Exemplars)
		if err != nil {
			return "", nil, err
		}
		for _, h := range hits[0] {
			if !slices.ContainsFunc(ex, func(e agent.Hit) bool { return e.Name == h.Name }) {
				ex = append(ex, h)
			}
		}
		out, err := x.gen(ctx, x.refiner(), refinePrompt(x.query, a, d, blurbs(x.r.KB, ex)), c.RefineTemp)
		if err != nil {
			return "", nil, err
		}
		if next := ParseSingle(out); next != "" {
			d = next
		}
	}
	hits, err := x.ret(ctx, []string{d}, c.K)
	if err != nil {
		return "", nil, err
	}
	x.remember(Probe{Intent: d, Tools: names(hits[0])})
	return d, hits[0], nil
}

// scattershot is Algorithm 5 for one lineage: S probes sampled from the
// ancestor and its exemplars, voted on (the ancestor itself does not
// vote). With no usable probe the ancestor's own retrieval stands.
func (x *run) scattershot(ctx context.Context, a string) (string, []agent.Hit, error) {
	c := x.r.Config
	seed, err := x.ret(ctx, []string{a}, c.Exemplars)
	if err != nil {
		return "", nil, err
	}
	var probes []string
	for range c.Scatter {
		out, err := x.gen(ctx, x.refiner(), scatterPrompt(x.query, a, blurbs(x.r.KB, seed[0])), c.ScatterTemp)
		if err != nil {
			return "", nil, err
		}
		if p := ParseSingle(out); p != "" {
			probes = append(probes, p)
		}
	}
	if len(probes) == 0 {
		hits, err := x.ret(ctx, []string{a}, c.K)
		if err != nil {
			return "", nil, err
		}
		return a, hits[0], nil
	}
	hits, err := x.ret(ctx, probes, c.K)
	if err != nil {
		return "", nil, err
	}
	return probes[0], Vote(hits, c.B), nil
}

// Vote is VOTE (Algorithm 7): the tools the probes retrieved, ordered by
// how many probes retrieved them, then mean rank, then mean similarity
// (then name, for a stable order); the first b. A tool's score is its
// mean similarity.
func Vote(lists [][]agent.Hit, b int) []agent.Hit {
	type tally struct {
		votes      int
		rank, sims float64
	}
	t := map[string]*tally{}
	for _, l := range lists {
		for i, h := range l {
			v := t[h.Name]
			if v == nil {
				v = &tally{}
				t[h.Name] = v
			}
			v.votes++
			v.rank += float64(i + 1)
			v.sims += h.Score
		}
	}
	ids := make([]string, 0, len(t))
	for id := range t {
		ids = append(ids, id)
	}
	sort.Slice(ids, func(i, j int) bool {
		a, b := t[ids[i]], t[ids[j]]
		if a.votes != b.votes {
			return a.votes > b.votes
		}
		ra, rb := a.rank/float64(a.votes), b.rank/float64(b.votes)
		if ra != rb {
			return ra < rb
		}
		sa, sb := a.sims/float64(a.votes), b.sims/float64(b.votes)
		if sa != sb {
			return sa > sb
		}
		return ids[i] < ids[j]
	})
	out := make([]agent.Hit, 0, min(b, len(ids)))
	for _, id := range ids[:min(b, len(ids))] {
		out = append(out, agent.Hit{Name: id, Score: t[id].sims / float64(t[id].votes)})
	}
	return out
}

// SRet is s_ret: 0.7 × the top-1 similarity + 0.3 × the mean of the
// top 3 (of those there are).
func SRet(hs []agent.Hit) float64 {
	if len(hs) == 0 {
		return 0
	}
	n := min(3, len(hs))
	var s float64
	for _, h := range hs[:n] {
		s += h.Score
	}
	return 0.7*hs[0].Score + 0.3*s/float64(n)
}

// Jaccard is |A∩B| / |A∪B| of two sets (0 when both are empty).
func Jaccard(a, b []string) float64 {
	sa, sb := map[string]bool{}, map[string]bool{}
	for _, x := range a {
		sa[x] = true
	}
	for _, x := range b {
		sb[x] = true
	}
	inter := 0
	for x := range sa {
		if sb[x] {
			inter++
		}
	}
	union := len(sa) + len(sb) - inter
	if union == 0 {
		return 0
	}
	return float64(inter) / float64(union)
}

// Penalty is the memory term of Eq. 7: 0.5 × the largest overlap with a
// remembered probe, counted when above 0.3. The overlap is of tool sets
// (the paper) or of the descriptions' lower-cased words (mode "text", the
// authors' code).
func (m Probes) Penalty(mode, d string, tools []string) float64 {
	best := 0.0
	for _, e := range m {
		best = math.Max(best, e.overlap(mode, d, tools))
	}
	if best > 0.3 {
		return 0.5 * best
	}
	return 0
}

// Decayed is Memetic V2's memory term (Eq. 17): the largest of 0.5 × the
// overlap × e^(−g/3) over the remembered probes, with no gate; a probe
// remembered at generation 0 weighs most.
func (m Probes) Decayed(mode, d string, tools []string) float64 {
	best := 0.0
	for _, e := range m {
		best = math.Max(best, 0.5*e.overlap(mode, d, tools)*math.Exp(-float64(e.Gen)/3))
	}
	return best
}

func (e Probe) overlap(mode, d string, tools []string) float64 {
	if mode == "text" {
		return Jaccard(strings.Fields(strings.ToLower(d)), strings.Fields(strings.ToLower(e.Intent)))
	}
	return Jaccard(tools, e.Tools)
}

// ibi is Algorithm 4 (IBI): every description refined together in one
// prompt per turn, grounded in all the tools retrieved so far; with
// ibi_judge, a judge may end the turns early. A refinement that writes no
// block ends them too. Each final description's retrieval is a list.
func (x *run) ibi(ctx context.Context, ds []string) ([]string, [][]agent.Hit, error) {
	c := x.r.Config
	var ex []agent.Hit
	for range c.Turns {
		hits, err := x.ret(ctx, ds, c.Exemplars)
		if err != nil {
			return nil, nil, err
		}
		for _, l := range hits {
			for _, h := range l {
				if !slices.ContainsFunc(ex, func(e agent.Hit) bool { return e.Name == h.Name }) {
					ex = append(ex, h)
				}
			}
		}
		if c.IBIJudge {
			out, err := x.gen(ctx, x.refiner(), sufficiencyPrompt(x.query, blurbs(x.r.KB, ex)), 0)
			if err != nil {
				return nil, nil, err
			}
			if yes(out) {
				break
			}
		}
		out, err := x.gen(ctx, x.refiner(), ibiPrompt(x.query, ds, blurbs(x.r.KB, ex)), c.RefineTemp)
		if err != nil {
			return nil, nil, err
		}
		next := ParseBlocks(out)
		if len(next) == 0 {
			break
		}
		ds = next
	}
	lists, err := x.ret(ctx, ds, c.K)
	if err != nil {
		return nil, nil, err
	}
	for i, d := range ds {
		x.remember(Probe{Intent: d, Tools: names(lists[i])})
	}
	return ds, lists, nil
}

// yes reads a judge's verdict: its first word is "yes".
func yes(reply string) bool {
	f := strings.FieldsFunc(strings.ToLower(reply), func(r rune) bool { return !unicode.IsLetter(r) })
	return len(f) > 0 && f[0] == "yes"
}
