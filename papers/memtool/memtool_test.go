package memtool

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/agemem/agemem/agent"
	"github.com/agemem/agemem/bench/stabletoolbench"
	"github.com/agemem/agemem/embed"
	"github.com/agemem/agemem/kernels"
	"github.com/agemem/agemem/kernels/cpu"
	"github.com/agemem/agemem/llm"
	"github.com/agemem/agemem/model/chat"
)

type modelFunc func(msgs []chat.Message, specs []chat.Function) (llm.Response, error)

func (f modelFunc) Chat(_ context.Context, req llm.Request) (llm.Response, error) {
	return f(req.Messages, req.Tools)
}

func callReply(name string, args any) llm.Response {
	b, _ := json.Marshal(args)
	return llm.Response{Message: chat.Message{ToolCalls: []chat.ToolCall{{Name: name, Arguments: string(b)}}}}
}

func answer(s string) llm.Response { return llm.Response{Message: chat.Message{Content: s}} }

func specNames(specs []chat.Function) []string {
	var out []string
	for _, s := range specs {
		out = append(out, s.Name)
	}
	return out
}

// bench writes a generated benchmark to files and loads it back as a user
// would, with the hashing embedder.
func bench(t *testing.T, companies, queries int) (*agent.Catalog, []stabletoolbench.Query) {
	t.Helper()
	sb, err := stabletoolbench.Synth(7, companies, 5, queries)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	tp, qp := filepath.Join(dir, "tools.json"), filepath.Join(dir, "queries.json")
	os.WriteFile(tp, sb.Collection, 0o644)
	os.WriteFile(qp, sb.Queries, 0o644)
	tools, err := stabletoolbench.LoadCollection(tp)
	if err != nil {
		t.Fatal(err)
	}
	qs, err := stabletoolbench.LoadQueries(qp)
	if err != nil {
		t.Fatal(err)
	}
	kb, err := agent.NewCatalog(context.Background(), embed.NewHashing(384, []int{3, 4}), tools)
	if err != nil {
		t.Fatal(err)
	}
	for _, q := range qs {
		for _, g := range q.Gold {
			if _, ok := kb.Get(g); !ok {
				t.Fatalf("gold tool %q of query %s is not in the collection", g, q.ID)
			}
		}
	}
	return kb, qs
}

func oracleFor(kb *agent.Catalog, qs []stabletoolbench.Query) Oracle {
	o := Oracle{Gold: map[string][]string{}, KB: kb}
	for _, q := range qs {
		o.Gold[q.Text] = q.Gold
	}
	return o
}

func cfg(mode string) Config {
	c := DefaultConfig()
	c.Mode, c.Date = mode, "2025-06-30"
	return c
}

// With a perfect agent every mode answers every query with the right
// tools, and keeps the working set to what the current query needs.
func TestModesWithOracle(t *testing.T) {
	kb, qs := bench(t, 60, 30)
	for _, mode := range []string{Autonomous, Workflow, Hybrid} {
		c := cfg(mode)
		c.Bench.Turns = 30
		rep, err := Bench(context.Background(), BenchOptions{Config: c, Modes: []string{mode}, Agent: oracleFor(kb, qs), Judge: ContainsJudge{}, KB: kb, Queries: qs})
		if err != nil {
			t.Fatal(err)
		}
		m := rep.Modes[0].Metrics
		t.Logf("%s: %+v", mode, m)
		if m.ToolCorrectness != 1 || m.TaskCompletion != 1 || m.Answered != 1 {
			t.Fatalf("%s: tool correctness %.3f, task completion %.3f, answered %.2f; the oracle gets all", mode, m.ToolCorrectness, m.TaskCompletion, m.Answered)
		}
		// Searches add TopK tools per keyword; the next turn removes what
		// it does not need, so nothing builds up.
		if m.MaxCount > 4*c.TopK+4 || m.AvgRemovalRatio3T < 0.7 {
			t.Fatalf("%s: max count %d, avg removal ratio %.3f: tools build up", mode, m.MaxCount, m.AvgRemovalRatio3T)
		}
		if rep.Retrieval.K != 5 || rep.Retrieval.Recall <= 0 || rep.Retrieval.Recall > 1 {
			t.Fatalf("retrieval recall@5 %.3f", rep.Retrieval.Recall)
		}
	}
}

