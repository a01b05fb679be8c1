package serve

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"math"
	mrand "math/rand/v2"
	"mime"
	"net/http"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/agemem/agemem/memtools"
	"github.com/agemem/agemem/memtools/ltm"
	"github.com/agemem/agemem/memtools/stm"
	"github.com/agemem/agemem/model/decode"
	"github.com/agemem/agemem/ollama"
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

// chatResponse is a chat.completion object; AgeMem adds the agent loop's
// trace under "agemem".
type chatResponse struct {
	ID      string       `json:"id"`
	Object  string       `json:"object"`
	Created int64        `json:"created"`
	Model   string       `json:"model"`
	Choices []chatChoice `json:"choices"`
	Usage   *usage       `json:"usage,omitempty"`
	AgeMem  *traceInfo   `json:"agemem,omitempty"`
}

type chatChoice struct {
	Index        int         `json:"index"`
	Message      *outMessage `json:"message,omitempty"`
	Delta        *outMessage `json:"delta,omitempty"`
	FinishReason *string     `json:"finish_reason"`
}

type outMessage struct {
	Role    string  `json:"role,omitempty"`
	Content *string `json:"content,omitempty"`
}

type usage struct {
	PromptTokens     int `json:"prompt_tokens"`
	CompletionTokens int `json:"completion_tokens"`
	TotalTokens      int `json:"total_tokens"`
}

// traceInfo is the extension field: what the agent loop did.
type traceInfo struct {
	SessionID string `json:"session_id,omitempty"`
	// SessionReset says why the session named started empty: "expired"
	// (session_ttl) or "evicted" (max_sessions, max_sessions_per_namespace).
	SessionReset  string      `json:"session_reset,omitempty"`
	Namespace     string      `json:"namespace"`
	Steps         []traceStep `json:"steps"`
	ContextTokens int         `json:"context_tokens"`
}

type traceStep struct {
	Response     string      `json:"response"`
	ToolCalls    []traceCall `json:"tool_calls,omitempty"`
	FormatErrors []string    `json:"format_errors,omitempty"`
}

type traceCall struct {
	Name      string          `json:"name"`
	Arguments json.RawMessage `json:"arguments,omitempty"`
	OK        bool            `json:"ok"`
	Result    string          `json:"result"`
}

func newID(prefix string) string {
	var b [12]byte
	rand.Read(b[:])
	return prefix + hex.EncodeToString(b[:])
}

func (s *Server) models(w http.ResponseWriter, _ *http.Request) *apiError {
	writeJSON(w, 200, map[string]any{"object": "list", "data": []any{s.modelObject()}})
	return nil
}

func (s *Server) model(w http.ResponseWriter, r *http.Request) *apiError {
	if r.PathValue("model") != s.cfg.ModelName {
		return unknownModel(r.PathValue("model"), s.cfg.ModelName)
	}
	writeJSON(w, 200, s.modelObject())
	return nil
}

func (s *Server) modelObject() map[string]any {
	return map[string]any{"id": s.cfg.ModelName, "object": "model", "created": s.created, "owned_by": "agemem"}
}

func unknownModel(got, want string) *apiError {
	return &apiError{Status: http.StatusNotFound, Type: "invalid_request_error", Param: "model", Code: "model_not_found",
		Message: fmt.Sprintf("the model %q does not exist; this server serves %q", got, want)}
}

