package serve

// POST /v1/completions: one generation on the native engine, outside the
// agent loop, as vLLM serves it to RL trainers: the prompt as token ids
// (or text), the sampled token ids back (return_token_ids, vLLM's field)
// with each one's log-probability (logprobs: 0, the sampled token's only;
// tokens written "token_id:N" under return_tokens_as_token_ids). A seed
// makes the sample reproducible: the same seed and prompt give the same
// tokens as the trainer's own engine. The model is the served one or a
// loaded adapter's name.

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	mrand "math/rand/v2"
	"net/http"
	"slices"
	"strconv"
	"time"

	"github.com/agemem/agemem/llm"
	"github.com/agemem/agemem/model/engine"
)

type completionRequest struct {
	Model       string          `json:"model"`
	Prompt      json.RawMessage `json:"prompt"`
	MaxTokens   *int            `json:"max_tokens"`
	Temperature *float64        `json:"temperature"`
	TopP        *float64        `json:"top_p"`
	TopK        *int            `json:"top_k"`
	Seed        *int64          `json:"seed"`
	Logprobs    *int            `json:"logprobs"`
	N           *int            `json:"n"`
	Stream      bool            `json:"stream"`
	Echo        bool            `json:"echo"`
	User        string          `json:"user"`
	// vLLM's extensions.
	StopTokenIDs           []int `json:"stop_token_ids"`
	ReturnTokenIDs         bool  `json:"return_token_ids"`
	ReturnTokensAsTokenIDs bool  `json:"return_tokens_as_token_ids"`
	SkipSpecialTokens      *bool `json:"skip_special_tokens"`
}

type completionLogprobs struct {
	Tokens        []string  `json:"tokens"`
	TokenLogprobs []float32 `json:"token_logprobs"`
	TopLogprobs   []any     `json:"top_logprobs"`
	TextOffset    []int     `json:"text_offset"`
}

type completionChoice struct {
	Index          int                 `json:"index"`
	Text           string              `json:"text"`
	Logprobs       *completionLogprobs `json:"logprobs"`
	FinishReason   string              `json:"finish_reason"`
	TokenIDs       []int               `json:"token_ids,omitempty"`
	PromptTokenIDs []int               `json:"prompt_token_ids,omitempty"`
}