// Autonomous mode: the meta-tools are always offered and can never be
// removed; a search past L is refused with the paper's message and adds
// nothing; the system prompt carries the current tool count.
func TestAutonomousLimitAndMetaTools(t *testing.T) {
	kb, _ := bench(t, 20, 5)
	c := cfg(Autonomous)
	c.Limit, c.TopK = 8, 5 // room for 6 domain tools
	var prompts []string
	var lastSpecs []string
	step := 0
	m := modelFunc(func(msgs []chat.Message, specs []chat.Function) (llm.Response, error) {
		prompts = append(prompts, msgs[0].Content)
		lastSpecs = specNames(specs)
		step++
		switch step {
		case 1:
			return callReply(SearchTools, map[string][]string{"keywords": {"revenue"}}), nil
		case 2:
			return callReply(SearchTools, map[string][]string{"keywords": {"stock price"}}), nil
		case 3:
			return callReply(RemoveTools, map[string][]string{"tool_names": {SearchTools, RemoveTools, "no_such_tool"}}), nil
		}
		return answer("done"), nil
	})
	s := &Conversation{Config: c, Agent: m, KB: kb, Exec: stabletoolbench.Simulate}
	res, err := s.Turn(context.Background(), "What is the revenue of a company?")
	if err != nil {
		t.Fatal(err)
	}
	results := res.Trace.Steps
	if got := results[0].Results[0].Result; !strings.HasPrefix(got, "5 tools added: ") {
		t.Fatalf("first search: %q", got)
	}
	if got := results[1].Results[0]; got.OK || !strings.Contains(got.Result, "Hit L limit, remove tools.") {
		t.Fatalf("a search past L: %+v", got)
	}
	if got := results[2].Results[0].Result; !strings.HasPrefix(got, "0 tools removed") {
		t.Fatalf("removing the meta-tools: %q", got)
	}
	if !slices.Contains(lastSpecs, SearchTools) || !slices.Contains(lastSpecs, RemoveTools) || len(lastSpecs) != 7 {
		t.Fatalf("the agent's last tools %v: want both meta-tools and the 5 found", lastSpecs)
	}
	if res.Count != 5 || len(res.Added) != 5 || res.LimitHits != 1 || res.Peak != 5 {
		t.Fatalf("count %d, added %d, limit hits %d, peak %d", res.Count, len(res.Added), res.LimitHits, res.Peak)
	}
	if !strings.Contains(prompts[0], "Tool count: 2") || !strings.Contains(prompts[0], "The current date is 2025-06-30") ||
		!strings.Contains(prompts[0], "more than 8 tools") {
		t.Fatalf("system prompt not rendered:\n%s", prompts[0])
	}
	// The next query's prompt counts the tools loaded.
	step = 10
	if _, err := s.Turn(context.Background(), "next"); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(prompts[len(prompts)-1], "Tool count: 7") {
		t.Fatal("the prompt is not re-rendered with the new tool count")
	}
}

// Workflow mode: a prune that removes nothing while the search went past L
// cuts the newest additions; the agent gets no meta-tools. Hybrid: the
// agent can search but not remove.
func TestWorkflowAndHybridControlFlow(t *testing.T) {
	kb, _ := bench(t, 20, 5)
	c := cfg(Workflow)
	c.Limit, c.TopK = 7, 5
	prunes := 0
	ctrl := modelFunc(func(msgs []chat.Message, specs []chat.Function) (llm.Response, error) {
		switch specs[0].Name {
		case "remove_tools":
			prunes++
			return answer("[]"), nil // as content: a model without tool calls
		case "search_tools":
			return answer("```json\n{\"keywords\": [\"revenue\", \"net income\"]}\n```"), nil
		}
		return llm.Response{}, nil
	})
	var agentSpecs []string
	ag := modelFunc(func(msgs []chat.Message, specs []chat.Function) (llm.Response, error) {
		agentSpecs = specNames(specs)
		return answer("ok"), nil
	})
	s := &Conversation{Config: c, Agent: ag, Controller: ctrl, KB: kb, Exec: stabletoolbench.Simulate}
	res, err := s.Turn(context.Background(), "q1")
	if err != nil {
		t.Fatal(err)
	}
	if res.Count != 7 || len(res.Added) != 7 || res.LimitHits != 1 || prunes != 1 || res.Peak != 10 {
		t.Fatalf("count %d added %d limit hits %d prunes %d peak %d: want the 10 found cut to L=7 after one empty prune",
			res.Count, len(res.Added), res.LimitHits, prunes, res.Peak)
	}
	if slices.ContainsFunc(agentSpecs, func(n string) bool { return strings.HasPrefix(n, "SYS_") }) || len(agentSpecs) != 7 {
		t.Fatalf("workflow agent's tools %v", agentSpecs)
	}

	// Hybrid: the prune runs first and sees the loaded tools verbatim.
	s.Config.Mode = Hybrid
	var pruneSaw string
	ctrl2 := modelFunc(func(msgs []chat.Message, specs []chat.Function) (llm.Response, error) {
		pruneSaw = msgs[1].Content
		return callReply("remove_tools", map[string][]string{"tool_names": s.Set()[:3]}), nil
	})
	s.Controller = ctrl2
	res, err = s.Turn(context.Background(), "q2")
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Removed) != 3 || res.Count != 4 || !strings.Contains(pruneSaw, "User Query: `q2`") {
		t.Fatalf("hybrid prune: removed %v, count %d, prompt %q", res.Removed, res.Count, pruneSaw)
	}
	if !slices.Contains(agentSpecs, SearchTools) || slices.Contains(agentSpecs, RemoveTools) {
		t.Fatalf("hybrid agent's tools %v: search, never remove", agentSpecs)
	}
}

