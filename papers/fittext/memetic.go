package fittext

import (
	"context"
	"math"
	"regexp"
	"sort"
	"strconv"

	"github.com/agemem/agemem/agent"
	"github.com/agemem/agemem/embed"
)

// memetic is Memetic retrieval for one lineage: Algorithm 1 (V1) or, with
// v2, Algorithm 8 (V2). Both seed a population from the ancestor and its
// exemplars, then for G generations evaluate it (RET of each member, its
// fitness), stop at fitness θ or generation G, select parents, breed
// offspring by crossover or mutation beside the elite, refine each
// offspring against what it retrieves (the local search), and vote over
// the last population. V2 differs in the fitness (Eq. 15: the LLM judge's
// score, a decaying memory term and crowding), the annealed temperatures
// (Eq. 16), tournament selection (Eq. 19), the crossover rate (Eq. 20),
// guided mutation (Eq. 21) and what it remembers.
func (x *run) memetic(ctx context.Context, a string, v2 bool) (string, []agent.Hit, error) {
	c := x.r.Config
	n := c.Population
	if v2 {
		n = c.V2.Population
	}
	temp := func(g int) float64 { return c.MemeticTemp }
	if v2 {
		temp = func(g int) float64 { return annealed(c.MemeticTemp, g) }
	}
	seed, err := x.ret(ctx, []string{a}, c.Exemplars)
	if err != nil {
		return "", nil, err
	}
	out, err := x.gen(ctx, x.refiner(), seedPrompt(x.query, a, blurbs(x.r.KB, seed[0]), n), temp(0))
	if err != nil {
		return "", nil, err
	}
	pop := ParseBlocks(out)
	for len(pop) < n { // a model that wrote fewer: the ancestor fills in
		pop = append(pop, a)
	}
	pop = pop[:n]
	var best string
	var hits [][]agent.Hit
	g := 1
	for ; ; g++ {
		if hits, err = x.ret(ctx, pop, c.K); err != nil {
			return "", nil, err
		}
		var fit []float64
		if v2 {
			if fit, err = x.fitnessV2(ctx, pop, hits); err != nil {
				return "", nil, err
			}
		} else {
			fit = make([]float64, len(pop))
			for i, d := range pop {
				fit[i] = SRet(hits[i]) - x.mem.Penalty(c.MemoryPenalty, d, names(hits[i]))
			}
		}
		order := make([]int, len(pop))
		for i := range order {
			order[i] = i
		}
		sort.SliceStable(order, func(i, j int) bool { return fit[order[i]] > fit[order[j]] })
		best = pop[order[0]]
		if fit[order[0]] >= c.Theta || g == c.Generations {
			break
		}
		// Parents, as indices into pop (so that guided mutation sees what
		// a parent retrieved).
		var sel []int
		pCross := c.Crossover
		if v2 {
			sel = x.tournament(fit, (len(pop)+1)/2, c.V2.Tournament)
			pCross = math.Max(0.4, 0.6-0.1*float64(g))
		} else {
			sel = order[:(len(pop)+1)/2] // truncation selection: the top ⌈N/2⌉
		}
		next := []string{best} // elitism
		for len(next) < n {
			var fallback string
			if len(sel) >= 2 && x.rand.Float64() < pCross {
				p := x.rand.Perm(len(sel))
				p1, p2 := pop[sel[p[0]]], pop[sel[p[1]]]
				fallback = p1
				out, err = x.gen(ctx, x.refiner(), crossoverPrompt(x.query, a, p1, p2), temp(g))
			} else {
				i := sel[x.rand.IntN(len(sel))]
				fallback = pop[i]
				prompt, t := mutationPrompt(x.query, a, pop[i]), temp(g)
				if v2 {
					if low := lowTools(hits[i], c.V2.GuidedTools, c.V2.GuidedGap); len(low) > 0 {
						prompt = guidedPrompt(x.query, a, pop[i], blurbs(x.r.KB, low))
					}
					t = min(t+0.1, 2) // V2's mutation bonus
				}
				out, err = x.gen(ctx, x.refiner(), prompt, t)
			}
			if err != nil {
				return "", nil, err
			}
			child := ParseSingle(out)
			if child == "" { // no block: the parent passes on unchanged
				child = fallback
			}
			next = append(next, child)
		}
		// Memetic local search: each offspring refined against what it
		// retrieves before it is evaluated.
		kids, err := x.ret(ctx, next[1:], c.Exemplars)
		if err != nil {
			return "", nil, err
		}
		for i := 1; i < len(next); i++ {
			out, err := x.gen(ctx, x.refiner(), refinePrompt(x.query, a, next[i], blurbs(x.r.KB, kids[i-1])), temp(g))
			if err != nil {
				return "", nil, err
			}
			if d := ParseSingle(out); d != "" {
				next[i] = d
			}
		}
		pop = next
	}
	bestHits, err := x.ret(ctx, []string{a, best}, c.K)
	if err != nil {
		return "", nil, err
	}
	// V1 remembers both at the generation it stopped in; V2 the ancestor
	// at G and the best at 0, so that the freshest weighs most (Eq. 17).
	ga, gb := g, g
	if v2 {
		ga, gb = c.Generations, 0
	}
	x.remember(Probe{Intent: a, Gen: ga, Tools: names(bestHits[0])}, Probe{Intent: best, Gen: gb, Tools: names(bestHits[1])})
	return best, Vote(hits, c.B), nil
}

