package main

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/agemem/agemem/agent"
	"github.com/agemem/agemem/bench/stabletoolbench"
	"github.com/agemem/agemem/embed"
	"github.com/agemem/agemem/papers/memtool"
)

// The learning recipe's commands: memtool data writes each call as a
// record that learns only its last reply, its teacher skipping removals
// in the share --skip-removal asks; memtool tokenizer learns a vocabulary
// on them that init-model makes a model of; memtool eval compares agents
// on held-out sessions, with paired differences, a native policy among
// them.
func TestCLIMemtoolLearn(t *testing.T) {
	dir := t.TempDir()
	mustRun(t, "memtool", "synth", "--companies", "30", "--queries", "60", "--seed", "4", "--out", dir)
	set := []string{"--set", "memtool.bench.queries=" + filepath.Join(dir, "queries.json"), "--set", "memtool.bench.tools=" + filepath.Join(dir, "tools.json"),
		"--set", "memtool.train.queries=" + filepath.Join(dir, "queries.json"), "--set", "memtool.limit=6", "--set", "memtool.top_k=1",
		"--set", "memtool.prompt=compact", "--set", "memtool.history_turns=0", "--set", "memtool.train.turns=3", "--set", "memtool.date=2026-01-15",
		"--set", "memtool.eval.sessions=4", "--set", "memtool.eval.turns=5"}
	removals := map[string]int{}
	for _, skip := range []string{"0", "0.6"} {
		data := filepath.Join(dir, "sft-"+skip+".jsonl")
		mustRun(t, append([]string{"memtool", "data", "--chat", "qwen2.5", "--skip-removal", skip, "--out", data}, set...)...)
		for _, line := range strings.Split(strings.TrimSpace(string(mustRead(t, data))), "\n") {
			var rec struct {
				Messages []struct {
					Role, Content string
					Weight        *int
				}
			}
			if err := json.Unmarshal([]byte(line), &rec); err != nil {
				t.Fatal(err)
			}
			for i, m := range rec.Messages {
				if last := i == len(rec.Messages)-1; m.Role == "assistant" && (m.Weight == nil) != last {
					t.Fatalf("message %d of %s: weight %v, want only the last reply learned", i, line, m.Weight)
				}
			}
			if strings.Contains(rec.Messages[len(rec.Messages)-1].Content, `"SYS_REMOVE_TOOLS"`) {
				removals[skip]++
			}
		}
	}
	if removals["0"] == 0 || removals["0.6"] == 0 || float64(removals["0.6"]) > 0.6*float64(removals["0"]) {
		t.Fatalf("removal calls: %d with a perfect teacher, %d skipping 60%% of them", removals["0"], removals["0.6"])
	}
	if _, err := run(t, append([]string{"memtool", "data", "--skip-removal", "1.5", "--out", filepath.Join(dir, "x.jsonl")}, set...)...); err == nil || !strings.Contains(err.Error(), "--skip-removal 1.5") {
		t.Fatalf("--skip-removal 1.5: %v", err)
	}
	tok := filepath.Join(dir, "tok")
	mustRun(t, "memtool", "tokenizer", "--data", filepath.Join(dir, "sft-0.6.jsonl"), "--vocab-size", "600", "--pretokenizer", "qwen", "--out", tok)
	model := filepath.Join(dir, "init")
	mustRun(t, "init-model", "--tokenizer", filepath.Join(tok, "tokenizer.json"), "--dtype", "f32", "--set", "model.init.model_type=qwen2", "--out", model)
	report := filepath.Join(dir, "eval.json")
	got := mustRun(t, append([]string{"memtool", "eval", "--agent", "oracle", "--agent", "never-removing", "--agent", "random=" + model,
		"--diff", "never-removing,oracle", "--diff", "random,oracle", "--out", report, "--set", "agent.response_budget=24"}, set...)...)
	for _, want := range []string{"held-out: 4 sessions of 5 queries", "RR3T", "FormatErr", "\noracle ", "\nnever-removing ", "\nrandom ", "oracle − never-removing", "oracle − random"} {
		if !strings.Contains(got, want) {
			t.Fatalf("no %q in:\n%s", want, got)
		}
	}
	var rep evalReport
	if err := json.Unmarshal(mustRead(t, report), &rep); err != nil {
		t.Fatal(err)
	}
	if len(rep.Agents) != 3 || len(rep.Agents[2].Sessions) != 4 || len(rep.Diffs) != 2 || rep.Agents[0].Summary[2].Mean != 1 || rep.Agents[1].Summary[4].Mean <= 0 {
		t.Fatalf("eval.json: %+v", rep)
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--agent", "oracle", "--diff", "oracle,nobody"}, `--diff "oracle,nobody"`},
		{[]string{"--agent", "gpt"}, `--agent "gpt"`},
		{[]string{"--agent", "oracle", "--agent", "oracle"}, `two agents are labelled "oracle"`},
		{[]string{"--agent", "oracle", "--set", "memtool.eval.sessions=20"}, "20 sessions of 5 turns need 100 queries, there are 60"},
	} {
		if _, err := run(t, append(append([]string{"memtool", "eval"}, set...), c.args...)...); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%v: %v, want %q", c.args, err, c.want)
		}
	}
}

