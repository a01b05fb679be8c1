package openai_test

import (
	"context"
	"math"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"

	"github.com/agemem/agemem/embed"
	"github.com/agemem/agemem/llm"
	"github.com/agemem/agemem/llm/openai"
	"github.com/agemem/agemem/memtools"
	"github.com/agemem/agemem/memtools/ltm"
	"github.com/agemem/agemem/memtools/stm"
	"github.com/agemem/agemem/model/chat"
	"github.com/agemem/agemem/serve"
)

// storing is a serve backend whose policy stores what the user says and
// then answers "Stored: <it>": the agent loop runs for real (a tool call,
// its result, the answer) without a model.
type storing struct{ storingPolicy }

func (storing) Count(text string) int { return stm.Words{}.Count(text) }
func (storing) ContextLength() int    { return 0 }
func (storing) Close()                {}

type storingPolicy struct{}

func (storingPolicy) Chat(_ context.Context, req llm.Request) (llm.Response, error) {
	{
		last := req.Messages[len(req.Messages)-1]
		if last.Role == stm.Tool {
			var user string
			for _, m := range req.Messages {
				if m.Role == stm.User {
					user = m.Content
				}
			}
			return llm.Reply("<think>done</think><answer>Stored: " + user + "</answer>"), nil
		}
		return llm.Reply(`<think>keep</think><tool_call>[{"name":"Add_memory","arguments":{"content":` + quote(last.Content) + `}}]</tool_call>`), nil
	}
}

func quote(s string) string { return `"` + strings.ReplaceAll(s, `"`, `\"`) + `"` }

// TestAgainstOurServe: the client speaks to our own serve, plain and
// streamed, with a key; serve's agent stores the message (the memory is
// there afterwards) and the answer comes back as the content.
func TestAgainstOurServe(t *testing.T) {
	db, err := ltm.OpenSQLite(filepath.Join(t.TempDir(), "m.db"), ltm.SQLiteOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	sc := serve.DefaultConfig()
	sc.Keys, sc.KeysEnv = []serve.APIKey{{Key: "sk-alice", Namespace: "alice"}}, ""
	agent := memtools.DefaultAgent()
	agent.SystemPrompt = "compact"
	srv, err := serve.New(serve.Options{Config: sc, Agent: agent, Tools: memtools.DefaultOptions(), Namespace: "default",
		Backend: storing{}, Store: db, Embedder: embed.NewHashing(64, []int{3})})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	ts := httptest.NewServer(srv.Handler())
	defer ts.Close()
	c := openai.DefaultConfig()
	c.BaseURL = ts.URL + "/v1"
	t.Setenv("AGEMEM_TEST_KEY", "sk-alice")
	c.APIKeyEnv = "AGEMEM_TEST_KEY"
	cl, err := c.Connect()
	if err != nil {
		t.Fatal(err)
	}
	for _, stream := range []bool{false, true} {
		g := c.ChatModel(cl, "agemem", 32)
		var last string
		say := map[bool]string{false: "Ivo is a judge.", true: "Ada is a pilot."}[stream]
		req := llm.Request{Messages: []chat.Message{{Role: stm.User, Content: say}}}
		if stream {
			req.OnText = func(sofar func() string) { last = sofar() }
		}
		out, err := g.Chat(context.Background(), req)
		if err != nil {
			t.Fatal(err)
		}
		if out.Message.Content != "Stored: "+say || (stream && last != out.Message.Content) {
			t.Fatalf("stream %v: %q (streamed %q)", stream, out.Message.Content, last)
		}
	}
	ns, _ := db.Namespace("alice")
	if n, _ := ns.Count(context.Background()); n != 2 {
		t.Fatalf("alice's namespace holds %d memories, want the 2 the agent stored", n)
	}
	// Embeddings from serve's embedder through /v1/embeddings.
	e, err := openai.NewEmbedder(context.Background(), cl, "agemem")
	if err != nil {
		t.Fatal(err)
	}
	got, err := e.Embed(context.Background(), []string{"Ivo is a judge."})
	want, _ := embed.NewHashing(64, []int{3}).Embed(context.Background(), []string{"Ivo is a judge."})
	if err != nil || e.Dim() != 64 {
		t.Fatalf("%v, %d dimensions", err, e.Dim())
	}
	for i := range want[0] {
		if math.Abs(float64(got[0][i]-want[0][i])) > 1e-6 {
			t.Fatalf("component %d: %g through serve, %g from the embedder", i, got[0][i], want[0][i])
		}
	}
	// A wrong key: 401, not retried, and the error says what to check.
	t.Setenv("AGEMEM_TEST_KEY", "sk-mallory")
	cl, _ = c.Connect()
	if _, err := c.ChatModel(cl, "agemem", 8).Chat(context.Background(), llm.Request{Messages: []chat.Message{{Role: stm.User, Content: "hi"}}}); err == nil || !strings.Contains(err.Error(), "status 401") || !strings.Contains(err.Error(), "API key") {
		t.Fatalf("wrong key: %v", err)
	}
}
