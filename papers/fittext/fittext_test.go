package fittext

import (
	"context"
	"fmt"
	"hash/fnv"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/agemem/agemem/agent"
	"github.com/agemem/agemem/bench/toolret"
	"github.com/agemem/agemem/embed"
)

// scripted is a model obeying the block contract. As the analyst it
// writes, per query, the capability the generator's goal phrasing stands
// for in the database's words (good) or the query itself (!good); every
// other operator returns a variation of its input. It counts its calls by
// operator.
type scripted struct {
	good bool
	// enough is the sufficiency judge's call on which it says yes (0:
	// never).
	enough int
	mu     sync.Mutex
	calls  map[string]int
	temps  map[string][]float64
}

func newScripted(good bool) *scripted {
	return &scripted{good: good, calls: map[string]int{}, temps: map[string][]float64{}}
}

var provider = regexp.MustCompile(`Use (\w+)\.`)

func wrap(s string) string { return Begin + " " + s + " " + End }

func (s *scripted) Generate(_ context.Context, p string, t float64) (string, error) {
	op := "?"
	switch {
	case strings.HasPrefix(p, "You can use many tools"):
		op = "analysis"
	case strings.Contains(p, "Produce "):
		op = "seed"
	case strings.Contains(p, "Parent 2:"):
		op = "crossover"
	case strings.Contains(p, "steers AWAY"):
		op = "guided"
	case strings.Contains(p, "Improve the whole set"):
		op = "ibi"
	case strings.HasPrefix(p, "Decide whether the functions"):
		op = "sufficiency"
	case strings.HasPrefix(p, "Rate how well"):
		op = "judge"
	case strings.Contains(p, "mutated variant"):
		op = "mutation"
	case strings.Contains(p, "diversified"):
		op = "scatter"
	case strings.Contains(p, "Refine exactly one"):
		op = "refine"
	}
	s.mu.Lock()
	s.calls[op]++
	s.temps[op] = append(s.temps[op], t)
	nth := s.calls[op]
	s.mu.Unlock()
	noise := []string{"quickly", "data", "service", "api", "information"}
	h := fnv.New32a()
	h.Write([]byte(p))
	pick := func() string { return noise[h.Sum32()%uint32(len(noise))] } // the same prompt, the same reply
	switch op {
	case "analysis":
		q := p[strings.LastIndex(p, "Task: ")+6:]
		var blocks []string
		for _, in := range intents {
			for _, g := range in.goals {
				head, _, _ := strings.Cut(g, "%s")
				if strings.HasPrefix(q, head) {
					prov := ""
					if m := provider.FindStringSubmatch(q); m != nil {
						prov = m[1]
					}
					if s.good {
						blocks = append(blocks, wrap(prov+": "+in.vocab), wrap(prov+" "+in.key))
					} else {
						blocks = append(blocks, wrap(q))
					}
				}
			}
		}
		return strings.Join(blocks, "\n"), nil
	case "seed":
		var n int
		fmt.Sscanf(p[strings.Index(p, "Produce ")+8:], "%d", &n)
		anc := between(p, "Ancestor description (keep its intent):\n", "\n")
		var out []string
		for i := range n {
			out = append(out, wrap(anc+" "+noise[i%len(noise)]))
		}
		return strings.Join(out, "\n"), nil
	case "crossover":
		return wrap(between(p, "Parent 1:\n", "\n") + " " + pick()), nil
	case "mutation", "guided":
		return wrap(between(p, "Parent:\n", "\n") + " " + pick()), nil
	case "ibi":
		var out []string
		for _, d := range ParseBlocks(between(p, "Current function descriptions:\n", "\n\n")) {
			out = append(out, wrap(d+" "+pick()))
		}
		return strings.Join(out, "\n"), nil
	case "sufficiency":
		if nth == s.enough {
			return "Yes.", nil
		}
		return "no", nil
	case "judge": // a score that favours pseudo-tools naming a provider
		if strings.Contains(between(p, "Pseudo-tool used for retrieval: ", "\n"), ":") {
			return "0.8", nil
		}
		return "Score: 0.3", nil
	case "scatter":
		return wrap(between(p, "Draft description (reference only; do not copy it):\n", "\n") + " " + pick()), nil
	case "refine":
		return wrap(between(p, "Draft description to refine:\n", "\n")), nil
	}
	return "", fmt.Errorf("unknown prompt: %.80s", p)
}