// H truncates the dialogue to the last HistoryTurns user turns, or
// summarises what it drops; the tools stay.
func TestHistory(t *testing.T) {
	kb, _ := bench(t, 5, 2)
	for _, mode := range []string{"truncate", "summarize", "none"} {
		c := cfg(Autonomous)
		c.History, c.HistoryTurns = mode, 2
		if mode == "none" {
			c.History, c.HistoryTurns, c.Prompt = "truncate", 0, "compact"
		}
		var seen []chat.Message
		summaries := 0
		m := modelFunc(func(msgs []chat.Message, specs []chat.Function) (llm.Response, error) {
			if specs == nil {
				summaries++
				return answer("S"), nil
			}
			seen = msgs
			return answer("a"), nil
		})
		s := &Conversation{Config: c, Agent: m, KB: kb, Exec: stabletoolbench.Simulate}
		s.set = kb.Tools()[:3]
		for _, q := range []string{"q1", "q2", "q3", "q4"} {
			if _, err := s.Turn(context.Background(), q); err != nil {
				t.Fatal(err)
			}
		}
		var users []string
		for _, m := range seen {
			if m.Role == "user" {
				users = append(users, m.Content)
			}
		}
		want := []string{"q2", "q3", "q4"}
		if mode == "none" {
			// No earlier turn: the compact prompt and the working set alone.
			want = []string{"q4"}
			if len(seen) != 2 || !strings.HasSuffix(seen[0].Content, "Tool count: 5") || !strings.Contains(seen[0].Content, "at most 128 of them") {
				t.Fatalf("history_turns 0: the agent saw %d messages, system %q", len(seen), seen[0].Content)
			}
		}
		if !slices.Equal(users, want) || len(s.set) != 3 {
			t.Fatalf("%s: the agent saw user turns %v, %d tools", mode, users, len(s.set))
		}
		if mode == "summarize" && (summaries != 1 || !strings.Contains(seen[0].Content, "Summary of the earlier conversation:\nS")) {
			t.Fatalf("summaries %d, system %q", summaries, seen[0].Content)
		}
	}
}

