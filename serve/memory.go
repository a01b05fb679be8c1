package serve

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"

	"github.com/agemem/agemem/memtools/ltm"
)

// checkID checks a memory id's form.
func checkID(id string) *apiError {
	if !ltm.ValidID(id) {
		return errInvalid("memory_id", "invalid_memory_id", fmt.Sprintf("%q is not a memory id (mem_ and 8 lower-case hex digits)", id))
	}
	return nil
}

// store opens the namespace the request acts on.
func (s *Server) store(r *http.Request) (ltm.Store, string, *apiError) {
	ns, aerr := namespace(r, principalFrom(r.Context()))
	if aerr != nil {
		return nil, "", aerr
	}
	st, aerr := s.openStore(ns)
	return st, ns, aerr
}

// openStore opens ns with the server's memory list kept current by its
// writes (the console's list pages read it).
func (s *Server) openStore(ns string) (ltm.Store, *apiError) {
	st, err := s.db.Namespace(ns)
	if err != nil {
		return nil, errInvalid("namespace", "invalid_namespace", err.Error())
	}
	return s.lists.track(ns, st), nil
}

// storeError maps a store failure to its response. The details (the
// store's file, SQLite's message) go to the server's log, not the client.
func (s *Server) storeError(err error) *apiError {
	var bad *ltm.MetadataError
	switch {
	case errors.Is(err, ltm.ErrNotFound):
		return &apiError{Status: http.StatusNotFound, Type: "invalid_request_error", Code: "memory_not_found", Message: "no memory with that id in this namespace"}
	case errors.As(err, &bad):
		return errInvalid("metadata", "invalid_metadata", bad.Error())
	case errors.Is(err, ltm.ErrBusy):
		return &apiError{Status: http.StatusServiceUnavailable, Type: "server_error", Code: "store_busy",
			Message: "the memory store has too many writes waiting; retry shortly", retryAfter: 1}
	case errors.Is(err, context.DeadlineExceeded), errors.Is(err, context.Canceled):
		return contextError(err)
	case ltm.Unavailable(err):
		s.log.Warn("memory store unavailable", "err", err)
		return unavailable()
	}
	s.log.Error("memory store failed", "err", err)
	return &apiError{Status: http.StatusInternalServerError, Type: "server_error", Code: "store_error",
		Message: "the memory store failed; the server's log has the details"}
}

