// Package sft is supervised fine-tuning of a Qwen policy on chat JSONL:
// OpenAI-style records ({"messages": [...]}, with tool calls and tool
// results), rendered with the model's chat template, the loss on the
// assistant's tokens only.
package sft

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"strings"

	"github.com/agemem/agemem/internal/jsonerr"
	"github.com/agemem/agemem/model/chat"
	"github.com/agemem/agemem/model/tokenizer"
	"github.com/agemem/agemem/model/train"
)

// Example is one record ready to train on.
type Example struct {
	Seq train.Sequence
	// Prompt is the conversation before the last assistant message, for
	// generating from held-out records.
	Prompt []chat.Message
	// Copy marks the learned tokens that copy the record's context (set
	// by MarkCopies).
	Copy []bool
}

const (
	turnStart = "<|im_start|>assistant\n"
	turnEnd   = "<|im_end|>"
)

// Load reads chat JSONL and tokenizes each record. lossOn "all" learns
// every assistant message that has no "weight": 0 (OpenAI's fine-tuning
// field), "last" only the final message. Errors name the file, the line and
// what is wrong.
func Load(path string, tok *tokenizer.Tokenizer, tmpl chat.Template, lossOn string, maxTokens int) ([]Example, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 0, 1<<20), 64<<20)
	var out []Example
	for line := 1; sc.Scan(); line++ {
		raw := strings.TrimSpace(sc.Text())
		if raw == "" {
			continue
		}
		exs, err := parse([]byte(raw), tok, tmpl, lossOn)
		if err != nil {
			return nil, fmt.Errorf("%s:%d: %w", path, line, err)
		}
		for _, ex := range exs {
			if maxTokens > 0 && len(ex.Seq.IDs) > maxTokens {
				return nil, fmt.Errorf("%s:%d: %d tokens exceed the model's %d positions", path, line, len(ex.Seq.IDs), maxTokens)
			}
		}
		out = append(out, exs...)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("%s: no records", path)
	}
	return out, nil
}

func parse(raw []byte, tok *tokenizer.Tokenizer, tmpl chat.Template, lossOn string) ([]Example, error) {
	var rec struct {
		Messages []struct {
			chat.Message
			// Weight is OpenAI's fine-tuning field: 0 leaves an
			// assistant message out of the loss, 1 (or none) learns it.
			Weight *int `json:"weight"`
		} `json:"messages"`
	}
	if err := json.Unmarshal(raw, &rec); err != nil {
		if _, msg, ok := jsonerr.Type(err, "Message"); ok {
			return nil, fmt.Errorf(`not a chat record ({"messages": [...]}): %s`, msg)
		}
		return nil, fmt.Errorf("not a chat record: %w", err)
	}
	if len(rec.Messages) == 0 {
		return nil, fmt.Errorf(`no "messages"`)
	}
	msgs := make([]chat.Message, len(rec.Messages))
	var learn []int
	replies := 0
	for i, m := range rec.Messages {
		msgs[i] = m.Message
		switch m.Role {
		case "system", "user", "tool":
			if m.Weight != nil {
				return nil, fmt.Errorf("messages[%d]: weight is for assistant messages, not %s", i, m.Role)
			}
		case "assistant":
			replies++
			if m.Weight != nil && *m.Weight != 0 && *m.Weight != 1 {
				return nil, fmt.Errorf("messages[%d]: weight %d: want 0 or 1", i, *m.Weight)
			}
			if m.Weight == nil || *m.Weight == 1 {
				learn = append(learn, i)
			}
		default:
			return nil, fmt.Errorf("messages[%d]: role %q is not system, user, assistant or tool", i, m.Role)
		}
	}
	if replies == 0 {
		return nil, fmt.Errorf("no assistant message to learn")
	}
	if lossOn == "last" {
		last := len(msgs) - 1
		if msgs[last].Role != "assistant" {
			return nil, fmt.Errorf("messages[%d]: the record must end with the assistant message it teaches (sft.loss_on: last)", last)
		}
		if len(learn) == 0 || learn[len(learn)-1] != last {
			return nil, fmt.Errorf("messages[%d]: the last message has weight 0, so the record teaches nothing (sft.loss_on: last)", last)
		}
		learn = learn[len(learn)-1:]
	}
	if len(learn) == 0 {
		return nil, fmt.Errorf("no assistant message to learn")
	}
	full, err := chat.Render(msgs, chat.Options{Template: tmpl})
	if err != nil {
		return nil, err
	}
	// Each learned reply must be learned as the policy saw its context when
	// it wrote it: the rendering of the conversation up to that reply. Where
	// the whole conversation renders that prefix unchanged (Qwen2.5's
	// template, or Qwen3's within one user turn) the reply is a span of
	// one shared example; where the template rewrote it (Qwen3 drops the
	// reasoning of turns before the last user message) it becomes an
	// example of its own.
	var out []Example
	var spans [][2]int
	lastShared := -1
	for _, i := range learn {
		text := full
		if i < len(msgs)-1 {
			if text, err = chat.Render(msgs[:i+1], chat.Options{Template: tmpl}); err != nil {
				return nil, err
			}
		}
		sp, err := lastTurn(text)
		if err != nil {
			return nil, err
		}
		if strings.HasPrefix(full, text) {
			spans = append(spans, sp)
			lastShared = i
			continue
		}
		out = append(out, Example{Seq: tokenize(tok, text, [][2]int{sp}), Prompt: msgs[:i]})
	}
	if len(spans) > 0 {
		out = append(out, Example{Seq: tokenize(tok, full, spans), Prompt: msgs[:lastShared]})
	}
	return out, nil
}

