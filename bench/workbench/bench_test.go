package workbench

import (
	"context"
	"strings"
	"testing"

	"github.com/agemem/agemem/model/chat"
)

// TestToolsetRecordsActions: calls through the agent loop's tools run in
// the sandbox and are recorded as WorkBench writes them, arguments in the
// model's order, values as Python's str() shows them; schema violations
// reach the model, not the sandbox.
func TestToolsetRecordsActions(t *testing.T) {
	s := Default().New()
	var got []string
	ts, err := s.Toolset(nil, func(a Action) { got = append(got, a.String()) })
	if err != nil {
		t.Fatal(err)
	}
	if len(ts.Functions()) != len(Tools) {
		t.Fatalf("%d tools", len(ts.Functions()))
	}
	ctx := context.Background()
	out, ok, err := ts.Execute(ctx, chat.ToolCall{Name: "calendar.delete_event", Arguments: `{"event_id":"00000013"}`})
	if err != nil || !ok || out != "Event deleted successfully." {
		t.Fatalf("%q %v %v", out, ok, err)
	}
	out, ok, _ = ts.Execute(ctx, chat.ToolCall{Name: "calendar.create_event", Arguments: `{"duration":60}`})
	if ok || !strings.Contains(out, "schema") {
		t.Fatalf("a number where a string is expected: %q", out)
	}
	ts.Execute(ctx, chat.ToolCall{Name: "email.send_email", Arguments: `{"subject":"Hi","recipient":"a@b.com","body":"x"}`})
	want := []string{`calendar.delete_event.func(event_id="00000013")`, `email.send_email.func(subject="Hi", recipient="a@b.com", body="x")`}
	if strings.Join(got, "|") != strings.Join(want, "|") {
		t.Fatalf("recorded %q", got)
	}
}