func between(s, a, b string) string {
	_, rest, _ := strings.Cut(s, a)
	out, _, _ := strings.Cut(rest, b)
	return out
}

func synthData(t *testing.T, providers, n int) toolret.Dataset {
	t.Helper()
	corpus, queries, err := Synth(3, providers, n)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	cp, qp := filepath.Join(dir, "tools.jsonl"), filepath.Join(dir, "queries.jsonl")
	os.WriteFile(cp, corpus, 0o644)
	os.WriteFile(qp, queries, 0o644)
	ds, err := toolret.LoadToolRet(qp, cp)
	if err != nil {
		t.Fatal(err)
	}
	return ds
}

func retriever(t *testing.T, ds toolret.Dataset, llm LLM) *Retriever {
	t.Helper()
	kb, err := agent.NewCatalog(context.Background(), embed.NewHashing(512, []int{3, 4}), ds.Tools)
	if err != nil {
		t.Fatal(err)
	}
	return &Retriever{Config: DefaultConfig(), KB: kb, LLM: llm, Seed: 7}
}

func TestParseBlocks(t *testing.T) {
	text := "think...\n" + wrap("first tool") + " and " + Begin + "  \n " + End + wrap("second\nline") + Begin + " unterminated"
	if got := ParseBlocks(text); len(got) != 2 || got[0] != "first tool" || got[1] != "second\nline" {
		t.Fatalf("blocks %q", got)
	}
	if ParseSingle("no blocks") != "" || ParseSingle(text) != "first tool" {
		t.Fatal("ParseSingle")
	}
}

// VOTE on hand-worked lists: votes first, then mean rank, then mean
// similarity, then name.
func TestVoteHandWorked(t *testing.T) {
	h := func(n string, s float64) agent.Hit { return agent.Hit{Name: n, Score: s} }
	lists := [][]agent.Hit{
		{h("a", 0.9), h("b", 0.8), h("c", 0.7)},
		{h("b", 0.85), h("a", 0.6), h("d", 0.5)},
		{h("c", 0.9), h("e", 0.4)},
	}
	// a: 2 votes, ranks 1,2 (1.5), sims .9,.6 (.75); b: 2 votes, ranks 2,1 (1.5), sims .8,.85 (.825)
	// c: 2 votes, ranks 3,1 (2); d: 1 vote rank 3; e: 1 vote rank 2.
	got := Vote(lists, 4)
	want := []string{"b", "a", "c", "e"}
	for i, w := range want {
		if got[i].Name != w {
			t.Fatalf("vote order %v, want %v", got, want)
		}
	}
	if math.Abs(got[0].Score-0.825) > 1e-12 || len(Vote(lists, 10)) != 5 {
		t.Fatalf("scores %v", got)
	}
}

func TestFitnessHandWorked(t *testing.T) {
	h := func(s ...float64) []agent.Hit {
		var out []agent.Hit
		for i, x := range s {
			out = append(out, agent.Hit{Name: fmt.Sprint(i), Score: x})
		}
		return out
	}
	if got := SRet(h(0.9, 0.6, 0.3, 0.1)); math.Abs(got-(0.63+0.3*0.6)) > 1e-12 {
		t.Fatalf("s_ret %v", got)
	}
	if got := SRet(h(0.5)); math.Abs(got-0.5) > 1e-12 || SRet(nil) != 0 {
		t.Fatalf("s_ret of one %v", got)
	}
	m := Probes{{Intent: "get the weather forecast", Tools: []string{"a", "b", "c"}}}
	// Tools: {a,b,x} vs {a,b,c}: J = 2/4 = 0.5 > 0.3 → 0.25; {a,x,y}: 1/5 = 0.2 → 0.
	if p := m.Penalty("tools", "", []string{"a", "b", "x"}); math.Abs(p-0.25) > 1e-12 {
		t.Fatalf("tools penalty %v", p)
	}
	if p := m.Penalty("tools", "", []string{"a", "x", "y"}); p != 0 {
		t.Fatalf("penalty under the gate %v", p)
	}
	// Text: {get,the,weather,report} vs {get,the,weather,forecast}: 3/5 = 0.6 → 0.3.
	if p := m.Penalty("text", "Get the weather report", nil); math.Abs(p-0.3) > 1e-12 {
		t.Fatalf("text penalty %v", p)
	}
}