// annealed is Eq. 16's temperature at generation g from base tb:
// max(tb − 0.4, tb + 0.1 − 0.15 g), at most 2 (what chat APIs accept).
func annealed(tb float64, g int) float64 {
	return min(2, math.Max(tb-0.4, tb+0.1-0.15*float64(g)))
}

// fitnessV2 is Eq. 15 for each member of pop, hits its retrievals:
// α s_ret + β LLM_score − γ mem − δ crowd.
func (x *run) fitnessV2(ctx context.Context, pop []string, hits [][]agent.Hit) ([]float64, error) {
	v := x.r.Config.V2
	vecs, err := x.r.KB.Embedder().Embed(ctx, pop)
	if err != nil {
		return nil, err
	}
	crowd := Crowding(vecs, v.Crowding)
	fit := make([]float64, len(pop))
	for i, d := range pop {
		score := 0.0
		if v.Beta != 0 { // the judge is a call per member and generation
			tools := make([]string, len(hits[i]))
			for j, h := range hits[i] {
				t, _ := x.r.KB.Get(h.Name)
				tools[j] = h.Name + ": " + t.Description
			}
			out, err := x.gen(ctx, x.refiner(), fitnessPrompt(x.query, d, tools), 0)
			if err != nil {
				return nil, err
			}
			score = JudgeScore(out)
		}
		fit[i] = v.Alpha*SRet(hits[i]) + v.Beta*score - v.Gamma*x.mem.Decayed(x.r.Config.MemoryPenalty, d, names(hits[i])) - v.Delta*crowd[i]
	}
	return fit, nil
}

var decimal = regexp.MustCompile(`[-+]?(?:\d+\.?\d*|\.\d+)`)

// JudgeScore reads the fitness judge's reply: its first number, clamped
// to [0, 1]; a reply with no number scores 0.
func JudgeScore(reply string) float64 {
	m := decimal.FindString(reply)
	if m == "" {
		return 0
	}
	v, err := strconv.ParseFloat(m, 64)
	if err != nil || math.IsNaN(v) {
		return 0
	}
	return math.Min(1, math.Max(0, v))
}

// Crowding is Eq. 18 for each vector: the share of the others whose
// cosine with it is above theta (0 for a population of one).
func Crowding(vecs [][]float32, theta float64) []float64 {
	out := make([]float64, len(vecs))
	if len(vecs) < 2 {
		return out
	}
	for i := range vecs {
		close := 0
		for j := range vecs {
			if j != i && embed.Cosine(vecs[i], vecs[j]) > theta {
				close++
			}
		}
		out[i] = float64(close) / float64(len(vecs)-1)
	}
	return out
}

// tournament is Eq. 19's selection: want distinct winners, each the
// fittest of size members drawn without replacement. Ties of equal fitness
// can make a tournament keep returning a winner already chosen, so after
// a bounded number of draws the fittest members not yet chosen fill in.
func (x *run) tournament(fit []float64, want, size int) []int {
	want = min(want, len(fit))
	size = min(size, len(fit))
	chosen := map[int]bool{}
	var out []int
	for draws := 0; len(out) < want && draws < 64*len(fit); draws++ {
		p := x.rand.Perm(len(fit))[:size]
		w := p[0]
		for _, i := range p[1:] {
			if fit[i] > fit[w] {
				w = i
			}
		}
		if !chosen[w] {
			chosen[w] = true
			out = append(out, w)
		}
	}
	if len(out) < want {
		rest := make([]int, 0, len(fit))
		for i := range fit {
			if !chosen[i] {
				rest = append(rest, i)
			}
		}
		sort.SliceStable(rest, func(i, j int) bool { return fit[rest[i]] > fit[rest[j]] })
		out = append(out, rest[:want-len(out)]...)
	}
	return out
}

// lowTools is guided mutation's 𝓛(d): the m lowest-scoring of a parent's
// retrieved tools, when they score more than gap under its best one (none
// otherwise: then plain mutation).
func lowTools(hits []agent.Hit, m int, gap float64) []agent.Hit {
	if m == 0 || len(hits) < 2 {
		return nil
	}
	sorted := append([]agent.Hit(nil), hits...)
	sort.SliceStable(sorted, func(i, j int) bool { return sorted[i].Score > sorted[j].Score })
	var low []agent.Hit
	for i := len(sorted) - 1; i >= 1 && len(low) < m; i-- {
		if sorted[i].Score < sorted[0].Score-gap {
			low = append(low, sorted[i])
		}
	}
	return low
}
