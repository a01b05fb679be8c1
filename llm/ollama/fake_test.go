package ollama

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"hash/fnv"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/ollama/ollama/api"
)

// fake is an in-process server that speaks the parts of Ollama's HTTP API
// the package uses, with Ollama's status codes and error bodies: NDJSON
// streams ending in a done record with metrics, 404 for a missing model,
// 400 for a prompt over the context, blob digests checked on upload.
type fake struct {
	t      *testing.T
	models map[string]bool
	// reply is the next assistant turn: chunks of text, thinking, tool
	// calls, and the done reason.
	mu        sync.Mutex
	replies   []reply
	generates []api.GenerateRequest
	chats     []api.ChatRequest
	embeds    []api.EmbedRequest
	creates   []api.CreateRequest
	blobs     map[string][]byte
	ctxLimit  int // prompt characters beyond which generate/chat fail
	dim       int
	cutStream bool // end a stream without its done record
	arch      string
	ctxLen    int
}

type reply struct {
	thinking string
	chunks   []string
	calls    []api.ToolCall
	reason   string
}

func newFake(t *testing.T, models ...string) (*fake, *httptest.Server) {
	f := &fake{t: t, models: map[string]bool{}, blobs: map[string][]byte{}, dim: 8, ctxLimit: 1 << 20}
	for _, m := range models {
		f.models[m] = true
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /api/version", func(w http.ResponseWriter, r *http.Request) {
		json.NewEncoder(w).Encode(map[string]string{"version": "0.17.4"})
	})
	mux.HandleFunc("POST /api/show", func(w http.ResponseWriter, r *http.Request) {
		var req api.ShowRequest
		if !f.decode(w, r, &req) || !f.known(w, req.Model) {
			return
		}
		// A model created here shows its template; others a plain one.
		tmpl := "{{ .Prompt }}"
		f.mu.Lock()
		for _, c := range f.creates {
			if c.Model == req.Model {
				tmpl = c.Template
			}
		}
		f.mu.Unlock()
		info := map[string]any{"general.architecture": f.arch}
		if f.ctxLen > 0 {
			info[f.arch+".context_length"] = f.ctxLen
		}
		json.NewEncoder(w).Encode(api.ShowResponse{Template: tmpl, ModelInfo: info})
	})
	mux.HandleFunc("POST /api/generate", func(w http.ResponseWriter, r *http.Request) {
		var req api.GenerateRequest
		if !f.decode(w, r, &req) || !f.known(w, req.Model) || !f.fits(w, len(req.Prompt)) {
			return
		}
		f.mu.Lock()
		f.generates = append(f.generates, req)
		f.mu.Unlock()
		rep := f.next()
		f.respond(w, req.Stream, rep, len(req.Prompt)/4, func(text, thinking string, calls []api.ToolCall, done bool, reason string, m api.Metrics) any {
			return api.GenerateResponse{Model: req.Model, Response: text, Thinking: thinking, Done: done, DoneReason: reason, Metrics: m}
		})
	})
	mux.HandleFunc("POST /api/chat", func(w http.ResponseWriter, r *http.Request) {
		var req api.ChatRequest
		if !f.decode(w, r, &req) || !f.known(w, req.Model) {
			return
		}
		n := 0
		for _, m := range req.Messages {
			n += len(m.Content)
		}
		if !f.fits(w, n) {
			return
		}
		f.mu.Lock()
		f.chats = append(f.chats, req)
		f.mu.Unlock()
		rep := f.next()
		f.respond(w, req.Stream, rep, n/4, func(text, thinking string, calls []api.ToolCall, done bool, reason string, m api.Metrics) any {
			return api.ChatResponse{Model: req.Model, Message: api.Message{Role: "assistant", Content: text, Thinking: thinking, ToolCalls: calls},
				Done: done, DoneReason: reason, Metrics: m}
		})
	})
	mux.HandleFunc("POST /api/embed", func(w http.ResponseWriter, r *http.Request) {
		var req api.EmbedRequest
		if !f.decode(w, r, &req) || !f.known(w, req.Model) {
			return
		}
		var texts []string
		switch in := req.Input.(type) {
		case string:
			texts = []string{in}
		case []any:
			for _, s := range in {
				texts = append(texts, s.(string))
			}
		}
		f.mu.Lock()
		f.embeds = append(f.embeds, req)
		f.mu.Unlock()
		resp := api.EmbedResponse{Model: req.Model}
		for _, s := range texts {
			if len(s) > f.ctxLimit {
				f.fail(w, http.StatusBadRequest, "the input length exceeds the context length")
				return
			}
			resp.Embeddings = append(resp.Embeddings, vector(s, f.dim))
		}
		json.NewEncoder(w).Encode(resp)
	})
	mux.HandleFunc("POST /api/blobs/{digest}", func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		sum := sha256.Sum256(body)
		if "sha256:"+hex.EncodeToString(sum[:]) != r.PathValue("digest") {
			f.fail(w, http.StatusBadRequest, "digest mismatch, expected \""+r.PathValue("digest")+"\"")
			return
		}
		f.mu.Lock()
		f.blobs[r.PathValue("digest")] = body
		f.mu.Unlock()
		w.WriteHeader(http.StatusCreated)
	})
	mux.HandleFunc("POST /api/create", func(w http.ResponseWriter, r *http.Request) {
		var req api.CreateRequest
		if !f.decode(w, r, &req) {
			return
		}
		for _, d := range req.Files {
			if _, ok := f.blobs[d]; !ok {
				f.fail(w, http.StatusBadRequest, "neither 'from' or 'files' was specified") // what Ollama says for an unknown blob
				return
			}
		}
		f.mu.Lock()
		f.creates = append(f.creates, req)
		f.models[req.Model] = true
		f.mu.Unlock()
		w.Header().Set("Content-Type", "application/x-ndjson")
		for _, s := range []string{"parsing GGUF", "using existing layer sha256:...", "writing manifest", "success"} {
			json.NewEncoder(w).Encode(api.ProgressResponse{Status: s})
		}
	})
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	return f, srv
}