// The metrics on a hand-worked session.
func TestMetricsHandWorked(t *testing.T) {
	turn := func(add, rem, count int, called ...string) TurnResult {
		return TurnResult{Added: make([]string, add), Removed: make([]string, rem), Count: count, Called: called, HasAnswer: true}
	}
	// counts: 5, 8, 3, 3, 10, 2
	turns := []TurnResult{turn(5, 0, 5, "a"), turn(5, 2, 8, "b"), turn(0, 5, 3), turn(0, 0, 3), turn(7, 0, 10, "c", "d"), turn(0, 8, 2)}
	gold := [][]string{{"a"}, {"b", "x"}, {}, {"y"}, {"c", "d"}, nil}
	m := Measure(turns, gold, []float64{1, 0.5, 1, 0, 1, 1})
	// Eq. 1: (0+2+5+0+0+8) / (5+5+0+0+7+0) = 15/17.
	// Eq. 2: windows 1-3 (7/10), 2-4 (7/5 -> 1), 3-5 (5/7), 4-6 (8/7 -> 1).
	// Eq. 3: peaks at turns 2 (8) and 5 (10); after them 3,3,10 and 2.
	// Eq. 5: turns 1 (1), 2 (1/2), 4 (0), 5 (1); turn 3 expects nothing.
	want := Metrics{RemovalRatio: 15.0 / 17, AvgRemovalRatio3T: (0.7 + 1 + 5.0/7 + 1) / 4, AvgResidual3T: (16.0/3 + 2) / 2,
		ToolCorrectness: 2.5 / 4, TaskCompletion: 4.5 / 6, MaxCount: 10, Answered: 1, Turns: 6}
	for _, c := range []struct {
		name      string
		got, want float64
	}{{"removal ratio", m.RemovalRatio, want.RemovalRatio}, {"avg removal ratio", m.AvgRemovalRatio3T, want.AvgRemovalRatio3T},
		{"avg residual", m.AvgResidual3T, want.AvgResidual3T}, {"tool correctness", m.ToolCorrectness, want.ToolCorrectness},
		{"task completion", m.TaskCompletion, want.TaskCompletion}} {
		if math.Abs(c.got-c.want) > 1e-12 {
			t.Errorf("%s = %v, want %v", c.name, c.got, c.want)
		}
	}
	if m.MaxCount != 10 {
		t.Errorf("max count %d", m.MaxCount)
	}
	// Nothing ever added: no window, no peak.
	if m := Measure([]TurnResult{turn(0, 0, 0), turn(0, 0, 0), turn(0, 0, 0)}, nil, nil); !math.IsNaN(m.AvgRemovalRatio3T) || !math.IsNaN(m.AvgResidual3T) || m.RemovalRatio != 0 {
		t.Fatalf("empty session: %+v", m)
	}
}

func TestLoadersAndNames(t *testing.T) {
	dir := t.TempDir()
	write := func(name, body string) string {
		p := filepath.Join(dir, name)
		os.WriteFile(p, []byte(body), 0o644)
		return p
	}
	for _, c := range []struct{ tool, api, want string }{
		{"Weather API", "Get Forecast", "get_forecast_for_weather_api"},
		{"2Crypto", "id", "is_id_for_get_2crypto"},
		{"x", "1st call!", "get_1st_call_for_x"},
		{"Tool", strings.Repeat("a", 70), strings.Repeat("a", 55) + "_for_tool"},
	} {
		if got := stabletoolbench.ToolBenchName(c.tool, c.api); got != c.want {
			t.Errorf("stabletoolbench.ToolBenchName(%q, %q) = %q, want %q", c.tool, c.api, got, c.want)
		}
	}
	// Both layouts of "tools"; a name two servers share is qualified.
	p := write("col.json", `[{"name":"fs","description":"files","category":"dev","tools":{"fs":{"tools":[{"name":"read","description":"Read a file","inputSchema":{"type":"object","properties":{"path":{"type":"string"}}}}]}}},
	 {"name":"web","tools":[{"name":"read","description":"Read a page"},{"name":"search it","description":""}]}]`)
	tools, err := stabletoolbench.LoadCollection(p)
	if err != nil {
		t.Fatal(err)
	}
	if got := names(tools); !slices.Equal(got, []string{"fs__read", "web__read", "search_it"}) || tools[2].Description != "" || tools[0].Category != "dev" {
		t.Fatalf("tools %v", got)
	}
	for _, bad := range []struct{ body, want string }{
		{`{"name": 1}`, "not a JSON list of MCP servers"},
		{"[\n{\"name\":\"a\",\n\"tools\": [}]", "line 3"},
		{`[{"name":"a","tools":[{"description":"x"}]}]`, `server 0 ("a"): tool 0 has no name`},
		{`[{"name":"a","tools":[{"name":"t","inputSchema":[1]}]}]`, `tool "t": inputSchema: not a JSON object`},
		{`[]`, "no tools"},
	} {
		if _, err := stabletoolbench.LoadCollection(write("bad.json", bad.body)); err == nil || !strings.Contains(err.Error(), bad.want) || !strings.Contains(err.Error(), "bad.json") {
			t.Errorf("%s: error %v, want one naming the file and %q", bad.body, err, bad.want)
		}
	}
	q := write("q.json", `[{"query":"Forecast for Paris?","query_id":88,"api_list":[
	 {"category_name":"Weather","tool_name":"Weather API","api_name":"Get Forecast","api_description":"5-day forecast","required_parameters":[{"name":"city","type":"STRING","description":"City","default":"Paris"}],"optional_parameters":[{"name":"days","type":"NUMBER","description":"","default":5}],"method":"GET"},
	 {"category_name":"Weather","tool_name":"Weather API","api_name":"Get Alerts","api_description":"","required_parameters":[],"optional_parameters":[],"method":"GET"}],
	 "relevant APIs":[["Weather API","Get Forecast"]]}]`)
	qs, err := stabletoolbench.LoadQueries(q)
	if err != nil {
		t.Fatal(err)
	}
	if qs[0].ID != "88" || !slices.Equal(qs[0].Gold, []string{"get_forecast_for_weather_api"}) || len(stabletoolbench.QueryTools(qs)) != 2 {
		t.Fatalf("query %+v", qs[0])
	}
	var schema struct {
		Properties map[string]struct{ Type string }
		Required   []string
	}
	json.Unmarshal(qs[0].Tools[0].Parameters, &schema)
	if schema.Properties["days"].Type != "number" || !slices.Equal(schema.Required, []string{"city"}) {
		t.Fatalf("schema %s", qs[0].Tools[0].Parameters)
	}
	for _, bad := range []struct{ body, want string }{
		{`[{"query":"","api_list":[]}]`, "query 0 (query_id 0): no query text"},
		{`[{"query":"x","query_id":"a7","api_list":[]}]`, "query_id a7): empty api_list"},
		{`[{"query":"x","api_list":[{"tool_name":"T","api_name":"A"}],"relevant APIs":[["T","B"]]}]`, `relevant API "B" of "T" is not in api_list`},
		{`[{"query":"x","api_list":[{"tool_name":"T"}]}]`, "api_list[0] needs tool_name and api_name"},
	} {
		if _, err := stabletoolbench.LoadQueries(write("badq.json", bad.body)); err == nil || !strings.Contains(err.Error(), bad.want) {
			t.Errorf("%s: error %v, want %q", bad.body, err, bad.want)
		}
	}
}