// memtool agent plays a session against serve's tool gateway: the policy
// (here the oracle on an OpenAI-compatible server) searches the gateway,
// calls what it loaded there, removes it when the next query does not
// need it, and the gateway's working set is what it left.
func TestCLIMemtoolAgentOnGateway(t *testing.T) {
	dir := t.TempDir()
	mustRun(t, "memtool", "synth", "--companies", "20", "--queries", "6", "--seed", "5", "--out", dir)
	tools, err := stabletoolbench.LoadCollection(filepath.Join(dir, "tools.json"))
	if err != nil {
		t.Fatal(err)
	}
	var upstream []agent.Tool
	for _, tool := range tools {
		upstream = append(upstream, agent.Tool{Function: tool.Function, Server: tool.Server,
			Call: func(ctx context.Context, args json.RawMessage) (string, error) {
				return stabletoolbench.Simulate(ctx, tool, args)
			}})
	}
	c := memtool.DefaultConfig()
	c.Limit, c.TopK = 6, 1
	emb := embed.NewHashing(384, []int{3, 4})
	g, err := memtool.NewGateway(context.Background(), emb, upstream, c)
	if err != nil {
		t.Fatal(err)
	}
	gw := httptest.NewServer(mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return g.Server("alice") }, nil))
	defer gw.Close()
	kb, err := agent.NewCatalog(context.Background(), emb, tools)
	if err != nil {
		t.Fatal(err)
	}
	srv, _ := oracleServer(t, filepath.Join(dir, "queries.json"), kb)
	qs, err := stabletoolbench.LoadQueries(filepath.Join(dir, "queries.json"))
	if err != nil {
		t.Fatal(err)
	}
	args := []string{"memtool", "agent", "--url", gw.URL, "--set", "openai.base_url=" + srv.URL, "--model", "oracle",
		"--set", "memtool.limit=6", "--set", "memtool.top_k=1", "--set", "memtool.prompt=compact"}
	for _, q := range qs[:3] {
		args = append(args, "--prompt", q.Text)
	}
	got := mustRun(t, args...)
	if strings.Count(got, "answer: ") != 3 || !strings.Contains(got, "SYS_REMOVE_TOOLS") || strings.Contains(got, "refused") {
		t.Fatalf("memtool agent:\n%s", got)
	}
	if set := g.WorkingSet("alice"); !slices.Equal(set, qs[2].Gold) {
		t.Fatalf("the gateway's working set is %v, the last query's tools are %v", set, qs[2].Gold)
	}
	if _, err := run(t, "memtool", "agent", "--url", gw.URL); err == nil || !strings.Contains(err.Error(), "--prompt") {
		t.Fatalf("no prompt: %v", err)
	}
}

