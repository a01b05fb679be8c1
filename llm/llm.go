// Package llm is the one way the toolkit calls a language model: a
// conversation, and the functions the model may call, in; the assistant's
// next message out, with token ids and log-probabilities where the backend
// has them. Backends implement Model once each: native (the Qwen engine
// here, which training needs), ollama and openai (any OpenAI-compatible
// server). Protocols are adapters over it: AgeMem's text format
// (memtools), the function-calling loop (agent).
package llm

import (
	"context"
	"errors"
	"fmt"

	"github.com/agemem/agemem/model/chat"
)

// Model is a chat model.
type Model interface {
	Chat(ctx context.Context, r Request) (Response, error)
}

// Batcher is a Model that answers several requests in the same decoding
// steps (the native engine): a GRPO group's rollouts, an evaluation's
// episodes. Callers without one run Chat concurrently.
type Batcher interface {
	Model
	ChatBatch(ctx context.Context, rs []Request) ([]Response, error)
}

// Request is one model call.
type Request struct {
	Messages []chat.Message
	// Tools are the functions the model may call; with none, the reply's
	// text is the content as written (AgeMem's format keeps its own
	// blocks there), with some, a backend parses its calls out.
	Tools []chat.Function
	// Sampling, when set, replaces the model's own settings for this call.
	Sampling *Sampling
	// OnText, when set, is called as the reply grows with a function that
	// returns the text so far (decoded when called, so a slow reader costs
	// the model nothing; it may be called after OnText returns, from
	// another goroutine).
	OnText func(sofar func() string)
	// Namespace keeps prefix reuse within one tenant: a backend that
	// caches prompts shares a cached prefix only between requests of the
	// same namespace, beyond the prefixes it was told to share (a system
	// prompt every conversation starts with), so that one tenant's timing
	// never shows what another sent.
	Namespace string
	// MaxPromptTokens refuses longer prompts with ErrContextFull (0: the
	// model's own limit).
	MaxPromptTokens int
}

// Sampling controls generation. Temperature 0 is greedy decoding.
type Sampling struct {
	Temperature float64
	TopP        float64 // nucleus mass in (0, 1]; 0 or 1 keeps everything
	TopK        int     // 0 keeps everything
	MaxTokens   int     // 0: the model's own response budget
	// Seed and Stream start the call's random generator (PCG's two
	// words), so a run is reproducible however its calls were batched.
	Seed, Stream uint64
}

// Response is the model's turn.
type Response struct {
	// Message is the assistant's message: its text as Content (calls
	// parsed out into ToolCalls when the request offered tools).
	Message          chat.Message `json:"message"`
	PromptTokens     int          `json:"prompt_tokens"`
	CompletionTokens int          `json:"completion_tokens"`
	// FinishReason is "stop" (the model ended its turn) or "length" (the
	// response budget ran out); empty where the backend does not say.
	FinishReason string `json:"finish_reason,omitempty"`
	// PromptIDs and ResponseIDs are the tokens the model read and wrote,
	// LogProbs each response token's log-probability under the model
	// (temperature 1, no truncation): what training needs, set by the
	// native backend only.
	PromptIDs   []int     `json:"-"`
	ResponseIDs []int     `json:"-"`
	LogProbs    []float32 `json:"-"`
	// Model is the model that answered as its server names it (a LoRA
	// adapter's versioned name on a rollout engine); empty where the
	// backend does not say.
	Model string `json:"-"`
}

// ErrContextFull is what a Model's error is (errors.Is) when the
// conversation no longer fits the model: the agent let its context grow
// past what the model can read. Episodes end there as failed tasks; serve
// answers 400 context_length_exceeded.
var ErrContextFull = errors.New("the conversation no longer fits the model's context")

// PromptTooLongError is a conversation that does not fit the model.
type PromptTooLongError struct{ Tokens, Limit int }

func (e *PromptTooLongError) Error() string {
	return fmt.Sprintf("prompt of %d tokens exceeds the limit of %d", e.Tokens, e.Limit)
}

// Is makes errors.Is(err, ErrContextFull) hold.
func (e *PromptTooLongError) Is(target error) bool { return target == ErrContextFull }

// Reply is text as the assistant's response (scripted models).
func Reply(text string) Response {
	return Response{Message: chat.Message{Role: "assistant", Content: text}}
}