// Every strategy's control flow: how many calls of which operator, at
// which temperature, and what each returns.
func TestStrategiesControlFlow(t *testing.T) {
	ds := synthData(t, 10, 6)
	q := ds.Queries[0].Text
	c := DefaultConfig()
	for _, tc := range []struct {
		strategy string
		calls    map[string]int
	}{
		{"query", map[string]int{}},
		{"single", map[string]int{"analysis": 1}},
		{"dbd", map[string]int{"analysis": 1, "refine": 2 * c.Turns}},
		{"scattershot", map[string]int{"analysis": 1, "scatter": 2 * c.Scatter}},
		// Two lineages; θ is out of reach, so G-1 = 2 rounds of 5 offspring,
		// each refined.
		{"memetic", map[string]int{"analysis": 1, "seed": 2, "refine": 2 * 2 * (c.Population - 1)}},
		// IBI: one global refinement a turn for both ancestors.
		{"ibi", map[string]int{"analysis": 1, "ibi": c.Turns}},
		// V2: its fitness can never reach θ (at most α + β = 0.8 < 0.95),
		// so every generation is judged, member by member.
		{"memetic-v2", map[string]int{"analysis": 1, "seed": 2, "judge": 2 * c.Generations * c.V2.Population,
			"refine": 2 * 2 * (c.V2.Population - 1)}},
	} {
		m := newScripted(true)
		r := retriever(t, ds, m)
		if tc.strategy != "memetic-v2" {
			r.Config.Theta = 2
		}
		res, err := r.Retrieve(context.Background(), tc.strategy, q)
		if err != nil {
			t.Fatal(err)
		}
		got := m.calls
		if tc.strategy == "memetic" {
			ops := got["crossover"] + got["mutation"]
			if ops != 2*2*(c.Population-1) || got["crossover"] == 0 || got["mutation"] == 0 {
				t.Fatalf("memetic: %d crossovers and %d mutations", got["crossover"], got["mutation"])
			}
			delete(got, "crossover")
			delete(got, "mutation")
			for _, x := range m.temps["seed"] {
				if x != 1.5 {
					t.Fatalf("memetic temperature %v", x)
				}
			}
		}
		if tc.strategy == "memetic-v2" {
			// Offspring: crossovers at T_g (1.45, then 1.30), mutations
			// plain or guided at T_g + 0.1, refinements at T_g, the judge
			// at 0, the seed at T_0 = 1.6 (Eq. 16).
			ops := got["crossover"] + got["mutation"] + got["guided"]
			if ops != 2*2*(c.V2.Population-1) || got["crossover"] == 0 || got["mutation"]+got["guided"] == 0 {
				t.Fatalf("memetic-v2: %d crossovers, %d mutations and %d guided", got["crossover"], got["mutation"], got["guided"])
			}
			want := map[string][]float64{"seed": {1.6}, "crossover": {1.45, 1.3}, "mutation": {1.55, 1.4}, "guided": {1.55, 1.4},
				"refine": {1.45, 1.3}, "judge": {0}, "analysis": {0}}
			for op, temps := range m.temps {
				for _, x := range temps {
					if !slices.ContainsFunc(want[op], func(w float64) bool { return math.Abs(w-x) < 1e-9 }) {
						t.Fatalf("memetic-v2: %s at temperature %v, want one of %v", op, x, want[op])
					}
				}
			}
			t.Logf("memetic-v2 offspring: %d crossovers, %d mutations, %d guided", got["crossover"], got["mutation"], got["guided"])
			delete(got, "crossover")
			delete(got, "mutation")
			delete(got, "guided")
		}
		if fmt.Sprint(got) != fmt.Sprint(tc.calls) {
			t.Fatalf("%s: calls %v, want %v", tc.strategy, got, tc.calls)
		}
		if len(res.Ranking) == 0 || len(res.Ranking) > 2*c.K {
			t.Fatalf("%s: ranking of %d", tc.strategy, len(res.Ranking))
		}
		if tc.strategy == "dbd" && m.temps["refine"][0] != 0.7 {
			t.Fatalf("dbd temperature %v", m.temps["refine"][0])
		}
		if tc.strategy == "scattershot" && m.temps["scatter"][0] != 1.5 {
			t.Fatalf("scattershot temperature %v", m.temps["scatter"][0])
		}
	}
	// IBI's judge (ibi_judge) ends the turns when it says the tools
	// suffice: here at its second call, so one refinement ran.
	m := newScripted(true)
	m.enough = 2
	r := retriever(t, ds, m)
	r.Config.IBIJudge = true
	if res, err := r.Retrieve(context.Background(), "ibi", q); err != nil || len(res.Finals) != 2 || len(res.Ranking) == 0 {
		t.Fatalf("ibi with its judge: %v %+v", err, res)
	}
	if fmt.Sprint(m.calls) != fmt.Sprint(map[string]int{"analysis": 1, "ibi": 1, "sufficiency": 2}) {
		t.Fatalf("ibi with its judge: calls %v", m.calls)
	}
	// A model that writes no block still retrieves (with its reply).
	r = retriever(t, ds, LLMFunc(func(context.Context, string, float64) (string, error) { return "", nil }))
	for _, st := range []string{"dbd", "ibi", "memetic-v2"} {
		if res, err := r.Retrieve(context.Background(), st, q); err != nil || len(res.Ranking) == 0 || res.Ancestors[0] != q {
			t.Fatalf("%s, empty analysis: %v %+v", st, err, res)
		}
	}
	if _, err := r.Retrieve(context.Background(), "genetic", q); err == nil {
		t.Fatal("unknown strategy accepted")
	}
}

