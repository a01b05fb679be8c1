package memtool

import (
	"context"
	"encoding/json"
	"slices"
	"time"

	"github.com/agemem/agemem/agent"
	"github.com/agemem/agemem/llm"
	"github.com/agemem/agemem/model/chat"
)

// GatewaySession is an MCP host's side of the Gateway: an agent whose
// tools are the meta-tools and the working set the Gateway keeps (Client,
// connected to it), played turn by turn as a Conversation plays the
// Autonomous mode. The agent reads the same text it would in a
// Conversation (the system message AutonomousPrompt renders with the tools
// it holds, the tools by name, the same results), so a policy trained
// with memtool train prunes the Gateway's working set as it learned to.
// After each search or removal the tools are listed again before the
// agent's next call, not when the server's list_changed notification
// happens to arrive. The dialogue is kept to Config.HistoryTurns user
// turns (truncated).
type GatewaySession struct {
	Config Config
	Agent  llm.Model
	Client *agent.MCPClient
	// Now gives {current_date} when Config.Date is empty.
	Now  func() time.Time
	msgs []chat.Message
}

// Turn plays one user query.
func (g *GatewaySession) Turn(ctx context.Context, query string) (agent.Trace, error) {
	if err := g.Config.Validate(); err != nil {
		return agent.Trace{}, err
	}
	var starts []int
	for i, m := range g.msgs {
		if m.Role == "user" {
			starts = append(starts, i)
		}
	}
	if len(starts) > g.Config.HistoryTurns {
		cut := len(g.msgs)
		if g.Config.HistoryTurns > 0 {
			cut = starts[len(starts)-g.Config.HistoryTurns]
		}
		g.msgs = slices.Clone(g.msgs[cut:])
	}
	now := time.Now
	if g.Now != nil {
		now = g.Now
	}
	ts, err := agent.NewToolset()
	if err != nil {
		return agent.Trace{}, err
	}
	if err := g.list(ctx, ts); err != nil {
		return agent.Trace{}, err
	}
	system := AutonomousPrompt(g.Config, len(ts.Names()), now)
	msgs := append([]chat.Message{{Role: "system", Content: system}}, g.msgs...)
	msgs = append(msgs, chat.Message{Role: "user", Content: query})
	tr, err := agent.Run(ctx, g.Agent, ts, msgs, agent.Limits{MaxSteps: g.Config.MaxSteps})
	if len(tr.Messages) > 0 {
		g.msgs = slices.Clone(tr.Messages[1:])
	}
	return tr, err
}

// list puts the Gateway's tools in ts, by name; the meta-tools list them
// again after they run.
func (g *GatewaySession) list(ctx context.Context, ts *agent.Toolset) error {
	tools, err := g.Client.Tools(ctx)
	if err != nil {
		return err
	}
	ts.Remove(ts.Names()...)
	for _, t := range tools {
		if t.Name == SearchTools || t.Name == RemoveTools {
			call := t.Call
			t.Call = func(ctx context.Context, args json.RawMessage) (string, error) {
				out, err := call(ctx, args)
				if lerr := g.list(ctx, ts); lerr != nil && err == nil {
					err = lerr
				}
				return out, err
			}
		}
		if err := ts.Add(t); err != nil {
			return err
		}
	}
	ts.SortByName()
	return nil
}
