package openai

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"strconv"
	"strings"

	"github.com/agemem/agemem/llm"
	"github.com/agemem/agemem/llm/native"
)

// CompletionRequest is /v1/completions driven with token ids, as RL
// trainers drive vLLM: the prompt's ids in, the sampled ids and their
// log-probabilities out (vLLM's return_token_ids; logprobs 0 is the
// sampled token's alone).
type CompletionRequest struct {
	Model       string  `json:"model"`
	Prompt      []int   `json:"prompt"`
	MaxTokens   int     `json:"max_tokens"`
	Temperature float64 `json:"temperature"`
	TopP        float64 `json:"top_p"`
	Seed        *int64  `json:"seed,omitempty"`
	Logprobs    int     `json:"logprobs"`
	// StopTokenIDs end the reply beside the model's end-of-sequence id.
	StopTokenIDs           []int `json:"stop_token_ids,omitempty"`
	ReturnTokenIDs         bool  `json:"return_token_ids"`
	ReturnTokensAsTokenIDs bool  `json:"return_tokens_as_token_ids"`
}

// Completion is a token-level completion's one choice.
type Completion struct {
	Model        string // the model that answered (an adapter's name)
	TokenIDs     []int
	LogProbs     []float32
	FinishReason string
}

// Complete runs a token-level completion. The ids come from the choice's
// token_ids (vLLM 0.10.2 and later, serve), else from logprobs.tokens
// written "token_id:N" (return_tokens_as_token_ids, older vLLM).
func (c *Client) Complete(ctx context.Context, req CompletionRequest) (Completion, error) {
	req.ReturnTokenIDs, req.ReturnTokensAsTokenIDs = true, true
	resp, cancel, err := c.post(ctx, "/completions", req.Model, req)
	if err != nil {
		return Completion{}, err
	}
	defer cancel()
	defer resp.Body.Close()
	bad := func(format string, args ...any) error {
		return &Error{Server: c.base, Model: req.Model, Status: 200, Attempts: 1, Message: "unreadable completion: " + fmt.Sprintf(format, args...)}
	}
	var r struct {
		Model   string `json:"model"`
		Choices []struct {
			TokenIDs     []int  `json:"token_ids"`
			FinishReason string `json:"finish_reason"`
			Logprobs     *struct {
				Tokens        []string   `json:"tokens"`
				TokenLogprobs []*float32 `json:"token_logprobs"`
			} `json:"logprobs"`
		} `json:"choices"`
	}
	if err := json.NewDecoder(io.LimitReader(resp.Body, 64<<20)).Decode(&r); err != nil {
		return Completion{}, bad("%v", err)
	}
	if len(r.Choices) != 1 {
		return Completion{}, bad("%d choices, want 1", len(r.Choices))
	}
	ch := r.Choices[0]
	out := Completion{Model: r.Model, TokenIDs: ch.TokenIDs, FinishReason: ch.FinishReason}
	if ch.Logprobs != nil {
		if out.TokenIDs == nil {
			for i, t := range ch.Logprobs.Tokens {
				id, err := strconv.Atoi(strings.TrimPrefix(t, "token_id:"))
				if err != nil || !strings.HasPrefix(t, "token_id:") {
					return Completion{}, bad("token %d is %q, not token_id:N (the server ignores return_tokens_as_token_ids)", i, t)
				}
				out.TokenIDs = append(out.TokenIDs, id)
			}
		}
		for i, lp := range ch.Logprobs.TokenLogprobs {
			if lp == nil {
				return Completion{}, bad("no log-probability for token %d", i)
			}
			out.LogProbs = append(out.LogProbs, *lp)
		}
	}
	if out.TokenIDs == nil {
		return Completion{}, bad("no token ids: the server needs return_token_ids (vLLM 0.10.2+) or return_tokens_as_token_ids")
	}
	if len(out.LogProbs) != len(out.TokenIDs) {
		return Completion{}, bad("%d log-probabilities for %d tokens", len(out.LogProbs), len(out.TokenIDs))
	}
	return out, nil
}

// TokenModel is a model on a server driven with token ids, as an
// llm.Model: conversations rendered and replies read by the model's own
// Codec here (the chat history is never re-tokenised by the server, which
// verl found broke convergence), decoding there. With the same seed and
// weights it gives what the native engine gives.
type TokenModel struct {
	Client *Client
	Name   string // the model the requests name (an adapter's)
	Codec  *native.Codec
	// Sampling is a request's when it brings none (MaxTokens also when
	// its own is 0).
	Sampling llm.Sampling
}

// Chat implements llm.Model. A call's sampler is its Seed with its
// Stream folded in (the protocol has one seed): a Stream of 0 samples
// what the native engine samples with that Seed.
func (m *TokenModel) Chat(ctx context.Context, r llm.Request) (llm.Response, error) {
	s := m.Sampling
	if r.Sampling != nil {
		s = *r.Sampling
		if s.MaxTokens == 0 {
			s.MaxTokens = m.Sampling.MaxTokens
		}
	}
	ids, err := m.Codec.Prompt(r.Messages, r.Tools)
	if err != nil {
		return llm.Response{}, err
	}
	if err := m.Codec.CheckPrompt(ids, r.MaxPromptTokens, s.MaxTokens); err != nil {
		return llm.Response{}, err
	}
	seed := int64((s.Seed ^ s.Stream*0x9e3779b97f4a7c15) &^ (1 << 63))
	topP := s.TopP
	if topP == 0 {
		topP = 1
	}
	c, err := m.Client.Complete(ctx, CompletionRequest{Model: m.Name, Prompt: ids, MaxTokens: s.MaxTokens, Temperature: s.Temperature,
		TopP: topP, Seed: &seed, StopTokenIDs: m.Codec.StopIDs})
	if err != nil {
		return llm.Response{}, err
	}
	resp := m.Codec.Reply(ids, c.TokenIDs, c.LogProbs, c.FinishReason, len(r.Tools) > 0)
	resp.Model = c.Model
	return resp, nil
}

var _ llm.Model = (*TokenModel)(nil)

// Post sends body to path and reads a 200 reply to its end (the adapter
// endpoints answer text), retrying as the client's Config says.
func (c *Client) Post(ctx context.Context, path string, body any) error {
	resp, cancel, err := c.post(ctx, path, "", body)
	if err != nil {
		return err
	}
	defer cancel()
	defer resp.Body.Close()
	_, err = io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<20))
	return err
}