func TestConfigNamesBadKeys(t *testing.T) {
	c := DefaultConfig()
	c.Mode, c.Limit, c.History, c.Date, c.Prompt, c.HistoryTurns, c.Eval.Sessions = "auto", 2, "forget", "30/06/2025", "short", -1, 0
	err := c.Validate()
	for _, want := range []string{"mode: \"auto\"", "limit: ", "history: \"forget\"", "date: ", "prompt: \"short\"", "history_turns: -1", "eval.sessions: 0"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("error %v does not name %q", err, want)
		}
	}
}

// A knowledge base large enough for a device searches there (the CPU
// backend selects as a GPU does) with the same results; a small one never
// opens the device.
func TestKBOnDevice(t *testing.T) {
	ctx := context.Background()
	emb := embed.NewHashing(512, []int{3})
	var tools []agent.CatalogTool
	for i := range embed.DeviceMinFloats/512 + 10 {
		tools = append(tools, agent.CatalogTool{Function: chat.Function{Name: fmt.Sprintf("tool_%d", i), Description: fmt.Sprintf("returns figure %d of company %d", i%97, i)}})
	}
	dev, err := agent.NewCatalog(ctx, emb, tools)
	if err != nil {
		t.Fatal(err)
	}
	host, _ := agent.NewCatalog(ctx, emb, tools)
	opened := 0
	dev.UseDevice(func() kernels.TopKer { opened++; return cpu.New() })
	queries := []string{"figure 12 of company 400", "company 2000", "returns figure 3"}
	a, err := dev.Rank(ctx, queries, 5)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := host.Rank(ctx, queries, 5)
	if opened != 1 {
		t.Fatalf("device opened %d times", opened)
	}
	for i := range a {
		for j := range a[i] {
			if a[i][j].Name != b[i][j].Name || math.Abs(a[i][j].Score-b[i][j].Score) > 1e-5 {
				t.Fatalf("query %d: device %v, host %v", i, a[i], b[i])
			}
		}
	}
	small, _ := agent.NewCatalog(ctx, emb, tools[:10])
	small.UseDevice(func() kernels.TopKer { opened++; return cpu.New() })
	if opened != 1 {
		t.Fatal("a small knowledge base opened the device")
	}
}
