package serve

// The request side of chat completions: decoding, validation and turning
// OpenAI messages into the agent's conversation.

import (
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"math"
	mrand "math/rand/v2"
	"net/http"
	"regexp"
	"slices"
	"strings"

	"github.com/agemem/agemem/model/chat"
)

// chatRequest is the subset of OpenAI's chat-completions request the server
// honours, plus session_id. Fields that would change what the server does
// in ways it cannot honour (client-side tools, n > 1, logprobs, stop) are
// refused with 400 rather than ignored.
type chatRequest struct {
	Model               string          `json:"model"`
	Messages            []chatMessage   `json:"messages"`
	Stream              bool            `json:"stream"`
	StreamOptions       *streamOptions  `json:"stream_options"`
	MaxTokens           *int            `json:"max_tokens"`
	MaxCompletionTokens *int            `json:"max_completion_tokens"`
	Temperature         *float64        `json:"temperature"`
	TopP                *float64        `json:"top_p"`
	Seed                *int64          `json:"seed"`
	N                   *int            `json:"n"`
	User                string          `json:"user"`
	SessionID           string          `json:"session_id"`
	Tools               json.RawMessage `json:"tools"`
	Functions           json.RawMessage `json:"functions"`
	Stop                json.RawMessage `json:"stop"`
	Logprobs            *bool           `json:"logprobs"`
}

type streamOptions struct {
	IncludeUsage bool `json:"include_usage"`
}

type chatMessage struct {
	Role    string          `json:"role"`
	Content json.RawMessage `json:"content"`
	Name    string          `json:"name,omitempty"`
}

// text is a message's content: a string, or an array of text parts.
func (m chatMessage) text() (string, error) {
	if len(m.Content) == 0 || string(m.Content) == "null" {
		return "", nil
	}
	var s string
	if err := json.Unmarshal(m.Content, &s); err == nil {
		return s, nil
	}
	var parts []struct {
		Type string `json:"type"`
		Text string `json:"text"`
	}
	if err := json.Unmarshal(m.Content, &parts); err != nil {
		return "", errors.New("content must be a string or an array of text parts")
	}
	var b strings.Builder
	for i, p := range parts {
		if p.Type != "text" {
			return "", fmt.Errorf("content part %d has type %q; only text is supported", i, p.Type)
		}
		b.WriteString(p.Text)
	}
	return b.String(), nil
}

func isSet(raw json.RawMessage) bool {
	s := strings.TrimSpace(string(raw))
	return s != "" && s != "null" && s != "[]" && s != `""`
}

var sessionRE = regexp.MustCompile(`^[A-Za-z0-9._:-]{1,128}$`)

// validate checks a request and returns its generation settings.
func (s *Server) validate(req *chatRequest) (Gen, *apiError) {
	sv := s.cfg
	var g Gen
	if req.Model == "" {
		return g, errInvalid("model", "missing_model", "model is required; this server serves "+fmt.Sprintf("%q", sv.ModelName))
	}
	if req.Model != sv.ModelName {
		return g, unknownModel(req.Model, sv.ModelName)
	}
	if len(req.Messages) == 0 {
		return g, errInvalid("messages", "missing_messages", "messages must hold at least one message")
	}
	if len(req.Messages) > sv.MaxMessages {
		return g, errInvalid("messages", "too_many_messages", fmt.Sprintf("%d messages exceed serve.max_messages (%d)", len(req.Messages), sv.MaxMessages))
	}
	if req.N != nil && *req.N != 1 {
		return g, errInvalid("n", "unsupported", "only n = 1 is supported")
	}
	for name, raw := range map[string]json.RawMessage{"tools": req.Tools, "functions": req.Functions, "stop": req.Stop} {
		if isSet(raw) {
			return g, errInvalid(name, "unsupported", name+" is not supported: the server runs its own memory tools and stops at the end of the answer")
		}
	}
	if req.Logprobs != nil && *req.Logprobs {
		return g, errInvalid("logprobs", "unsupported", "logprobs is not supported")
	}
	if req.SessionID != "" && !sessionRE.MatchString(req.SessionID) {
		return g, errInvalid("session_id", "invalid_session_id", "a session id is 1-128 letters, digits and . _ : -")
	}
	limit := sv.MaxTokens
	if limit == 0 {
		limit = s.agent.ResponseBudget
	}
	g.MaxTokens = limit
	for _, p := range []struct {
		name string
		v    *int
	}{{"max_tokens", req.MaxTokens}, {"max_completion_tokens", req.MaxCompletionTokens}} {
		if p.v == nil {
			continue
		}
		if *p.v < 1 || *p.v > limit {
			return g, errInvalid(p.name, "invalid_value", fmt.Sprintf("%s %d is outside [1, %d]", p.name, *p.v, limit))
		}
		g.MaxTokens = *p.v
	}
	g.Temperature, g.TopP = sv.Temperature, sv.TopP
	if t := req.Temperature; t != nil {
		if *t < 0 || *t > 2 || math.IsNaN(*t) {
			return g, errInvalid("temperature", "invalid_value", fmt.Sprintf("temperature %g is outside [0, 2]", *t))
		}
		g.Temperature = *t
	}
	if p := req.TopP; p != nil {
		if *p <= 0 || *p > 1 || math.IsNaN(*p) {
			return g, errInvalid("top_p", "invalid_value", fmt.Sprintf("top_p %g is outside (0, 1]", *p))
		}
		g.TopP = *p
	}
	g.Seed = mrand.Uint64()
	if req.Seed != nil {
		g.Seed = uint64(*req.Seed)
	}
	g.MaxPromptTokens = sv.MaxPromptTokens
	if g.MaxPromptTokens == 0 {
		g.MaxPromptTokens = s.agent.ContextBudget
	}
	return g, nil
}