// lastTurn is the span of the last assistant turn of a rendered
// conversation as the loss covers it: its content and the end-of-turn
// token (the model must learn to stop), not the "<|im_start|>assistant\n"
// header, which the prompt supplies.
func lastTurn(text string) ([2]int, error) {
	i := strings.LastIndex(text, turnStart)
	if i < 0 {
		return [2]int{}, fmt.Errorf("the template rendered no assistant turn")
	}
	lo := i + len(turnStart)
	j := strings.Index(text[lo:], turnEnd)
	if j < 0 {
		return [2]int{}, fmt.Errorf("an assistant turn without %s", turnEnd)
	}
	return [2]int{lo, lo + j + len(turnEnd)}, nil
}

// tokenize encodes text, learning the tokens of spans (in order).
func tokenize(tok *tokenizer.Tokenizer, text string, spans [][2]int) train.Sequence {
	var seq train.Sequence
	add := func(s string, learn bool) {
		for _, id := range tok.Encode(s) {
			seq.IDs = append(seq.IDs, id)
			seq.Loss = append(seq.Loss, learn)
		}
	}
	prev := 0
	for _, sp := range spans {
		add(text[prev:sp[0]], false)
		add(text[sp[0]:sp[1]], true)
		prev = sp[1]
	}
	add(text[prev:], false)
	return seq
}

// Split holds out the last share of the records (after a seeded shuffle by
// the caller) for evaluation; at least one record stays on each side when
// there are two or more.
func Split(ex []Example, fraction float64) (trainSet, evalSet []Example) {
	n := int(float64(len(ex)) * fraction)
	if fraction > 0 && n == 0 && len(ex) > 1 {
		n = 1
	}
	return ex[:len(ex)-n], ex[len(ex)-n:]
}

// templateShare is how common a token may be among the replies and still
// count as content: tokens learned in more records than this share (the
// think phrases, JSON keys, tool names, common letters) are the format.
const templateShare = 0.2

// MarkCopies sets each record's Copy: the learned tokens that copy its
// context. A copy starts at a content token (rarer among the replies than
// templateShare) that the record's unlearned part (what the user said, what
// a tool returned) holds, and extends left and right while the reply and
// the context share the bigram, so a copied fact is marked whole ("Ivo is
// a judge." around the rare "judge" and "Ivo"'s pieces). These are the
// names and facts a memory agent must carry into its tool calls and
// answers, and what a small model does not learn when they are a handful
// among hundreds of format tokens.
func MarkCopies(ex []Example) {
	df := map[int]int{}
	for _, e := range ex {
		seen := map[int]bool{}
		for i, id := range e.Seq.IDs {
			if e.Seq.Loss[i] && !seen[id] {
				seen[id] = true
				df[id]++
			}
		}
	}
	limit := int(templateShare * float64(len(ex)))
	for k, e := range ex {
		ids, loss := e.Seq.IDs, e.Seq.Loss
		ctx, bigrams := map[int]bool{}, map[[2]int]bool{}
		for i, id := range ids {
			if !loss[i] {
				ctx[id] = true
				if i > 0 && !loss[i-1] {
					bigrams[[2]int{ids[i-1], id}] = true
				}
			}
		}
		mark := make([]bool, len(ids))
		for i, id := range ids {
			if !loss[i] || mark[i] || !ctx[id] || df[id] > limit {
				continue
			}
			mark[i] = true
			for j := i - 1; j >= 0 && loss[j] && !mark[j] && bigrams[[2]int{ids[j], ids[j+1]}]; j-- {
				mark[j] = true
			}
			for j := i + 1; j < len(ids) && loss[j] && bigrams[[2]int{ids[j-1], ids[j]}]; j++ {
				mark[j] = true
			}
		}
		ex[k].Copy = mark
	}
}
