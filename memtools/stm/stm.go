// Package stm is AgeMem's short-term memory C_t: the message list the policy
// sees, with token counts so that budgets (T_max) and rewards can be
// computed.
package stm

import (
	"slices"
	"unicode"
	"unicode/utf8"

	"github.com/agemem/agemem/model/chat"
)

// Roles of chat messages.
const (
	System    = "system"
	User      = "user"
	Assistant = "assistant"
	Tool      = "tool"
)

// Tokenizer counts tokens. The Qwen tokenizer implements it; Words is the
// weight-free default.
type Tokenizer interface {
	Count(text string) int
}

// MessageOverhead is the tokens ChatML adds around each message
// ("<|im_start|>", the role, "\n", "<|im_end|>", "\n").
const MessageOverhead = 5

// Words approximates a subword tokenizer without a vocabulary: every run of
// letters or digits costs one token per started six characters (about what
// byte-level BPE spends on English), every other non-space character one.
type Words struct{}

// Count implements Tokenizer.
func (Words) Count(text string) int {
	n, run := 0, 0
	flush := func() {
		if run > 0 {
			n += (run + 5) / 6
			run = 0
		}
	}
	for i := 0; i < len(text); {
		r, size := utf8.DecodeRuneInString(text[i:])
		i += size
		switch {
		case unicode.IsLetter(r) || unicode.IsDigit(r):
			run++
		case unicode.IsSpace(r):
			flush()
		default:
			flush()
			n++
		}
	}
	flush()
	return n
}

// Context is the short-term memory. The zero value is not usable; call New.
type Context struct {
	tok    Tokenizer
	msgs   []chat.Message
	counts []int
	total  int
}

// New returns an empty context counting with tok (Words if nil).
func New(tok Tokenizer) *Context {
	if tok == nil {
		tok = Words{}
	}
	return &Context{tok: tok}
}

// Tokenizer returns the counter in use.
func (c *Context) Tokenizer() Tokenizer { return c.tok }

// Append adds messages at the end.
func (c *Context) Append(ms ...chat.Message) {
	for _, m := range ms {
		n := c.tok.Count(m.Content) + MessageOverhead
		c.msgs = append(c.msgs, m)
		c.counts = append(c.counts, n)
		c.total += n
	}
}

// Messages returns a copy of the messages.
func (c *Context) Messages() []chat.Message { return slices.Clone(c.msgs) }

// At returns message i.
func (c *Context) At(i int) chat.Message { return c.msgs[i] }

// Len is the number of messages.
func (c *Context) Len() int { return len(c.msgs) }

// Tokens is the context size in tokens, the T_used of Eq. 19.
func (c *Context) Tokens() int { return c.total }

// MessageTokens returns the tokens message i costs.
func (c *Context) MessageTokens(i int) int { return c.counts[i] }

// Reset empties the context but keeps its system messages: the STM reset
// between Stages 1 and 2 (Algorithm 1, line 11).
func (c *Context) Reset() {
	c.Remove(func(_ int, m chat.Message) bool { return m.Role != System })
}

// Remove deletes every message for which drop returns true and returns how
// many were removed.
func (c *Context) Remove(drop func(i int, m chat.Message) bool) int {
	var msgs []chat.Message
	var counts []int
	total, removed := 0, 0
	for i, m := range c.msgs {
		if drop(i, m) {
			removed++
			continue
		}
		msgs = append(msgs, m)
		counts = append(counts, c.counts[i])
		total += c.counts[i]
	}
	c.msgs, c.counts, c.total = msgs, counts, total
	return removed
}

// Replace removes the messages at the given sorted indices and puts m where
// the first of them was (Eq. 14).
func (c *Context) Replace(indices []int, m chat.Message) {
	if len(indices) == 0 {
		return
	}
	first := indices[0]
	set := map[int]bool{}
	for _, i := range indices {
		set[i] = true
	}
	var out []chat.Message
	for i, old := range c.msgs {
		if i == first {
			out = append(out, m)
		}
		if !set[i] {
			out = append(out, old)
		}
	}
	c.msgs, c.counts, c.total = nil, nil, 0
	c.Append(out...)
}

// Clone returns an independent copy.
func (c *Context) Clone() *Context {
	return &Context{tok: c.tok, msgs: slices.Clone(c.msgs), counts: slices.Clone(c.counts), total: c.total}
}
