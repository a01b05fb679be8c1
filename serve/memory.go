package serve

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"

	"github.com/agemem/agemem/internal/jsonerr"
	"github.com/agemem/agemem/memtools/ltm"
)

// store opens the namespace the request acts on.
func (s *Server) store(r *http.Request) (ltm.Store, string, *apiError) {
	ns, aerr := namespace(r, principalFrom(r.Context()))
	if aerr != nil {
		return nil, "", aerr
	}
	st, err := s.db.Namespace(ns)
	if err != nil {
		return nil, "", errInvalid("namespace", "invalid_namespace", err.Error())
	}
	return st, ns, nil
}

// decodeBody reads a JSON object strictly: unknown fields, trailing data
// and an oversized body are errors that say what is wrong.
func decodeBody(r *http.Request, v any) *apiError { return decodeJSON(r, v, true) }

// decodeJSON reads exactly one JSON value from the body: anything after it
// but white space is an error.
func decodeJSON(r *http.Request, v any, strict bool) *apiError {
	dec := json.NewDecoder(r.Body)
	if strict {
		dec.DisallowUnknownFields()
	}
	if err := dec.Decode(v); err != nil {
		return bodyError(err)
	}
	if _, err := dec.Token(); err != io.EOF {
		var tooBig *http.MaxBytesError
		if errors.As(err, &tooBig) {
			return bodyError(err)
		}
		return errInvalid("", "invalid_json", "the body holds more than one JSON value, or data after it")
	}
	return nil
}

func bodyError(err error) *apiError {
	var tooBig *http.MaxBytesError
	if errors.As(err, &tooBig) {
		return &apiError{Status: http.StatusRequestEntityTooLarge, Type: "invalid_request_error", Code: "body_too_large",
			Message: fmt.Sprintf("the body exceeds serve.max_body_bytes (%d bytes)", tooBig.Limit)}
	}
	if errors.Is(err, io.EOF) {
		return errInvalid("", "invalid_json", "the body is empty; send a JSON object")
	}
	if f, ok := strings.CutPrefix(err.Error(), "json: unknown field "); ok {
		name, _ := strconv.Unquote(f)
		return errInvalid(name, "unknown_parameter", fmt.Sprintf("unknown parameter %s", f))
	}
	if field, msg, ok := jsonerr.Type(err); ok {
		return errInvalid(field, "invalid_type", msg)
	}
	return errInvalid("", "invalid_json", "the body is not valid JSON for this endpoint: "+err.Error())
}

// storeError maps a store failure to its response. The details (the
// store's file, SQLite's message) go to the server's log, not the client.
func (s *Server) storeError(err error) *apiError {
	switch {
	case errors.Is(err, ltm.ErrNotFound):
		return &apiError{Status: http.StatusNotFound, Type: "invalid_request_error", Code: "memory_not_found", Message: "no memory with that id in this namespace"}
	case errors.Is(err, ltm.ErrBusy):
		return &apiError{Status: http.StatusServiceUnavailable, Type: "server_error", Code: "store_busy",
			Message: "the memory store has too many writes waiting; retry shortly", retryAfter: 1}
	case errors.Is(err, context.DeadlineExceeded), errors.Is(err, context.Canceled):
		return contextError(err)
	}
	s.log.Error("memory store failed", "err", err)
	return &apiError{Status: http.StatusInternalServerError, Type: "server_error", Code: "store_error",
		Message: "the memory store failed; the server's log has the details"}
}

func (s *Server) embedOne(r *http.Request, text string) ([]float32, *apiError) {
	v, err := s.enc.Embed(r.Context(), []string{text})
	if err != nil {
		return nil, &apiError{Status: http.StatusInternalServerError, Type: "server_error", Code: "embed_error", Message: err.Error()}
	}
	return v[0], nil
}

func noEmbeddings(es []ltm.Entry) []ltm.Entry {
	for i := range es {
		es[i].Embedding = nil
	}
	if es == nil {
		es = []ltm.Entry{}
	}
	return es
}

// listAll is every memory of the request's namespace, oldest first.
func (s *Server) listAll(r *http.Request) ([]ltm.Entry, string, *apiError) {
	st, ns, aerr := s.store(r)
	if aerr != nil {
		return nil, "", aerr
	}
	all, err := st.List(r.Context())
	if err != nil {
		return nil, "", s.storeError(err)
	}
	return all, ns, nil
}

func (s *Server) listMemories(w http.ResponseWriter, r *http.Request) *apiError {
	all, ns, aerr := s.listAll(r)
	if aerr != nil {
		return aerr
	}
	writeJSON(w, 200, map[string]any{"object": "list", "namespace": ns, "data": noEmbeddings(all)})
	return nil
}

func (s *Server) getMemory(w http.ResponseWriter, r *http.Request) *apiError {
	st, _, aerr := s.store(r)
	if aerr != nil {
		return aerr
	}
	e, err := st.Get(r.Context(), r.PathValue("id"))
	if err != nil {
		return s.storeError(err)
	}
	e.Embedding = nil
	writeJSON(w, 200, e)
	return nil
}

type memoryWrite struct {
	Content    string         `json:"content"`
	Metadata   map[string]any `json:"metadata"`
	MemoryType string         `json:"memory_type"`
}