func (s *Server) embedOne(ctx context.Context, text string) ([]float32, *apiError) {
	v, err := s.enc.Embed(ctx, []string{text})
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
	id := r.PathValue("id")
	if aerr := checkID(id); aerr != nil {
		return aerr
	}
	e, err := st.Get(r.Context(), id)
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

// The memory operations below are the memory API's and the console's
// alike: one function each, checking the same things and writing the
// same audit line (msg "audit", op, namespace, memory_id, key, via), so a
// change made on a console page is the API's change.

// audit records a change to a namespace's memory.
func (s *Server) audit(ctx context.Context, op, ns, id, via string) {
	s.log.InfoContext(ctx, "audit", "op", op, "namespace", ns, "memory_id", id, "key", principalFrom(ctx).KeyID, "via", via)
}

func (s *Server) addEntry(ctx context.Context, ns, via string, in memoryWrite) (ltm.Entry, *apiError) {
	st, aerr := s.openStore(ns)
	if aerr != nil {
		return ltm.Entry{}, aerr
	}
	if strings.TrimSpace(in.Content) == "" {
		return ltm.Entry{}, errInvalid("content", "missing_content", "content must not be empty")
	}
	v, aerr := s.embedOne(ctx, in.Content)
	if aerr != nil {
		return ltm.Entry{}, aerr
	}
	e, err := st.Add(ctx, ltm.Entry{Content: in.Content, Embedding: v, Metadata: in.Metadata, MemoryType: in.MemoryType})
	if err != nil {
		return ltm.Entry{}, s.storeError(err)
	}
	s.audit(ctx, "memory.add", ns, e.ID, via)
	e.Embedding = nil
	return e, nil
}

func (s *Server) updateEntry(ctx context.Context, ns, id, via string, in memoryWrite) (ltm.Entry, *apiError) {
	st, aerr := s.openStore(ns)
	if aerr != nil {
		return ltm.Entry{}, aerr
	}
	if aerr := checkID(id); aerr != nil {
		return ltm.Entry{}, aerr
	}
	if in.MemoryType != "" {
		return ltm.Entry{}, errInvalid("memory_type", "immutable", "memory_type cannot be changed by an update")
	}
	if strings.TrimSpace(in.Content) == "" {
		return ltm.Entry{}, errInvalid("content", "missing_content", "content must not be empty")
	}
	v, aerr := s.embedOne(ctx, in.Content)
	if aerr != nil {
		return ltm.Entry{}, aerr
	}
	e, err := st.Update(ctx, id, in.Content, v, in.Metadata)
	if err != nil {
		return ltm.Entry{}, s.storeError(err)
	}
	s.audit(ctx, "memory.update", ns, id, via)
	e.Embedding = nil
	return e, nil
}

func (s *Server) deleteEntry(ctx context.Context, ns, id, via string) *apiError {
	st, aerr := s.openStore(ns)
	if aerr != nil {
		return aerr
	}
	if aerr := checkID(id); aerr != nil {
		return aerr
	}
	if err := st.Delete(ctx, id); err != nil {
		return s.storeError(err)
	}
	s.audit(ctx, "memory.delete", ns, id, via)
	return nil
}

// memorySearch is a search's body.
type memorySearch struct {
	Query    string         `json:"query"`
	TopK     int            `json:"top_k"`
	Metadata map[string]any `json:"metadata"`
}

func (s *Server) searchEntries(ctx context.Context, ns string, in memorySearch) ([]ltm.Scored, *apiError) {
	st, aerr := s.openStore(ns)
	if aerr != nil {
		return nil, aerr
	}
	if strings.TrimSpace(in.Query) == "" {
		return nil, errInvalid("query", "missing_query", "query must not be empty")
	}
	if in.TopK == 0 {
		in.TopK = s.tools.TopK
	}
	if in.TopK < 1 || in.TopK > s.tools.MaxTopK {
		return nil, errInvalid("top_k", "invalid_top_k", fmt.Sprintf("top_k %d is outside [1, %d] (tools.max_top_k)", in.TopK, s.tools.MaxTopK))
	}
	v, aerr := s.embedOne(ctx, in.Query)
	if aerr != nil {
		return nil, aerr
	}
	hits, err := st.Retrieve(ctx, v, in.TopK, in.Metadata)
	if err != nil {
		return nil, s.storeError(err)
	}
	for i := range hits {
		hits[i].Embedding = nil
	}
	if hits == nil {
		hits = []ltm.Scored{}
	}
	return hits, nil
}

// requestNamespace is the namespace an API request acts on.
func requestNamespace(r *http.Request) (string, *apiError) {
	return namespace(r, principalFrom(r.Context()))
}

func (s *Server) addMemory(w http.ResponseWriter, r *http.Request) *apiError {
	ns, aerr := requestNamespace(r)
	if aerr != nil {
		return aerr
	}
	var in memoryWrite
	if aerr := decodeBody(r, &in); aerr != nil {
		return aerr
	}
	e, aerr := s.addEntry(r.Context(), ns, "api", in)
	if aerr != nil {
		return aerr
	}
	writeJSON(w, http.StatusCreated, e)
	return nil
}

func (s *Server) updateMemory(w http.ResponseWriter, r *http.Request) *apiError {
	ns, aerr := requestNamespace(r)
	if aerr != nil {
		return aerr
	}
	if aerr := checkID(r.PathValue("id")); aerr != nil {
		return aerr
	}
	var in memoryWrite
	if aerr := decodeBody(r, &in); aerr != nil {
		return aerr
	}
	e, aerr := s.updateEntry(r.Context(), ns, r.PathValue("id"), "api", in)
	if aerr != nil {
		return aerr
	}
	writeJSON(w, 200, e)
	return nil
}

func (s *Server) deleteMemory(w http.ResponseWriter, r *http.Request) *apiError {
	ns, aerr := requestNamespace(r)
	if aerr != nil {
		return aerr
	}
	id := r.PathValue("id")
	// A retry under the key of an attempt that did not finish finds the
	// memory gone when that attempt deleted it: the answer is the one the
	// attempt would have given.
	if aerr := s.deleteEntry(r.Context(), ns, id, "api"); aerr != nil &&
		!(aerr.Code == "memory_not_found" && writeOf(r.Context()).unfinished) {
		return aerr
	}
	writeJSON(w, 200, map[string]any{"memory_id": id, "deleted": true})
	return nil
}

func (s *Server) searchMemories(w http.ResponseWriter, r *http.Request) *apiError {
	ns, aerr := requestNamespace(r)
	if aerr != nil {
		return aerr
	}
	var in memorySearch
	if aerr := decodeBody(r, &in); aerr != nil {
		return aerr
	}
	hits, aerr := s.searchEntries(r.Context(), ns, in)
	if aerr != nil {
		return aerr
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
	if aerr := mediaType(r, jsonlTypes...); aerr != nil {
		return aerr
	}
	recs, err := ltm.ReadJSONL(r.Body, "body")
	if re := (*ltm.ReadError)(nil); errors.As(err, &re) {
		return readError(re.Err)
	}
	if err != nil {
		return errInvalid("", "invalid_jsonl", err.Error())
	}
	entries := make([]ltm.Entry, len(recs))
	for i, rec := range recs {
		v, aerr := s.embedOne(r.Context(), rec.Content)
		if aerr != nil {
			return aerr
		}
		entries[i] = rec.Entry()
		entries[i].Embedding = v
	}
	added, replaced, err := s.db.Import(r.Context(), ns, entries)
	s.lists.forget(ns)
	if err != nil {
		return s.storeError(err)
	}
	s.audit(r.Context(), "memory.import", ns, "", "api")
	writeJSON(w, 200, map[string]any{"namespace": ns, "imported": len(entries), "added": added, "replaced": replaced})
	return nil
}

// jsonlTypes are the media types an import is sent as: JSON Lines' and
// NDJSON's names, and plain JSON's.
var jsonlTypes = []string{"application/jsonl", "application/x-ndjson", "application/x-jsonlines", "application/json"}

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
