package serve

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/agemem/agemem/llm"
	"github.com/agemem/agemem/llm/ollama"
	"github.com/agemem/agemem/memtools"
	"github.com/agemem/agemem/memtools/ltm"
	"github.com/agemem/agemem/memtools/stm"
	"github.com/agemem/agemem/model/chat"
)

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
		cctx.Append(chat.Message{Role: stm.System, Content: sys})
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
	g.Namespace = ns
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
		pol := &stepPolicy{inner: requestModel{s.be, g}, stream: stream}
		tr, err = memtools.Run(r.Context(), pol, rt, lim)
	} else {
		tr, err = memtools.Run(r.Context(), requestModel{s.be, g}, rt, lim)
	}
	s.account(tr)
	info.Steps, info.ContextTokens = steps(tr), cctx.Tokens()
	u := usageOf(tr)
	aerr = outcome(tr, err)
	s.journal.record(ns, req.SessionID, resp.ID, turn, tr, cctx.Tokens(), aerr)
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
	var tooLong *llm.PromptTooLongError
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
		u.PromptTokens += st.Response.PromptTokens
		u.CompletionTokens += st.Response.CompletionTokens
	}
	u.TotalTokens = u.PromptTokens + u.CompletionTokens
	return u
}

func steps(tr memtools.Trace) []traceStep {
	out := make([]traceStep, len(tr.Steps))
	for i, st := range tr.Steps {
		out[i] = traceStep{Response: st.Response.Message.Content, FormatErrors: st.Parsed.Errors}
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