func (s *Server) deleteSession(w http.ResponseWriter, r *http.Request) *apiError {
	p := principalFrom(r.Context())
	ns, aerr := namespace(r, p)
	if aerr != nil {
		return aerr
	}
	if !s.sessions.drop(ns, r.PathValue("id")) {
		return &apiError{Status: http.StatusNotFound, Type: "invalid_request_error", Code: "session_not_found", Message: "no such session"}
	}
	writeJSON(w, 200, map[string]any{"session_id": r.PathValue("id"), "deleted": true})
	return nil
}

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
func conversation(msgs []chatMessage) (system string, turn []stm.Message, aerr *apiError) {
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
			turn = append(turn, stm.Message{Role: m.Role, Content: text})
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
func newTurn(turn []stm.Message) []stm.Message {
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

// decodeChat reads a chat request strictly: a JSON content type (or none),
// exactly one JSON object, only known parameters.
func decodeChat(r *http.Request, req *chatRequest) *apiError {
	if ct := r.Header.Get("Content-Type"); ct != "" {
		if mt, _, err := mime.ParseMediaType(ct); err != nil || mt != "application/json" {
			return &apiError{Status: http.StatusUnsupportedMediaType, Type: "invalid_request_error", Code: "unsupported_media_type",
				Message: fmt.Sprintf("Content-Type %q: send application/json", ct)}
		}
	}
	var top map[string]json.RawMessage
	if aerr := decodeJSON(r, &top, false); aerr != nil {
		return aerr
	}
	for _, k := range slices.Sorted(maps.Keys(top)) {
		if !knownParams[k] {
			return errInvalid(k, "unknown_parameter", fmt.Sprintf("Unrecognized request argument supplied: %s", k))
		}
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

func (s *Server) chat(w http.ResponseWriter, r *http.Request) *apiError {
	var req chatRequest
	if aerr := decodeChat(r, &req); aerr != nil {
		return aerr
	}
	g, aerr := s.validate(&req)
	if aerr != nil {
		return aerr
	}
	extra, turn, aerr := conversation(req.Messages)
	if aerr != nil {
		return aerr
	}
	if id := r.Header.Get("X-Session-ID"); id != "" && req.SessionID == "" {
		if !sessionRE.MatchString(id) {
			return errInvalid("X-Session-ID", "invalid_session_id", "a session id is 1-128 letters, digits and . _ : -")
		}
		req.SessionID = id
	}
	st, ns, aerr := s.store(r)
	if aerr != nil {
		return aerr
	}
	release, aerr := s.admit.acquire(r.Context(), principalFrom(r.Context()).KeyID)
	if aerr != nil {
		return aerr
	}
	defer release()

	// The context this request runs on: a session's (copied, and kept only
	// if the request succeeds) or a fresh one from the messages.
	var sess *session
	var cctx *stm.Context
	var reset string
	if req.SessionID != "" {
		sess, reset = s.sessions.get(ns, req.SessionID)
		sess.mu.Lock()
		defer func() {
			sess.mu.Unlock()
			s.sessions.done(ns, req.SessionID, sess)
		}()
		if sess.ctx != nil {
			cctx = sess.ctx.Clone()
			cctx.Append(newTurn(turn)...)
		}
	}
	if cctx == nil {
		cctx = stm.New(s.be)
		sys := s.system
		if extra != "" {
			sys += "\n\n" + extra
		}
		cctx.Append(stm.Message{Role: stm.System, Content: sys})
		cctx.Append(turn...)
	}
	if cctx.Tokens() > g.MaxPromptTokens {
		return errInvalid("messages", "context_length_exceeded",
			fmt.Sprintf("the context is %d tokens, above the limit of %d", cctx.Tokens(), g.MaxPromptTokens))
	}
	if n := s.be.ContextLength(); n > 0 && cctx.Tokens()+g.MaxTokens > n {
		return errInvalid("messages", "context_length_exceeded",
			fmt.Sprintf("this model's maximum context length is %d tokens; the messages hold %d and the response may take %d (max_tokens)", n, cctx.Tokens(), g.MaxTokens))
	}
	rt := &memtools.Runtime{Store: st, Context: cctx, Embedder: s.enc, Summarizer: s.summarizer(), Options: s.tools}
	lim := s.agent.Limits()
	info := &traceInfo{SessionID: req.SessionID, SessionReset: reset, Namespace: ns}
	if req.SessionID != "" {
		w.Header().Set("X-Session-ID", req.SessionID)
	}
	resp := chatResponse{ID: newID("chatcmpl-"), Object: "chat.completion", Created: time.Now().Unix(), Model: s.cfg.ModelName}

	var tr memtools.Trace
	var err error
	var stream *sseStream
	if req.Stream {
		stream = newSSEStream(w, resp, req.StreamOptions != nil && req.StreamOptions.IncludeUsage)
		// Every path out of this handler ends the stream's writer: a
		// request that fails before any answer text (a 422, a client gone)
		// used to leave it waiting forever.
		defer stream.stop()
		g.Progress = stream.progress
		pol := &stepPolicy{inner: s.be.Policy(g), stream: stream}
		tr, err = memtools.Run(r.Context(), pol, rt, lim)
	} else {
		tr, err = memtools.Run(r.Context(), s.be.Policy(g), rt, lim)
	}
	s.account(tr)
	info.Steps, info.ContextTokens = steps(tr), cctx.Tokens()
	u := usageOf(tr)
	aerr = outcome(tr, err)
	if aerr == nil && stream != nil {
		aerr = stream.finish(tr)
	}
	if aerr != nil {
		if aerr.Status == http.StatusUnprocessableEntity {
			aerr.Trace = info
		}
		if stream != nil && stream.started() {
			stream.fail(aerr)
			return nil
		}
		return aerr
	}
	if sess != nil {
		sess.ctx = cctx
	}
	finish := "stop"
	if !tr.HasAnswer {
		finish = "length"
	}
	if stream != nil {
		stream.end(finish, u, info)
		return nil
	}
	content := tr.Answer
	resp.Choices = []chatChoice{{Message: &outMessage{Role: "assistant", Content: &content}, FinishReason: &finish}}
	resp.Usage, resp.AgeMem = &u, info
	writeJSON(w, 200, resp)
	return nil
}

// outcome maps the end of an agent loop to an error response, or nil. A
// loop that ends without an answer after format errors is the model's
// failure to follow the tool format: 422 with the trace. One that used up
// agent.max_steps on well-formed tool calls answers with finish_reason
// "length", as a response cut by max_tokens does.
func outcome(tr memtools.Trace, err error) *apiError {
	var tooLong *decode.PromptTooLongError
	switch {
	case err == nil && !tr.HasAnswer && tr.FormatErrors > 0:
		return &apiError{Status: http.StatusUnprocessableEntity, Type: "invalid_model_output", Code: "tool_format_error",
			Message: fmt.Sprintf("the model broke the response format in %d of %d steps and gave no answer", tr.FormatErrors, len(tr.Steps))}
	case err == nil:
		return nil
	case errors.As(err, &tooLong):
		return errInvalid("messages", "context_length_exceeded", "the agent loop's context grew past the model's limit: "+tooLong.Error())
	case errors.Is(err, ollama.ErrContextTooLong):
		return errInvalid("messages", "context_length_exceeded", "the agent loop's context grew past the model's limit: "+err.Error())
	case errors.Is(err, ollama.ErrUnreachable), errors.Is(err, ollama.ErrModelNotFound):
		return &apiError{Status: http.StatusBadGateway, Type: "server_error", Code: "backend_unavailable", Message: err.Error()}
	case errors.Is(err, context.DeadlineExceeded), errors.Is(err, context.Canceled):
		return contextError(err)
	case errors.Is(err, errAnswerCut):
		return &apiError{Status: http.StatusUnprocessableEntity, Type: "invalid_model_output", Code: "answer_cut",
			Message: "the model started an answer it did not finish (the response budget ran out or the format broke)"}
	case errors.Is(err, ltm.ErrBusy):
		return &apiError{Status: http.StatusServiceUnavailable, Type: "server_error", Code: "store_busy",
			Message: "the memory store has too many writes waiting; retry shortly", retryAfter: 1}
	}
	// The cause may name files and internals: it goes to the log only.
	return &apiError{Status: http.StatusInternalServerError, Type: "server_error", Code: "agent_error",
		Message: "the agent loop failed; the server's log has the details", cause: err}
}

func (s *Server) summarizer() memtools.Summarizer {
	if s.sum != nil {
		return s.sum
	}
	return memtools.Extractive{MaxTokens: s.tools.SummaryMaxTokens, Tokenizer: s.be}
}

func (s *Server) account(tr memtools.Trace) {
	u := usageOf(tr)
	s.metrics.tokens.WithLabelValues("prompt").Add(float64(u.PromptTokens))
	s.metrics.tokens.WithLabelValues("completion").Add(float64(u.CompletionTokens))
	for _, st := range tr.Steps {
		for _, r := range st.Results {
			s.metrics.toolCalls.WithLabelValues(r.Name, fmt.Sprint(r.OK)).Inc()
		}
	}
}

func usageOf(tr memtools.Trace) usage {
	var u usage
	for _, st := range tr.Steps {
		u.PromptTokens += st.Completion.PromptTokens
		u.CompletionTokens += st.Completion.CompletionTokens
	}
	u.TotalTokens = u.PromptTokens + u.CompletionTokens
	return u
}

func steps(tr memtools.Trace) []traceStep {
	out := make([]traceStep, len(tr.Steps))
	for i, st := range tr.Steps {
		out[i] = traceStep{Response: st.Completion.Text, FormatErrors: st.Parsed.Errors}
		for j, c := range st.Parsed.Calls {
			tc := traceCall{Name: c.Name, Arguments: c.Arguments}
			if j < len(st.Results) {
				tc.OK, tc.Result = st.Results[j].OK, st.Results[j].Content
			}
			out[i].ToolCalls = append(out[i].ToolCalls, tc)
		}
	}
	return out
}
