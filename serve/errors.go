package serve

import (
	"encoding/json"
	"net/http"
)

// apiError is an error response in OpenAI's shape:
// {"error": {"message", "type", "param", "code"}}.
type apiError struct {
	Status  int    `json:"-"`
	Message string `json:"message"`
	Type    string `json:"type"`
	Param   string `json:"param,omitempty"`
	Code    string `json:"code,omitempty"`
	// Trace is the agent loop's record where the model's output was the
	// problem (extension field).
	Trace any `json:"agemem,omitempty"`
	// retryAfter is the Retry-After of a 429 or 503, in seconds (0: 1).
	retryAfter int
	// cause is the internal error behind a 5xx, logged and never sent.
	cause error
}

func (e *apiError) Error() string { return e.Message }

func errInvalid(param, code, msg string) *apiError {
	return &apiError{Status: http.StatusBadRequest, Type: "invalid_request_error", Param: param, Code: code, Message: msg}
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	enc := json.NewEncoder(w)
	enc.SetEscapeHTML(false)
	enc.Encode(v)
}

func writeError(w http.ResponseWriter, e *apiError) {
	if e.Status == http.StatusUnauthorized {
		w.Header().Set("WWW-Authenticate", `Bearer realm="agemem"`)
	}
	if e.Status == http.StatusTooManyRequests || e.Status == http.StatusServiceUnavailable {
		w.Header().Set("Retry-After", retryAfterHeader(e))
	}
	writeJSON(w, e.Status, map[string]*apiError{"error": e})
}
