package native

import (
	"slices"

	"github.com/agemem/agemem/llm"
	"github.com/agemem/agemem/model/chat"
	"github.com/agemem/agemem/model/tokenizer"
)

// Codec is what stands around a model's decoding: the chat template and
// tokenizer that turn a conversation into the tokens it reads, and its
// tokens back into a reply. The engine here uses it, and so does a client
// that drives a remote engine with token ids (a vLLM or serve fleet), so
// both read and write exactly the same tokens.
type Codec struct {
	Tok  *tokenizer.Tokenizer
	Tmpl chat.Template
	// StopIDs end a reply (<|im_end|>, <|endoftext|>).
	StopIDs []int
	// MaxPositions is the model's context; MaxPromptTokens refuses longer
	// prompts (0: the positions less the response budget).
	MaxPositions, MaxPromptTokens int
}

// NewCodec is the codec of a model with maxPositions positions.
func NewCodec(tok *tokenizer.Tokenizer, tmpl chat.Template, maxPositions, maxPromptTokens int) *Codec {
	c := &Codec{Tok: tok, Tmpl: tmpl, MaxPositions: maxPositions, MaxPromptTokens: maxPromptTokens}
	for _, name := range []string{"<|im_end|>", "<|endoftext|>"} {
		if id, ok := tok.TokenID(name); ok {
			c.StopIDs = append(c.StopIDs, id)
		}
	}
	return c
}

// Tokenizer and Template are the model's.
func (c *Codec) Tokenizer() *tokenizer.Tokenizer { return c.Tok }
func (c *Codec) Template() chat.Template         { return c.Tmpl }

// Count counts tokens as the model does (AgeMem's context budget).
func (c *Codec) Count(text string) int { return c.Tok.Count(text) }

// ContextLength is the most tokens a prompt and its response may hold.
func (c *Codec) ContextLength() int { return c.MaxPositions }

// Prompt renders a conversation (with its tools) as the model reads it,
// with the generation prompt, and encodes it.
func (c *Codec) Prompt(msgs []chat.Message, tools []chat.Function) ([]int, error) {
	defs, err := chat.Definitions(tools)
	if err != nil {
		return nil, err
	}
	text, err := chat.Render(msgs, chat.Options{Template: c.Tmpl, Tools: defs, AddGenerationPrompt: true})
	if err != nil {
		return nil, err
	}
	return c.Tok.Encode(text), nil
}

// CheckPrompt refuses a prompt longer than the budget asked for (0: the
// codec's), and never one that leaves no room for maxTokens in the
// model's positions, with an llm.PromptTooLongError (llm.ErrContextFull).
func (c *Codec) CheckPrompt(ids []int, asked, maxTokens int) error {
	if asked == 0 {
		asked = c.MaxPromptTokens
	}
	if n := c.MaxPositions; n > 0 && (asked == 0 || asked > n-maxTokens) {
		asked = max(n-maxTokens, 1)
	}
	if asked > 0 && len(ids) > asked {
		return &llm.PromptTooLongError{Tokens: len(ids), Limit: asked}
	}
	return nil
}

// Reply is the assistant's turn of a generation: the text of its tokens
// (the closing stop token left out), parsed for tool calls when the
// request offered tools, with the tokens read and written and their
// log-probabilities.
func (c *Codec) Reply(prompt, tokens []int, logProbs []float32, finish string, tools bool) llm.Response {
	ids := tokens
	if finish == "stop" && len(ids) > 0 && slices.Contains(c.StopIDs, ids[len(ids)-1]) {
		ids = ids[:len(ids)-1] // the end-of-turn token is not part of the message
	}
	text := c.Tok.Decode(ids, true)
	msg := chat.Message{Role: "assistant", Content: text}
	if tools {
		msg = chat.ReplyMessage(text)
	}
	return llm.Response{Message: msg, PromptTokens: len(prompt), CompletionTokens: len(tokens),
		FinishReason: finish, PromptIDs: prompt, ResponseIDs: tokens, LogProbs: logProbs}
}
