package memtools

import (
	"context"
	"encoding/json"
	"fmt"
	"regexp"
	"sort"
	"strings"
	"unicode"

	"github.com/agemem/agemem/llm"
	"github.com/agemem/agemem/memtools/stm"
	"github.com/agemem/agemem/model/chat"
)

// Summarizer compresses a span of messages into one text (Summarize(.) of
// Eq. 14).
type Summarizer interface {
	Summarize(ctx context.Context, msgs []chat.Message) (string, error)
}

// Extractive is the deterministic summariser used when no policy is
// configured: it keeps the sentences richest in key items (names, numbers,
// dates), in their original order, within a token budget.
type Extractive struct {
	MaxTokens int
	Tokenizer stm.Tokenizer
}

var sentenceEnd = regexp.MustCompile(`[.!?]+(\s+|$)`)

// Summarize implements Summarizer.
func (x Extractive) Summarize(_ context.Context, msgs []chat.Message) (string, error) {
	tok := x.Tokenizer
	if tok == nil {
		tok = stm.Words{}
	}
	type sent struct {
		text  string
		score int
		pos   int
	}
	var sents []sent
	seen := map[string]bool{}
	for _, m := range msgs {
		for _, s := range splitSentences(messageText(m)) {
			if seen[s] {
				continue
			}
			seen[s] = true
			sents = append(sents, sent{s, KeyItemCount(s), len(sents)})
		}
	}
	byScore := append([]sent(nil), sents...)
	sort.SliceStable(byScore, func(i, j int) bool { return byScore[i].score > byScore[j].score })
	budget := x.MaxTokens
	if budget <= 0 {
		budget = 256
	}
	keep := map[int]bool{}
	used := 0
	for _, s := range byScore {
		n := tok.Count(s.text)
		if used+n > budget {
			continue
		}
		keep[s.pos] = true
		used += n
	}
	var out []string
	for _, s := range sents {
		if keep[s.pos] {
			out = append(out, s.text)
		}
	}
	return strings.Join(out, " "), nil
}

// messageText is what a message contributes to a summary: a user's words, an
// assistant's answer (not its reasoning or calls), the contents of
// retrieved memories.
func messageText(m chat.Message) string {
	switch m.Role {
	case stm.Assistant:
		if p := Parse(m.Content); p.HasAnswer {
			return p.Answer
		}
		return ""
	case stm.Tool:
		var r struct {
			Memories []struct {
				Content string `json:"content"`
			} `json:"memories"`
		}
		if json.Unmarshal([]byte(m.Content), &r) != nil {
			return ""
		}
		var parts []string
		for _, mem := range r.Memories {
			parts = append(parts, ensurePeriod(mem.Content))
		}
		return strings.Join(parts, " ")
	}
	return strings.TrimPrefix(m.Content, SummaryPrefix)
}

func ensurePeriod(s string) string {
	s = strings.TrimSpace(s)
	if s != "" && !strings.ContainsAny(s[len(s)-1:], ".!?") {
		s += "."
	}
	return s
}

func splitSentences(text string) []string {
	var out []string
	last := 0
	for _, loc := range sentenceEnd.FindAllStringIndex(text, -1) {
		if s := strings.TrimSpace(text[last:loc[1]]); s != "" {
			out = append(out, s)
		}
		last = loc[1]
	}
	if s := strings.TrimSpace(text[last:]); s != "" {
		out = append(out, s)
	}
	return out
}

// KeyItemCount counts the key items of a text as R_preservation (Eq. 21)
// understands them: capitalised words that do not start a sentence, and
// numbers.
func KeyItemCount(s string) int { return len(KeyItems(s)) }

// KeyItems extracts named entities and numbers, approximated without a
// tagger: runs of capitalised words (not the first word of a sentence unless
// followed by another capitalised word) and tokens containing digits.
func KeyItems(s string) []string {
	var items []string
	for _, sentence := range splitSentences(s) {
		words := strings.Fields(sentence)
		var run []string
		flush := func() {
			if len(run) > 0 {
				items = append(items, strings.Join(run, " "))
				run = nil
			}
		}
		for i, w := range words {
			w = strings.TrimFunc(w, func(r rune) bool { return !unicode.IsLetter(r) && !unicode.IsDigit(r) })
			if w == "" {
				flush()
				continue
			}
			r := []rune(w)
			switch {
			case strings.IndexFunc(w, unicode.IsDigit) >= 0:
				flush()
				items = append(items, w)
			case unicode.IsUpper(r[0]) && (i > 0 || (len(words) > 1 && startsUpper(words[1]) && !functionWords[w])):
				run = append(run, w)
			default:
				flush()
			}
		}
		flush()
	}
	return items
}

// functionWords start sentences capitalised without naming anything.
var functionWords = map[string]bool{"The": true, "A": true, "An": true, "In": true, "On": true, "At": true,
	"By": true, "This": true, "That": true, "It": true, "He": true, "She": true, "They": true, "We": true,
	"I": true, "Our": true, "My": true, "Your": true, "Their": true, "His": true, "Her": true, "Its": true}

func startsUpper(w string) bool {
	for _, r := range w {
		return unicode.IsUpper(r)
	}
	return false
}

// ModelSummarizer sends the span to a model with the paper's summarisation
// prompt.
type ModelSummarizer struct {
	Model llm.Model
}

// Summarize implements Summarizer.
func (p ModelSummarizer) Summarize(ctx context.Context, msgs []chat.Message) (string, error) {
	var conv strings.Builder
	for _, m := range msgs {
		fmt.Fprintf(&conv, "%s: %s\n", m.Role, m.Content)
	}
	prompt := strings.Replace(SummaryPrompt, "[CONVERSATION_TEXT]", conv.String(), 1)
	r, err := p.Model.Chat(ctx, llm.Request{Messages: []chat.Message{{Role: stm.System, Content: prompt}, {Role: stm.User, Content: "Summarize the conversation span above."}}})
	if err != nil {
		return "", err
	}
	text := r.Message.Content
	// A policy trained on the AgeMem format may wrap its output.
	if parsed := Parse(text); parsed.HasAnswer {
		text = parsed.Answer
	}
	text = strings.TrimSpace(text)
	if text == "" {
		return "", fmt.Errorf("the summariser policy returned an empty summary")
	}
	return text, nil
}
