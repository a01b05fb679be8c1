package serve

// Reading a request's body. Every way a body can be wrong is a named 4xx:
// a media type that is not the endpoint's (415), too large (413), not
// arrived within serve.read_timeout (408), cut short of its
// Content-Length (400 incomplete_body), text that is not Unicode (400
// invalid_utf8, naming the field), not JSON or not this endpoint's JSON
// (400, naming the field). net/http's read errors name both socket
// addresses, so none is passed on.

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"

	"github.com/agemem/agemem/internal/jsonerr"
)

// mediaType refuses a request whose Content-Type is set and not one of
// accepted (no Content-Type is taken as the endpoint's own).
func mediaType(r *http.Request, accepted ...string) *apiError {
	ct := r.Header.Get("Content-Type")
	if ct == "" {
		return nil
	}
	if mt, _, err := mime.ParseMediaType(ct); err == nil && slices.Contains(accepted, mt) {
		return nil
	}
	return &apiError{Status: http.StatusUnsupportedMediaType, Type: "invalid_request_error", Code: "unsupported_media_type",
		Message: fmt.Sprintf("Content-Type %q: send %s", ct, strings.Join(accepted, " or "))}
}

// readBody reads the whole body, bounded by serve.max_body_bytes.
func readBody(r *http.Request) ([]byte, *apiError) {
	raw, err := io.ReadAll(r.Body)
	if err != nil {
		return nil, readError(err)
	}
	return raw, nil
}

// readError is the response to a body that could not be read.
func readError(err error) *apiError {
	var tooBig *http.MaxBytesError
	var ne net.Error
	switch {
	case errors.As(err, &tooBig):
		return &apiError{Status: http.StatusRequestEntityTooLarge, Type: "invalid_request_error", Code: "body_too_large",
			Message: fmt.Sprintf("the body exceeds serve.max_body_bytes (%d bytes); nothing was done", tooBig.Limit)}
	case errors.As(err, &ne) && ne.Timeout():
		return &apiError{Status: http.StatusRequestTimeout, Type: "invalid_request_error", Code: "body_timeout",
			Message: "the body did not arrive within serve.read_timeout; nothing was done"}
	case errors.Is(err, io.ErrUnexpectedEOF):
		return errInvalid("", "incomplete_body", "the body ended before its declared length (Content-Length); nothing was done")
	}
	return errInvalid("", "unreadable_body", "the body could not be read; nothing was done")
}

// decodeBody reads a JSON object strictly: unknown fields, trailing data
// and an oversized body are errors that say what is wrong.
func decodeBody(r *http.Request, v any) *apiError { return decodeJSON(r, v, true) }

// decodeJSON reads exactly one JSON value from the body: anything after it
// but white space is an error.
func decodeJSON(r *http.Request, v any, strict bool) *apiError {
	if aerr := mediaType(r, "application/json"); aerr != nil {
		return aerr
	}
	raw, aerr := readBody(r)
	if aerr != nil {
		return aerr
	}
	if path, bad := jsonerr.BadText(raw); bad {
		return badText(path)
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	if strict {
		dec.DisallowUnknownFields()
	}
	if err := dec.Decode(v); err != nil {
		return bodyError(err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return errInvalid("", "invalid_json", "the body holds data after its JSON value (one JSON value per request)")
	}
	return nil
}

func badText(path string) *apiError {
	what := "the body"
	if path != "" {
		what = path
	}
	return errInvalid(path, "invalid_utf8", what+" holds text that is not UTF-8 (or an escape of half a surrogate pair): send Unicode text")
}

// bodyError is the response to a body that is not this endpoint's JSON.
func bodyError(err error) *apiError {
	var syntax *json.SyntaxError
	switch {
	case errors.Is(err, io.EOF):
		return errInvalid("", "invalid_json", "the body is empty; send a JSON object")
	case errors.Is(err, io.ErrUnexpectedEOF):
		return errInvalid("", "invalid_json", "the body is not valid JSON: it ends inside a value")
	case errors.As(err, &syntax):
		return errInvalid("", "invalid_json", fmt.Sprintf("the body is not valid JSON: %s (at byte %d)", syntax, syntax.Offset))
	}
	if f, ok := strings.CutPrefix(err.Error(), "json: unknown field "); ok {
		name, _ := strconv.Unquote(f)
		return errInvalid(name, "unknown_parameter", fmt.Sprintf("unknown parameter %s", f))
	}
	if field, msg, ok := jsonerr.Type(err); ok {
		return errInvalid(field, "invalid_type", msg)
	}
	return errInvalid("", "invalid_json", "the body is not valid JSON for this endpoint")
}