// The policy GRPO trained (checkpoints/memtool-rl, make demo-memtool's
// runs/memtool/rl/policy) is what a user gets: memtool bench --policy
// native runs it, and through serve's tool gateway it removes tools it
// loaded, where the policy before GRPO (checkpoints/memtool) never does.
// The questions are its training world's (seed 1), whose names it copies.
func TestCLIMemtoolTrainedPolicyServed(t *testing.T) {
	dir := t.TempDir()
	mustRun(t, "memtool", "synth", "--companies", "100", "--queries", "1200", "--seed", "1", "--out", dir)
	set := []string{"--config", "../../configs/memtool.yaml", "--set", "memtool.bench.tools=" + filepath.Join(dir, "tools.json"),
		"--set", "memtool.bench.queries=" + filepath.Join(dir, "queries.json")}
	rr := map[string]float64{}
	for _, p := range []string{"memtool", "memtool-rl"} {
		out := filepath.Join(dir, "bench-"+p)
		mustRun(t, append([]string{"memtool", "bench", "--policy", "native", "--native", "../../checkpoints/" + p, "--modes", "autonomous",
			"--set", "memtool.bench.turns=8", "--set", "memtool.bench.out=" + out}, set...)...)
		var rep struct {
			Modes []struct {
				Metrics struct {
					RR3T float64 `json:"avg_removal_ratio_3t"`
				} `json:"metrics"`
			} `json:"modes"`
		}
		if err := json.Unmarshal(mustRead(t, filepath.Join(out, "report.json")), &rep); err != nil {
			t.Fatal(err)
		}
		rr[p] = rep.Modes[0].Metrics.RR3T
	}
	if rr["memtool"] != 0 || rr["memtool-rl"] < 0.5 {
		t.Fatalf("memtool bench --policy native: RR3T %.3f before GRPO, %.3f after", rr["memtool"], rr["memtool-rl"])
	}

	tools, err := stabletoolbench.LoadCollection(filepath.Join(dir, "tools.json"))
	if err != nil {
		t.Fatal(err)
	}
	var upstream []agent.Tool
	for _, tool := range tools {
		upstream = append(upstream, agent.Tool{Function: tool.Function, Server: tool.Server,
			Call: func(ctx context.Context, args json.RawMessage) (string, error) {
				return stabletoolbench.Simulate(ctx, tool, args)
			}})
	}
	c := memtool.DefaultConfig()
	c.Limit, c.TopK = 6, 1
	g, err := memtool.NewGateway(context.Background(), embed.NewHashing(384, []int{3, 4}), upstream, c)
	if err != nil {
		t.Fatal(err)
	}
	qs, err := stabletoolbench.LoadQueries(filepath.Join(dir, "queries.json"))
	if err != nil {
		t.Fatal(err)
	}
	removals := map[string]int{}
	for _, p := range []string{"memtool", "memtool-rl"} {
		gw := httptest.NewServer(mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return g.Server(p) }, nil))
		args := append([]string{"memtool", "agent", "--url", gw.URL, "--native", "../../checkpoints/" + p}, set...)
		for _, q := range qs[:6] {
			args = append(args, "--prompt", q.Text)
		}
		got := mustRun(t, args...)
		gw.Close()
		for _, line := range strings.Split(got, "\n") {
			if strings.Contains(line, "] SYS_REMOVE_TOOLS(") && strings.Contains(line, ") -> ok: ") {
				removals[p]++
			}
		}
		t.Logf("%s through the gateway:\n%s", p, got)
	}
	if removals["memtool"] != 0 || removals["memtool-rl"] == 0 {
		t.Fatalf("removals through the gateway: %d before GRPO, %d after", removals["memtool"], removals["memtool-rl"])
	}
}