// The point of FitText, on the generated data: an analyst that describes
// the tool in the database's words retrieves better than the user's
// query; one that echoes the query does not.
func TestPseudoToolsBeatTheQuery(t *testing.T) {
	ds := synthData(t, 20, 60)
	good := retriever(t, ds, newScripted(true))
	ev, err := Evaluate(context.Background(), good, ds, []string{"query", "single", "ibi", "memetic", "memetic-v2"}, 5, 1, nil)
	if err != nil {
		t.Fatal(err)
	}
	all := map[string]float64{}
	for _, r := range ev.Rows {
		if r.Subset == "all" {
			all[r.Strategy] = r.Metrics.NDCG
			if r.Queries != 60 {
				t.Fatalf("%s: %d queries", r.Strategy, r.Queries)
			}
		}
	}
	t.Logf("NDCG@5: %v", all)
	if !(all["single"] > all["query"]+0.1) || !(all["memetic"] > all["query"]+0.1) || !(all["ibi"] > all["query"]+0.1) || !(all["memetic-v2"] > all["query"]+0.1) {
		t.Fatalf("pseudo-tools in the tools' words did not beat the query: %v", all)
	}
	// Queries run concurrently give the same rankings.
	ev4, err := Evaluate(context.Background(), retriever(t, ds, newScripted(true)), ds, []string{"memetic", "memetic-v2"}, 5, 4, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, st := range []string{"memetic", "memetic-v2"} {
		for i, res := range ev4.Results[st] {
			if fmt.Sprint(res.Ranking) != fmt.Sprint(ev.Results[st][i].Ranking) {
				t.Fatalf("%s, query %d: 4 workers ranked %v, one %v", st, i, res.Ranking, ev.Results[st][i].Ranking)
			}
		}
	}
	echo := retriever(t, ds, newScripted(false))
	ev2, err := Evaluate(context.Background(), echo, ds, []string{"single"}, 5, 1, nil)
	if err != nil {
		t.Fatal(err)
	}
	if e := ev2.Rows[len(ev2.Rows)-1].Metrics.NDCG; math.Abs(e-all["query"]) > 0.05 {
		t.Fatalf("echoing the query gave %v, the query %v", e, all["query"])
	}
}

func TestLoaders(t *testing.T) {
	dir := t.TempDir()
	write := func(name, body string) string {
		p := filepath.Join(dir, name)
		os.WriteFile(p, []byte(body), 0o644)
		return p
	}
	corpus := write("tools.jsonl", `{"id": "gorilla/torch.reshape", "documentation": {"name": "reshape", "description": "Reshape a tensor"}}
{"id": 7, "description": "Sort a list"}
`)
	qs := write("gorilla-pytorch.jsonl", `{"id": "q1", "query": "flatten my array", "labels": "[{\"id\": \"gorilla/torch.reshape\", \"relevance\": 1}]"}
{"id": 2, "query": "order these", "labels": [{"id": 7, "relevance": 2}], "subset": "other"}
`)
	ds, err := toolret.LoadToolRet(qs, corpus)
	if err != nil {
		t.Fatal(err)
	}
	if len(ds.Tools) != 2 || ds.IDs[ds.Tools[0].Name] != "gorilla/torch.reshape" || !strings.Contains(ds.Tools[0].Description, "Reshape a tensor") {
		t.Fatalf("tools %+v ids %v", ds.Tools, ds.IDs)
	}
	if ds.Queries[0].Subset != "gorilla-pytorch" || ds.Queries[1].Subset != "other" || ds.Queries[1].Gold["7"] != 2 {
		t.Fatalf("queries %+v", ds.Queries)
	}
	for _, bad := range []struct{ q, c, want string }{
		{qs, write("c1.jsonl", `{"id": "a", "documentation": ""}`), `tool "a" has no documentation`},
		{qs, write("c2.jsonl", "{\"id\": \"a\", \"description\": \"x\"}\nnot json\n"), "c2.jsonl:2: not a JSON object"},
		{qs, write("c3.jsonl", `{"id": "a", "description": "x"}`+"\n"+`{"id": "a", "description": "y"}`), `tool id "a" appears twice`},
		{write("q1.jsonl", `{"id": "x", "query": "y", "labels": []}`), corpus, "labels is not a non-empty list"},
		{write("q2.jsonl", `{"id": "x", "query": "y", "labels": [{"id": "nope"}]}`), corpus, `labelled tool "nope" is not in the corpus`},
		{write("q3.jsonl", `{"id": "x", "labels": [{"id": 7}]}`), corpus, "needs an id and a query"},
	} {
		if _, err := toolret.LoadToolRet(bad.q, bad.c); err == nil || !strings.Contains(err.Error(), bad.want) {
			t.Errorf("error %v, want %q", err, bad.want)
		}
	}
	stb := write("G1_instruction.json", `[{"query":"Forecast for Paris?","query_id":88,"api_list":[
	 {"category_name":"Weather","tool_name":"Weather API","api_name":"Get Forecast","api_description":"5-day forecast"},
	 {"category_name":"Weather","tool_name":"Weather API","api_name":"Get Alerts","api_description":"alerts"}],
	 "relevant APIs":[["Weather API","Get Forecast"]]}]`)
	sd, err := toolret.LoadStableToolBench(stb)
	if err != nil {
		t.Fatal(err)
	}
	if len(sd.Tools) != 2 || sd.Queries[0].Subset != "G1_instruction" || sd.Queries[0].Gold["get_forecast_for_weather_api"] != 1 {
		t.Fatalf("stablebench %+v", sd)
	}
}

func TestConfigNamesBadKeys(t *testing.T) {
	c := DefaultConfig()
	c.K, c.Crossover, c.MemoryPenalty, c.ScatterTemp = 0, 1.5, "both", 3
	c.V2.Population, c.V2.Beta, c.V2.Crowding = 1, -0.3, 2
	err := c.Validate()
	for _, want := range []string{"k: ", "crossover: ", `memory_penalty: "both"`, "scatter_temperature: ", "memetic_v2.population: ", "memetic_v2.beta: ", "memetic_v2.crowding: "} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("error %v does not name %q", err, want)
		}
	}
}

