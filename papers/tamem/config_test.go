package tamem

import (
	"strings"
	"testing"

	"github.com/agemem/agemem/bench/locomo"
)

// TestConfig: the paper's defaults validate and a bad key is named;
// each chunking keeps its pages in a namespace of its own.
func TestConfig(t *testing.T) {
	c := DefaultConfig()
	if err := c.Validate(); err != nil || c.MaxTurns != MaxTurns {
		t.Fatalf("defaults: %v, %d turns", err, c.MaxTurns)
	}
	c.Window, c.Chunking.Kind, c.Chunking.Overlap = 0, "topics", 1
	err := c.Validate()
	for _, want := range []string{"window: 0: want at least 1", `chunking.kind: "topics" is not one of llm, fixed, semantic`, "chunking.overlap: 1: want the share"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("error %v lacks %q", err, want)
		}
	}
	suffixes := map[string]string{}
	for _, kind := range []string{"llm", "fixed", "semantic"} {
		ch := DefaultConfig().Chunking
		ch.Kind = kind
		_, suffixes[kind] = ch.Extractor(nil, nil)
	}
	if suffixes["llm"] != "" || suffixes["fixed"] != "/fixed-512-0.25" || suffixes["semantic"] != "/semantic-8" {
		t.Fatalf("namespaces: %v", suffixes)
	}
}

// TestConversationOf: a LoCoMo sample becomes TA-Mem's conversation, its
// dialogue ids kept and a shared photo told by its caption.
func TestConversationOf(t *testing.T) {
	s := locomo.Sample{ID: "c1", SpeakerA: "Ann", SpeakerB: "Bo", Sessions: []locomo.Session{{N: 1, DateTime: "1 May 2023",
		Turns: []locomo.Turn{{Speaker: "Ann", DiaID: "D1:1", Text: "Look!", BlipCaption: "a red kite"}, {Speaker: "Bo", DiaID: "D1:2", Text: "Nice."}}}}}
	c := ConversationOf(s)
	if c.ID != "c1" || len(c.Sessions) != 1 || c.Sessions[0].Date != "1 May 2023" || len(c.Sessions[0].Lines) != 2 {
		t.Fatalf("%+v", c)
	}
	if l := c.Sessions[0].Lines[0]; l.DiaID != "D1:1" || l.Text != "Look! [shares a photo: a red kite]" {
		t.Fatalf("line %+v", l)
	}
}
