package memtool

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/agemem/agemem/agent"
	"github.com/agemem/agemem/bench/stabletoolbench"
	"github.com/agemem/agemem/embed"
	"github.com/agemem/agemem/llm"
	"github.com/agemem/agemem/model/chat"
)

// prompts records the text a native policy would be prompted with at each
// call (its chat template with the tools), and answers as m does.
type prompts struct {
	m    llm.Model
	mu   sync.Mutex
	text []string
}

func (p *prompts) Chat(ctx context.Context, req llm.Request) (llm.Response, error) {
	defs, err := chat.Definitions(req.Tools)
	if err != nil {
		return llm.Response{}, err
	}
	s, err := chat.Render(req.Messages, chat.Options{Template: chat.Qwen25, Tools: defs, AddGenerationPrompt: true})
	if err != nil {
		return llm.Response{}, err
	}
	p.mu.Lock()
	p.text = append(p.text, s)
	p.mu.Unlock()
	return p.m.Chat(ctx, req)
}

// A policy behind serve's tool gateway reads, call for call, the very
// text it was trained on in a Conversation: the same system message, the
// meta-tools and the working set by name, the same results ("N tools
// added", "Hit L limit, remove tools.", "N tools removed"), so the pruning
// GRPO taught it is what a user of the gateway gets. Played here by the
// pruning oracle and by one that never removes (which hits the limit).
func TestGatewayShowsThePolicyItsTrainingText(t *testing.T) {
	ctx := context.Background()
	kb, qs := bench(t, 30, 8)
	qs = qs[:8]
	var upstream []agent.Tool
	for _, tool := range kb.Tools() {
		upstream = append(upstream, agent.Tool{Function: tool.Function, Server: tool.Server,
			Call: func(ctx context.Context, args json.RawMessage) (string, error) {
				return stabletoolbench.Simulate(ctx, tool, args)
			}})
	}
	c := cfg(Autonomous)
	c.Limit, c.TopK, c.Prompt, c.HistoryTurns = 7, 1, "compact", 1
	for _, skip := range []float64{0, 1} {
		o := oracleFor(kb, qs)
		o.TopK, o.SkipRemoval = c.TopK, skip
		local := &prompts{m: o}
		s := &Conversation{Config: c, Agent: local, KB: kb, Exec: stabletoolbench.Simulate}
		hits := 0
		for _, q := range qs {
			res, err := s.Turn(ctx, q.Text)
			if err != nil {
				t.Fatal(err)
			}
			hits += res.LimitHits
		}
		g, err := NewGateway(ctx, embed.NewHashing(384, []int{3, 4}), upstream, c)
		if err != nil {
			t.Fatal(err)
		}
		hs := httptest.NewServer(mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return g.Server("alice") }, nil))
		defer hs.Close()
		mc, err := agent.ConnectMCP(ctx, agent.MCPServer{Name: "gateway", URL: hs.URL})
		if err != nil {
			t.Fatal(err)
		}
		defer mc.Close()
		remote := &prompts{m: o}
		gs := &GatewaySession{Config: c, Agent: remote, Client: mc}
		for _, q := range qs {
			if _, err := gs.Turn(ctx, q.Text); err != nil {
				t.Fatal(err)
			}
		}
		if len(local.text) != len(remote.text) {
			t.Fatalf("skip %v: %d calls in a Conversation, %d through the gateway", skip, len(local.text), len(remote.text))
		}
		for i := range local.text {
			if local.text[i] != remote.text[i] {
				t.Fatalf("skip %v, call %d: the gateway's prompt differs from the Conversation's\n%s\n---\n%s", skip, i, firstDiff(local.text[i], remote.text[i]), firstDiff(remote.text[i], local.text[i]))
			}
		}
		if last := local.text[len(local.text)-1]; skip == 1 && (hits == 0 || !strings.Contains(strings.Join(local.text, ""), "Hit L limit, remove tools.")) ||
			skip == 0 && (hits != 0 || !strings.Contains(strings.Join(local.text, ""), "tools removed: ")) || !strings.Contains(last, "Tool count: ") {
			t.Fatalf("skip %v: %d limit hits; the sessions did not exercise what they should", skip, hits)
		}
	}
}

func firstDiff(a, b string) string {
	i := 0
	for i < len(a) && i < len(b) && a[i] == b[i] {
		i++
	}
	return a[max(i-200, 0):min(i+200, len(a))]
}