// Memetic V2's parts on hand-worked cases: the annealed temperatures
// (Eq. 16), the judge's score, crowding (Eq. 18), the decaying memory
// term (Eq. 17), guided mutation's low tools, and tournament selection
// (Eq. 19), which must end even when every member ties.
func TestMemeticV2Parts(t *testing.T) {
	for g, want := range []float64{1.6, 1.45, 1.3, 1.15, 1.1, 1.1} {
		if got := annealed(1.5, g); math.Abs(got-want) > 1e-12 {
			t.Fatalf("T_%d = %v, want %v", g, got, want)
		}
	}
	if annealed(2, 0) != 2 {
		t.Fatal("a temperature above 2")
	}
	for reply, want := range map[string]float64{"0.7": 0.7, "Score: 1.0 (perfect)": 1, ".5": 0.5, "I'd give it 7": 1, "-0.2": 0, "none": 0} {
		if got := JudgeScore(reply); got != want {
			t.Errorf("JudgeScore(%q) = %v, want %v", reply, got, want)
		}
	}
	// a and b are 0.8 apart in angle's cosine (0.8 ≤ 0.85: not crowded);
	// a and c are the same direction.
	vecs := [][]float32{{1, 0}, {0.8, 0.6}, {2, 0}, {0, 1}}
	if got := Crowding(vecs, 0.85); fmt.Sprint(got) != fmt.Sprint([]float64{1.0 / 3, 0, 1.0 / 3, 0}) {
		t.Fatalf("crowding %v", got)
	}
	if got := Crowding(vecs[:1], 0.85); got[0] != 0 {
		t.Fatal("a population of one is crowded")
	}
	// {a,b,x} against {a,b,c} at generation 0: 0.5 × 0.5 = 0.25; against
	// {a,b,x} itself at generation 3: 0.5 × 1 × e^-1 = 0.184.
	m := Probes{{Gen: 0, Tools: []string{"a", "b", "c"}}, {Gen: 3, Tools: []string{"a", "b", "x"}}}
	if got := m.Decayed("tools", "", []string{"a", "b", "x"}); math.Abs(got-0.25) > 1e-12 {
		t.Fatalf("decayed penalty %v", got)
	}
	if got := m[1:].Decayed("tools", "", []string{"a", "b", "x"}); math.Abs(got-0.5*math.Exp(-1)) > 1e-12 {
		t.Fatalf("decayed penalty %v", got)
	}
	h := func(n string, s float64) agent.Hit { return agent.Hit{Name: n, Score: s} }
	if got := lowTools([]agent.Hit{h("a", 0.9), h("b", 0.85), h("c", 0.5), h("d", 0.4)}, 2, 0.1); fmt.Sprint(got) != fmt.Sprint([]agent.Hit{h("d", 0.4), h("c", 0.5)}) {
		t.Fatalf("low tools %v", got)
	}
	if got := lowTools([]agent.Hit{h("a", 0.9), h("b", 0.85)}, 2, 0.1); got != nil {
		t.Fatalf("low tools within the gap %v", got)
	}
	x := &run{rand: rand.New(rand.NewPCG(1, 2))}
	fit := []float64{0.1, 0.9, 0.5, 0.3, 0.7, 0.2, 0.8, 0.4}
	for range 20 {
		sel := x.tournament(fit, 4, 3)
		seen := map[int]bool{}
		for _, i := range sel {
			// A tournament of three distinct members never crowns one of
			// the two least fit (0 and 5).
			if seen[i] || i == 0 || i == 5 {
				t.Fatalf("selected %v", sel)
			}
			seen[i] = true
		}
		if len(sel) != 4 {
			t.Fatalf("selected %v", sel)
		}
	}
	if sel := x.tournament(make([]float64, 8), 4, 3); len(sel) != 4 {
		t.Fatalf("all tied: selected %v", sel)
	}
	// Tournaments as large as the population always crown the fittest:
	// the next fittest fills in.
	if sel := x.tournament([]float64{0.2, 0.9, 0.5}, 2, 3); fmt.Sprint(sel) != "[1 2]" {
		t.Fatalf("whole-population tournaments selected %v", sel)
	}
}