func (f *fake) decode(w http.ResponseWriter, r *http.Request, v any) bool {
	if err := json.NewDecoder(r.Body).Decode(v); err != nil {
		f.fail(w, http.StatusBadRequest, err.Error())
		return false
	}
	return true
}

func (f *fake) known(w http.ResponseWriter, model string) bool {
	if !f.models[model] {
		f.fail(w, http.StatusNotFound, fmt.Sprintf("model %q not found, try pulling it first", model))
		return false
	}
	return true
}

func (f *fake) fits(w http.ResponseWriter, n int) bool {
	if n > f.ctxLimit {
		f.fail(w, http.StatusBadRequest, "the input length exceeds the context length")
		return false
	}
	return true
}

func (f *fake) fail(w http.ResponseWriter, code int, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	json.NewEncoder(w).Encode(map[string]string{"error": msg})
}

func (f *fake) push(r ...reply) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.replies = append(f.replies, r...)
}

func (f *fake) next() reply {
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.replies) == 0 {
		f.t.Error("the fake has no reply left")
		return reply{}
	}
	r := f.replies[0]
	f.replies = f.replies[1:]
	return r
}

// respond writes a reply as Ollama does: one JSON object when stream is
// false, else one NDJSON record per chunk (thinking first, tool calls on
// their own record) and a final done record carrying the metrics.
func (f *fake) respond(w http.ResponseWriter, stream *bool, rep reply, promptN int, rec func(text, thinking string, calls []api.ToolCall, done bool, reason string, m api.Metrics) any) {
	reason := rep.reason
	if reason == "" {
		reason = "stop"
	}
	m := api.Metrics{PromptEvalCount: promptN, EvalCount: len(rep.chunks) + len(rep.calls) + 1}
	enc := json.NewEncoder(w)
	if stream != nil && !*stream {
		enc.Encode(rec(strings.Join(rep.chunks, ""), rep.thinking, rep.calls, true, reason, m))
		return
	}
	w.Header().Set("Content-Type", "application/x-ndjson")
	if rep.thinking != "" {
		enc.Encode(rec("", rep.thinking, nil, false, "", api.Metrics{}))
	}
	for _, c := range rep.chunks {
		enc.Encode(rec(c, "", nil, false, "", api.Metrics{}))
		w.(http.Flusher).Flush()
	}
	if len(rep.calls) > 0 {
		enc.Encode(rec("", "", rep.calls, false, "", api.Metrics{}))
	}
	if f.cutStream {
		return
	}
	enc.Encode(rec("", "", nil, true, reason, m))
}

// vector is a deterministic, unnormalised embedding.
func vector(s string, dim int) []float32 {
	v := make([]float32, dim)
	for _, w := range strings.Fields(strings.ToLower(s)) {
		h := fnv.New32a()
		h.Write([]byte(w))
		v[h.Sum32()%uint32(dim)] += 3
	}
	v[0] += 0.5
	return v
}

func toolCall(name string, args ...any) api.ToolCall {
	tc := api.ToolCall{Function: api.ToolCallFunction{Name: name, Arguments: api.NewToolCallFunctionArguments()}}
	for i := 0; i < len(args); i += 2 {
		tc.Function.Arguments.Set(args[i].(string), args[i+1])
	}
	return tc
}