func (s *Server) addMemory(w http.ResponseWriter, r *http.Request) *apiError {
	st, _, aerr := s.store(r)
	if aerr != nil {
		return aerr
	}
	var in memoryWrite
	if aerr := decodeBody(r, &in); aerr != nil {
		return aerr
	}
	if strings.TrimSpace(in.Content) == "" {
		return errInvalid("content", "missing_content", "content must not be empty")
	}
	v, aerr := s.embedOne(r, in.Content)
	if aerr != nil {
		return aerr
	}
	e, err := st.Add(r.Context(), ltm.Entry{Content: in.Content, Embedding: v, Metadata: in.Metadata, MemoryType: in.MemoryType})
	if err != nil {
		return s.storeError(err)
	}
	e.Embedding = nil
	writeJSON(w, http.StatusCreated, e)
	return nil
}

func (s *Server) updateMemory(w http.ResponseWriter, r *http.Request) *apiError {
	st, _, aerr := s.store(r)
	if aerr != nil {
		return aerr
	}
	var in memoryWrite
	if aerr := decodeBody(r, &in); aerr != nil {
		return aerr
	}
	if in.MemoryType != "" {
		return errInvalid("memory_type", "immutable", "memory_type cannot be changed by an update")
	}
	if strings.TrimSpace(in.Content) == "" {
		return errInvalid("content", "missing_content", "content must not be empty")
	}
	v, aerr := s.embedOne(r, in.Content)
	if aerr != nil {
		return aerr
	}
	e, err := st.Update(r.Context(), r.PathValue("id"), in.Content, v, in.Metadata)
	if err != nil {
		return s.storeError(err)
	}
	e.Embedding = nil
	writeJSON(w, 200, e)
	return nil
}

func (s *Server) deleteMemory(w http.ResponseWriter, r *http.Request) *apiError {
	st, _, aerr := s.store(r)
	if aerr != nil {
		return aerr
	}
	id := r.PathValue("id")
	if err := st.Delete(r.Context(), id); err != nil {
		return s.storeError(err)
	}
	writeJSON(w, 200, map[string]any{"memory_id": id, "deleted": true})
	return nil
}

func (s *Server) searchMemories(w http.ResponseWriter, r *http.Request) *apiError {
	st, _, aerr := s.store(r)
	if aerr != nil {
		return aerr
	}
	var in struct {
		Query    string         `json:"query"`
		TopK     int            `json:"top_k"`
		Metadata map[string]any `json:"metadata"`
	}
	if aerr := decodeBody(r, &in); aerr != nil {
		return aerr
	}
	if strings.TrimSpace(in.Query) == "" {
		return errInvalid("query", "missing_query", "query must not be empty")
	}
	if in.TopK == 0 {
		in.TopK = s.tools.TopK
	}
	if in.TopK < 1 || in.TopK > s.tools.MaxTopK {
		return errInvalid("top_k", "invalid_top_k", fmt.Sprintf("top_k %d is outside [1, %d] (tools.max_top_k)", in.TopK, s.tools.MaxTopK))
	}
	v, aerr := s.embedOne(r, in.Query)
	if aerr != nil {
		return aerr
	}
	hits, err := st.Retrieve(r.Context(), v, in.TopK, in.Metadata)
	if err != nil {
		return s.storeError(err)
	}
	for i := range hits {
		hits[i].Embedding = nil
	}
	if hits == nil {
		hits = []ltm.Scored{}
	}
	writeJSON(w, 200, map[string]any{"object": "list", "data": hits})
	return nil
}

func (s *Server) exportMemories(w http.ResponseWriter, r *http.Request) *apiError {
	all, _, aerr := s.listAll(r)
	if aerr != nil {
		return aerr
	}
	w.Header().Set("Content-Type", "application/x-ndjson")
	ltm.WriteJSONL(w, all)
	return nil
}

// importMemories adds the memories of a JSONL export in one transaction:
// the whole body is read and every line checked and embedded before
// anything is written, and then all lines are written or none (a client
// gone mid-body writes nothing). Lines keep their memory_id, replacing the
// namespace's entry of that id, so retrying an import is safe.
func (s *Server) importMemories(w http.ResponseWriter, r *http.Request) *apiError {
	_, ns, aerr := s.store(r)
	if aerr != nil {
		return aerr
	}
	recs, err := ltm.ReadJSONL(r.Body, "body")
	if err != nil {
		var tooBig *http.MaxBytesError
		if errors.As(err, &tooBig) {
			return bodyError(err)
		}
		if errors.Is(err, io.ErrUnexpectedEOF) || r.Context().Err() != nil {
			return errInvalid("", "incomplete_body", "the body ended before its declared length; nothing was imported")
		}
		return errInvalid("", "invalid_jsonl", err.Error())
	}
	entries := make([]ltm.Entry, len(recs))
	for i, rec := range recs {
		v, aerr := s.embedOne(r, rec.Content)
		if aerr != nil {
			return aerr
		}
		entries[i] = rec.Entry()
		entries[i].Embedding = v
	}
	added, replaced, err := s.db.Import(r.Context(), ns, entries)
	if err != nil {
		return s.storeError(err)
	}
	writeJSON(w, 200, map[string]any{"namespace": ns, "imported": len(entries), "added": added, "replaced": replaced})
	return nil
}

func (s *Server) namespaces(w http.ResponseWriter, r *http.Request) *apiError {
	if !principalFrom(r.Context()).Admin && len(s.keys.keys) > 0 {
		return &apiError{Status: http.StatusForbidden, Type: "permission_error", Code: "admin_only", Message: "listing namespaces needs an admin key"}
	}
	ns, err := s.db.Namespaces(r.Context())
	if err != nil {
		return s.storeError(err)
	}
	if ns == nil {
		ns = []string{}
	}
	writeJSON(w, 200, map[string]any{"object": "list", "data": ns})
	return nil
}
