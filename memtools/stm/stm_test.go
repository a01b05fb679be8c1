package stm

import (
	"testing"

	"github.com/agemem/agemem/model/chat"
)

func TestContextKeepsTokenCountsThroughEdits(t *testing.T) {
	c := New(nil)
	c.Append(chat.Message{Role: System, Content: "sys prompt"},
		chat.Message{Role: User, Content: "one two three"},
		chat.Message{Role: Assistant, Content: "four"},
		chat.Message{Role: Tool, Content: "five six"})
	recount := func() int {
		n := 0
		for _, m := range c.Messages() {
			n += Words{}.Count(m.Content) + MessageOverhead
		}
		return n
	}
	if c.Tokens() != recount() || c.Tokens() != 2+3+1+2+4*MessageOverhead {
		t.Fatalf("tokens %d, recount %d", c.Tokens(), recount())
	}
	c.Replace([]int{1, 2}, chat.Message{Role: User, Content: "summary"})
	if c.Len() != 3 || c.At(1).Content != "summary" || c.At(2).Role != Tool || c.Tokens() != recount() {
		t.Fatalf("after Replace: %+v, tokens %d vs %d", c.Messages(), c.Tokens(), recount())
	}
	clone := c.Clone()
	if n := c.Remove(func(_ int, m chat.Message) bool { return m.Role == Tool }); n != 1 || c.Tokens() != recount() {
		t.Fatalf("Remove: %d, tokens %d vs %d", n, c.Tokens(), recount())
	}
	if clone.Len() != 3 {
		t.Fatal("Clone shares state")
	}
	c.Reset()
	if c.Len() != 1 || c.At(0).Role != System || c.Tokens() != recount() {
		t.Fatalf("Reset must keep only system messages: %+v", c.Messages())
	}
}