// AvgRank recomputes the paper's Table 1 column "Avg. Rank" from its
// printed values (9 rows, 4 domains × N/P/R/C): 8.81, 6.41, 3.91, 4.25,
// 2.78, 5.62, 3.44, 3.94, 5.84, which needs ties to share their mean rank.
func TestAvgRankReproducesTable1(t *testing.T) {
	table := [][16]float64{
		{27.93, 8.95, 33.33, 30.53, 30.59, 13.22, 34.18, 23.32, 29.92, 10.52, 35.63, 26.81, 22.88, 11.78, 27.27, 8.72},
		{31.49, 9.79, 37.89, 34.48, 34.88, 15.48, 37.05, 24.44, 32.33, 11.94, 38.88, 29.52, 24.25, 13.07, 29.99, 11.55},
		{34.96, 10.81, 41.22, 37.39, 34.58, 15.58, 37.13, 24.34, 33.79, 12.53, 39.72, 30.12, 30.98, 15.27, 34.49, 15.55},
		{35.43, 10.82, 41.77, 38.19, 35.25, 15.68, 38.40, 25.56, 32.54, 12.03, 38.54, 28.72, 27.41, 14.20, 32.38, 12.73},
		{35.18, 11.04, 40.76, 36.99, 35.75, 16.31, 37.95, 24.34, 33.84, 12.51, 39.33, 29.94, 32.05, 15.71, 35.48, 17.09},
		{31.48, 9.86, 37.92, 34.59, 35.10, 15.58, 37.81, 24.85, 31.98, 12.14, 38.82, 29.16, 25.08, 13.47, 30.66, 11.55},
		{37.64, 11.30, 43.33, 39.34, 34.17, 15.58, 36.34, 23.12, 32.64, 12.36, 38.63, 29.18, 34.43, 16.96, 37.83, 18.18},
		{37.17, 11.23, 44.15, 40.25, 34.72, 15.54, 37.38, 24.64, 32.61, 12.12, 38.66, 29.37, 29.43, 33.04, 14.64, 14.91},
		{34.96, 10.98, 41.14, 37.11, 33.03, 15.58, 36.05, 23.12, 31.49, 11.78, 37.43, 28.64, 31.51, 15.53, 35.12, 16.45},
	}
	var rows []Row
	for i, r := range table {
		for d, sub := range []string{"code", "customized", "web", "toolbench"} {
			v := r[4*d : 4*d+4]
			rows = append(rows, Row{Strategy: fmt.Sprint("row", i), Subset: sub,
				Metrics: toolret.Metrics{NDCG: v[0], Precision: v[1], Recall: v[2], Comprehensiveness: v[3]}})
		}
		rows = append(rows, Row{Strategy: fmt.Sprint("row", i), Subset: "all"}) // left out: there are subsets
	}
	_, ranks := AvgRank(rows)
	want := []float64{8.81, 6.41, 3.91, 4.25, 2.78, 5.62, 3.44, 3.94, 5.84}
	for i, r := range ranks {
		if math.Abs(r-want[i]) > 0.005 {
			t.Errorf("row %d: avg rank %.4f, the paper's %.2f", i, r, want[i])
		}
	}
}