// completions is POST /v1/completions.
func (s *Server) completions(w http.ResponseWriter, r *http.Request) *apiError {
	var req completionRequest
	if aerr := decodeBody(r, &req); aerr != nil {
		return aerr
	}
	switch {
	case req.Model == "":
		return errInvalid("model", "missing_parameter", "'model' must name the served model or a loaded adapter")
	case req.Stream:
		return errInvalid("stream", "unsupported_value", "streaming completions are not served; send stream false")
	case req.Echo:
		return errInvalid("echo", "unsupported_value", "echo is not served; send echo false")
	case req.N != nil && *req.N != 1:
		return errInvalid("n", "unsupported_value", "one choice per request (n 1); send several requests")
	case req.Logprobs != nil && *req.Logprobs != 0:
		return errInvalid("logprobs", "unsupported_value", "the engine returns the sampled token's log-probability only: send logprobs 0")
	}
	e, release, aerr := s.acquire(req.Model)
	if aerr != nil {
		return aerr
	}
	defer release()
	ids, aerr := completionPrompt(req.Prompt, e.Tok.Encode, e.Model().VocabSize)
	if aerr != nil {
		return aerr
	}
	sv := s.cfg
	limit := sv.MaxTokens
	if limit == 0 {
		limit = s.agent.ResponseBudget
	}
	smp := engine.Sampling{Temperature: sv.Temperature, TopP: sv.TopP, MaxTokens: limit, StopIDs: e.StopIDs, Seed: mrand.Uint64()}
	if req.MaxTokens != nil {
		if *req.MaxTokens < 1 || *req.MaxTokens > limit {
			return errInvalid("max_tokens", "invalid_value", fmt.Sprintf("max_tokens %d: want 1 to %d (serve.max_tokens, else agent.response_budget)", *req.MaxTokens, limit))
		}
		smp.MaxTokens = *req.MaxTokens
	}
	if req.Temperature != nil {
		smp.Temperature = *req.Temperature
	}
	if req.TopP != nil {
		smp.TopP = *req.TopP
	}
	if req.TopK != nil {
		smp.TopK = *req.TopK
		if smp.TopK == -1 { // vLLM's "keep everything"
			smp.TopK = 0
		}
	}
	if req.Seed != nil {
		smp.Seed = uint64(*req.Seed)
	}
	for i, id := range req.StopTokenIDs {
		if id < 0 || id >= e.Model().VocabSize {
			return errInvalid(fmt.Sprintf("stop_token_ids[%d]", i), "invalid_value", fmt.Sprintf("token id %d is outside the vocabulary", id))
		}
		if !slices.Contains(smp.StopIDs, id) {
			smp.StopIDs = append(slices.Clip(smp.StopIDs), id)
		}
	}
	if err := smp.Check(); err != nil {
		return errInvalid("", "invalid_value", err.Error())
	}
	if err := e.CheckPrompt(ids, sv.MaxPromptTokens, smp.MaxTokens); err != nil {
		var tl *llm.PromptTooLongError
		errors.As(err, &tl)
		return errInvalid("prompt", "context_length_exceeded", fmt.Sprintf("the prompt holds %d tokens, over the limit of %d with max_tokens %d", len(ids), tl.Limit, smp.MaxTokens))
	}
	ns, aerr := namespace(r, principalFrom(r.Context()))
	if aerr != nil {
		return aerr
	}
	gens, err := e.Batching().GenerateBatch(r.Context(), []engine.Request{{Prompt: ids, Sampling: smp, Namespace: ns}})
	if err != nil {
		if r.Context().Err() != nil {
			return contextError(r.Context().Err())
		}
		return &apiError{Status: http.StatusInternalServerError, Type: "server_error", Code: "generation_failed", Message: "generation failed", cause: err}
	}
	g := gens[0]
	msg := e.Reply(ids, g.Tokens, g.LogProbs, g.FinishReason, false)
	ch := completionChoice{Text: msg.Message.Content, FinishReason: g.FinishReason}
	if req.SkipSpecialTokens != nil && !*req.SkipSpecialTokens {
		ch.Text = e.Tok.Decode(g.Tokens[:len(g.Tokens)-trailingStop(g, e.StopIDs)], false)
	}
	if req.ReturnTokenIDs {
		ch.TokenIDs, ch.PromptTokenIDs = g.Tokens, ids
	}
	if req.Logprobs != nil {
		lp := &completionLogprobs{TokenLogprobs: g.LogProbs, TopLogprobs: make([]any, len(g.Tokens))}
		off := 0
		for _, id := range g.Tokens {
			piece := e.Tok.Decode([]int{id}, false)
			if req.ReturnTokensAsTokenIDs {
				lp.Tokens = append(lp.Tokens, "token_id:"+strconv.Itoa(id))
			} else {
				lp.Tokens = append(lp.Tokens, piece)
			}
			lp.TextOffset = append(lp.TextOffset, off)
			off += len(piece)
		}
		ch.Logprobs = lp
	}
	writeJSON(w, 200, map[string]any{"id": fmt.Sprintf("cmpl-%x", mrand.Uint64()), "object": "text_completion", "created": time.Now().Unix(),
		"model": req.Model, "choices": []completionChoice{ch},
		"usage": map[string]int{"prompt_tokens": len(ids), "completion_tokens": len(g.Tokens), "total_tokens": len(ids) + len(g.Tokens)}})
	return nil
}

// trailingStop is 1 when a generation ended on a stop token (which the
// text leaves out), else 0.
func trailingStop(g engine.Generation, stops []int) int {
	if g.FinishReason == "stop" && len(g.Tokens) > 0 && slices.Contains(stops, g.Tokens[len(g.Tokens)-1]) {
		return 1
	}
	return 0
}

// completionPrompt reads prompt: token ids (each below the vocabulary
// size), a list holding one list of ids, or text.
func completionPrompt(raw json.RawMessage, encode func(string) []int, vocab int) ([]int, *apiError) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || string(raw) == "null" {
		return nil, errInvalid("prompt", "missing_parameter", "'prompt' must be token ids or text")
	}
	var text string
	if json.Unmarshal(raw, &text) == nil {
		if text == "" {
			return nil, errInvalid("prompt", "invalid_value", "the prompt is empty")
		}
		return encode(text), nil
	}
	var ids []int
	if err := json.Unmarshal(raw, &ids); err != nil {
		var batch [][]int
		if json.Unmarshal(raw, &batch) != nil || len(batch) != 1 {
			return nil, errInvalid("prompt", "invalid_type", "'prompt' must be a string, a list of token ids, or a list holding one list of ids")
		}
		ids = batch[0]
	}
	if len(ids) == 0 {
		return nil, errInvalid("prompt", "invalid_value", "the prompt has no tokens")
	}
	if i := slices.IndexFunc(ids, func(id int) bool { return id < 0 || id >= vocab }); i >= 0 {
		return nil, errInvalid(fmt.Sprintf("prompt[%d]", i), "invalid_value", fmt.Sprintf("token id %d is outside the vocabulary [0, %d)", ids[i], vocab))
	}
	return ids, nil
}