// conversation splits the request's messages into extra system text and
// the turn messages, checking roles. A "developer" message counts as
// system, as in OpenAI's API.
func conversation(msgs []chatMessage) (system string, turn []chat.Message, aerr *apiError) {
	var sys []string
	for i, m := range msgs {
		text, err := m.text()
		if err != nil {
			return "", nil, errInvalid(fmt.Sprintf("messages[%d].content", i), "invalid_content", err.Error())
		}
		switch m.Role {
		case "system", "developer":
			sys = append(sys, text)
		case "user", "assistant":
			turn = append(turn, chat.Message{Role: m.Role, Content: text})
		default:
			return "", nil, errInvalid(fmt.Sprintf("messages[%d].role", i), "invalid_role",
				fmt.Sprintf("role %q is not system, developer, user or assistant (the server runs the tools itself)", m.Role))
		}
	}
	if len(turn) == 0 || turn[len(turn)-1].Role != "user" {
		return "", nil, errInvalid("messages", "last_not_user", "the last message must be the user's")
	}
	if strings.TrimSpace(turn[len(turn)-1].Content) == "" {
		return "", nil, errInvalid(fmt.Sprintf("messages[%d].content", len(msgs)-1), "empty_content", "the last user message is empty")
	}
	return strings.Join(sys, "\n\n"), turn, nil
}

// newTurn is what a session appends from a request: the messages after the
// last assistant message (clients that resend the whole history send the
// new turn last).
func newTurn(turn []chat.Message) []chat.Message {
	for i := len(turn) - 1; i >= 0; i-- {
		if turn[i].Role == "assistant" {
			return turn[i+1:]
		}
	}
	return turn
}

// knownParams are OpenAI's chat-completion parameters this server accepts:
// those chatRequest reads, and those that do not change what it returns
// (ignored). Any other top-level key is refused, as OpenAI refuses it.
var knownParams = map[string]bool{
	"model": true, "messages": true, "stream": true, "stream_options": true, "max_tokens": true, "max_completion_tokens": true,
	"temperature": true, "top_p": true, "seed": true, "n": true, "user": true, "session_id": true, "tools": true, "functions": true,
	"stop": true, "logprobs": true, "top_logprobs": true, "tool_choice": true, "function_call": true, "parallel_tool_calls": true,
	"presence_penalty": true, "frequency_penalty": true, "logit_bias": true, "response_format": true,
	"metadata": true, "store": true, "service_tier": true, "prompt_cache_key": true, "safety_identifier": true,
}

// messageKeys are the keys of an OpenAI chat message the server accepts:
// those it reads, and those an assistant message comes back with from
// OpenAI's clients (refusal is ignored; a tool call, function call or
// audio must be empty, as the server runs its own tools and speaks text).
// Any other key is refused, as OpenAI refuses it.
var messageKeys = map[string]bool{"role": true, "content": true, "name": true, "refusal": true, "tool_calls": true, "function_call": true, "audio": true}

// checkMessages refuses a message key the server would otherwise drop.
func checkMessages(raw json.RawMessage) *apiError {
	var msgs []map[string]json.RawMessage
	if json.Unmarshal(raw, &msgs) != nil {
		return nil // not an array of objects: the typed decoding says so
	}
	for i, m := range msgs {
		for _, k := range slices.Sorted(maps.Keys(m)) {
			param := fmt.Sprintf("messages[%d].%s", i, k)
			switch {
			case !messageKeys[k]:
				return errInvalid(param, "unknown_parameter", fmt.Sprintf("Unrecognized message field: %s (a message has role, content and name)", param))
			case (k == "tool_calls" || k == "function_call" || k == "audio") && isSet(m[k]):
				return errInvalid(param, "unsupported", param+" is not supported: the server runs its own memory tools and speaks text")
			}
		}
	}
	return nil
}

// decodeChat reads a chat request strictly: a JSON content type (or none),
// exactly one JSON object, only known parameters, in messages only known
// keys.
func decodeChat(r *http.Request, req *chatRequest) *apiError {
	var top map[string]json.RawMessage
	if aerr := decodeJSON(r, &top, false); aerr != nil {
		return aerr
	}
	for _, k := range slices.Sorted(maps.Keys(top)) {
		if !knownParams[k] {
			return errInvalid(k, "unknown_parameter", fmt.Sprintf("Unrecognized request argument supplied: %s", k))
		}
	}
	if aerr := checkMessages(top["messages"]); aerr != nil {
		return aerr
	}
	raw, _ := json.Marshal(top)
	if err := json.Unmarshal(raw, req); err != nil {
		return bodyError(err)
	}
	for _, p := range []struct {
		name string
		raw  json.RawMessage
	}{{"presence_penalty", top["presence_penalty"]}, {"frequency_penalty", top["frequency_penalty"]}} {
		if isSet(p.raw) && strings.TrimSpace(string(p.raw)) != "0" {
			return errInvalid(p.name, "unsupported", p.name+" is not supported")
		}
	}
	for _, name := range []string{"logit_bias", "top_logprobs", "tool_choice", "function_call"} {
		if v := strings.TrimSpace(string(top[name])); isSet(top[name]) && v != "{}" && v != `"none"` && v != `"auto"` && v != "0" {
			return errInvalid(name, "unsupported", name+" is not supported: the server runs its own memory tools")
		}
	}
	if rf := top["response_format"]; isSet(rf) {
		var f struct {
			Type string `json:"type"`
		}
		if json.Unmarshal(rf, &f) != nil || f.Type != "text" {
			return errInvalid("response_format", "unsupported", "only response_format {\"type\": \"text\"} is supported")
		}
	}
	return nil
}
