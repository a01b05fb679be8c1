package serve

// LoRA adapters loaded at run time, as vLLM loads them: POST
// /v1/load_lora_adapter {"lora_name", "lora_path"} and POST
// /v1/unload_lora_adapter {"lora_name"}, enabled, as in vLLM, by
// VLLM_ALLOW_RUNTIME_LORA_UPDATING=true in serve's environment (one switch
// for a fleet of both kinds). A request names an adapter as its model: it
// runs on the base with that adapter, on an engine of its own over the
// shared base weights. lora_path is a PEFT directory on this machine or an
// http(s) URL of one published by agemem-train (its files listed with
// their SHA-256 in agemem_adapter.json, which is checked in either case).

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/agemem/agemem/llm/native"
	"github.com/agemem/agemem/model/lora"
)

// RuntimeAdaptersEnv turns the adapter endpoints on (vLLM's variable).
const RuntimeAdaptersEnv = "VLLM_ALLOW_RUNTIME_LORA_UPDATING"

// maxAdapters bounds the adapters held at once: a trainer holds two (the
// version rollouts use and the next), a few more serve experiments.
const maxAdapters = 8

// maxAdapterBytes bounds one downloaded adapter file.
const maxAdapterBytes = 4 << 30

var adapterName = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._:@-]{0,127}$`)

// adapterSet is the server's loaded adapters.
type adapterSet struct {
	enabled bool
	mu      sync.Mutex
	byName  map[string]*adapterEngine
	loading sync.Mutex // one load at a time: each reads a whole adapter
}

// adapterEngine is one adapter's engine; refs counts requests on it, so
// that an unloaded adapter's engine stops once they finish.
type adapterEngine struct {
	name, path, sum string
	eng             *native.Engine
	refs            sync.WaitGroup
}

func newAdapterSet() *adapterSet {
	on, _ := strconv.ParseBool(os.Getenv(RuntimeAdaptersEnv))
	return &adapterSet{enabled: on, byName: map[string]*adapterEngine{}}
}

// acquire is the engine a request's model names: the base's (the served
// model) or an adapter's; release ends the request's hold on it.
func (s *Server) acquire(model string) (e *native.Engine, release func(), aerr *apiError) {
	base, ok := s.be.(*native.Engine)
	if !ok {
		return nil, nil, &apiError{Status: http.StatusNotImplemented, Type: "invalid_request_error", Code: "unsupported",
			Message: "token-level completions and adapters need the native engine (serve.backend native)"}
	}
	if model == s.cfg.ModelName {
		return base, func() {}, nil
	}
	a := s.adapters
	a.mu.Lock()
	defer a.mu.Unlock()
	ae := a.byName[model]
	if ae == nil {
		names := []string{s.cfg.ModelName}
		for n := range a.byName {
			names = append(names, n)
		}
		slices.Sort(names[1:])
		return nil, nil, &apiError{Status: http.StatusNotFound, Type: "invalid_request_error", Param: "model", Code: "model_not_found",
			Message: fmt.Sprintf("the model %q does not exist; this server serves %s", model, strings.Join(names, ", "))}
	}
	ae.refs.Add(1)
	return ae.eng, ae.refs.Done, nil
}

type loadAdapterRequest struct {
	LoraName    string `json:"lora_name"`
	LoraPath    string `json:"lora_path"`
	LoadInplace bool   `json:"load_inplace"`
}

type unloadAdapterRequest struct {
	LoraName  string `json:"lora_name"`
	LoraIntID *int   `json:"lora_int_id"`
}

// adminOnly refuses adapter changes to a server that is off or to a key
// that is not an admin's (an open server, with no keys, lets any caller).
func (s *Server) adminOnly(r *http.Request) *apiError {
	if !s.adapters.enabled {
		return &apiError{Status: http.StatusNotFound, Type: "invalid_request_error", Code: "runtime_adapters_off",
			Message: "loading LoRA adapters at run time is off: start serve with " + RuntimeAdaptersEnv + "=true (as vLLM)"}
	}
	if len(s.keys.keys) > 0 && !principalFrom(r.Context()).Admin {
		return &apiError{Status: http.StatusForbidden, Type: "permission_error", Code: "admin_only",
			Message: "loading and unloading adapters changes what every tenant is served: it takes an admin key"}
	}
	return nil
}

// loadAdapter is POST /v1/load_lora_adapter.
func (s *Server) loadAdapter(w http.ResponseWriter, r *http.Request) *apiError {
	if aerr := s.adminOnly(r); aerr != nil {
		return aerr
	}
	var req loadAdapterRequest
	if aerr := decodeBody(r, &req); aerr != nil {
		return aerr
	}
	switch {
	case req.LoraName == "" || req.LoraPath == "":
		return errInvalid("lora_name", "missing_parameter", "both 'lora_name' and 'lora_path' must be provided")
	case !adapterName.MatchString(req.LoraName):
		return errInvalid("lora_name", "invalid_value", fmt.Sprintf("lora_name %q: use 1-128 letters, digits and . _ : @ -", req.LoraName))
	case req.LoraName == s.cfg.ModelName:
		return errInvalid("lora_name", "invalid_value", fmt.Sprintf("lora_name %q is the served model's own name", req.LoraName))
	}
	base, ok := s.be.(*native.Engine)
	if !ok {
		return &apiError{Status: http.StatusNotImplemented, Type: "invalid_request_error", Code: "unsupported",
			Message: "adapters need the native engine (serve.backend native)"}
	}
	a := s.adapters
	a.loading.Lock()
	defer a.loading.Unlock()
	dir, sum, cleanup, err := fetchAdapter(r.Context(), req.LoraPath)
	if err != nil {
		return &apiError{Status: http.StatusNotFound, Type: "invalid_request_error", Param: "lora_path", Code: "adapter_not_found",
			Message: fmt.Sprintf("loading adapter %q from %s: %v", req.LoraName, req.LoraPath, err)}
	}
	defer cleanup()
	a.mu.Lock()
	old := a.byName[req.LoraName]
	n := len(a.byName)
	a.mu.Unlock()
	if old != nil && !req.LoadInplace {
		if old.sum == sum {
			// The same bytes again (two trainer ranks sharing an engine):
			// what was asked for is already so.
			fmt.Fprintf(w, "Success: LoRA adapter '%s' added successfully.", req.LoraName)
			return nil
		}
		return errInvalid("lora_name", "adapter_exists", fmt.Sprintf("The lora adapter '%s' has already been loaded.", req.LoraName))
	}
	if old == nil && n >= maxAdapters {
		return errInvalid("lora_name", "too_many_adapters", fmt.Sprintf("%d adapters are loaded, the most this server holds; unload one first", n))
	}
	ad, err := lora.Load(dir)
	if err != nil {
		return errInvalid("lora_path", "invalid_adapter", fmt.Sprintf("adapter %q: %v", req.LoraName, err))
	}
	m, err := base.Model().WithAdapter(ad)
	if err != nil {
		return errInvalid("lora_path", "invalid_adapter", fmt.Sprintf("adapter %q does not fit the served model: %v", req.LoraName, err))
	}
	ae := &adapterEngine{name: req.LoraName, path: req.LoraPath, sum: sum, eng: native.New(m, base.Tok, base.Tmpl, base.Options())}
	a.mu.Lock()
	a.byName[req.LoraName] = ae
	a.mu.Unlock()
	if old != nil {
		go old.stop()
	}
	s.log.Info("adapter loaded", "name", req.LoraName, "path", req.LoraPath, "sha256", sum)
	fmt.Fprintf(w, "Success: LoRA adapter '%s' added successfully.", req.LoraName)
	return nil
}

// unloadAdapter is POST /v1/unload_lora_adapter; requests already on the
// adapter finish first.
func (s *Server) unloadAdapter(w http.ResponseWriter, r *http.Request) *apiError {
	if aerr := s.adminOnly(r); aerr != nil {
		return aerr
	}
	var req unloadAdapterRequest
	if aerr := decodeBody(r, &req); aerr != nil {
		return aerr
	}
	if req.LoraName == "" {
		return errInvalid("lora_name", "missing_parameter", "'lora_name' must be provided")
	}
	a := s.adapters
	a.mu.Lock()
	ae := a.byName[req.LoraName]
	delete(a.byName, req.LoraName)
	a.mu.Unlock()
	if ae == nil {
		return &apiError{Status: http.StatusNotFound, Type: "invalid_request_error", Param: "lora_name", Code: "adapter_not_found",
			Message: fmt.Sprintf("The lora adapter '%s' cannot be found.", req.LoraName)}
	}
	go ae.stop()
	s.log.Info("adapter unloaded", "name", req.LoraName)
	fmt.Fprintf(w, "Success: LoRA adapter '%s' removed successfully.", req.LoraName)
	return nil
}

func (ae *adapterEngine) stop() {
	ae.refs.Wait()
	ae.eng.Close()
}

// closeAdapters stops every adapter's engine (the server is stopping).
func (s *Server) closeAdapters() {
	a := s.adapters
	a.mu.Lock()
	defer a.mu.Unlock()
	for n, ae := range a.byName {
		ae.stop()
		delete(a.byName, n)
	}
}

// listModels is GET /v1/models: the served model and every adapter, each
// adapter with its parent and source as vLLM lists them.
func (s *Server) listModels(w http.ResponseWriter, r *http.Request) *apiError {
	a := s.adapters
	a.mu.Lock()
	if len(a.byName) == 0 {
		a.mu.Unlock()
		return s.models(w, r)
	}
	data := []any{s.modelObject()}
	names := make([]string, 0, len(a.byName))
	for n := range a.byName {
		names = append(names, n)
	}
	slices.Sort(names)
	for _, n := range names {
		data = append(data, s.adapterObject(a.byName[n]))
	}
	a.mu.Unlock()
	writeJSON(w, 200, map[string]any{"object": "list", "data": data})
	return nil
}

// getModel is GET /v1/models/{model}, an adapter's included.
func (s *Server) getModel(w http.ResponseWriter, r *http.Request) *apiError {
	a := s.adapters
	a.mu.Lock()
	ae := a.byName[r.PathValue("model")]
	a.mu.Unlock()
	if ae == nil {
		return s.model(w, r)
	}
	writeJSON(w, 200, s.adapterObject(ae))
	return nil
}

func (s *Server) adapterObject(ae *adapterEngine) map[string]any {
	return map[string]any{"id": ae.name, "object": "model", "created": s.created, "owned_by": "agemem",
		"root": ae.path, "parent": s.cfg.ModelName, "sha256": ae.sum}
}

// fetchAdapter makes an adapter readable as a directory: a local one as
// it is, a URL's files downloaded into a temporary one. The manifest, when
// there is one (always, for a URL), must match the files; sum is the
// adapter's SHA-256 (of its manifest, else of its files).
func fetchAdapter(ctx context.Context, path string) (dir, sum string, cleanup func(), err error) {
	cleanup = func() {}
	if !strings.HasPrefix(path, "http://") && !strings.HasPrefix(path, "https://") {
		raw, err := os.ReadFile(filepath.Join(path, lora.ManifestFile))
		if errors.Is(err, os.ErrNotExist) {
			h := sha256.New()
			for _, f := range []string{"adapter_config.json", "adapter_model.safetensors"} {
				b, err := os.ReadFile(filepath.Join(path, f))
				if err != nil {
					return "", "", cleanup, err
				}
				h.Write(b)
			}
			return path, hex.EncodeToString(h.Sum(nil)), cleanup, nil
		}
		if err != nil {
			return "", "", cleanup, err
		}
		m, err := lora.ReadManifest(raw)
		if err != nil {
			return "", "", cleanup, err
		}
		for f := range m.Files {
			b, err := os.ReadFile(filepath.Join(path, f))
			if err != nil {
				return "", "", cleanup, err
			}
			if err := m.Check(f, b); err != nil {
				return "", "", cleanup, err
			}
		}
		return path, lora.Sum(raw), cleanup, nil
	}
	base := strings.TrimSuffix(path, "/")
	hc := &http.Client{Timeout: 10 * time.Minute}
	get := func(name string) ([]byte, error) {
		req, err := http.NewRequestWithContext(ctx, "GET", base+"/"+name, nil)
		if err != nil {
			return nil, err
		}
		resp, err := hc.Do(req)
		if err != nil {
			return nil, err
		}
		defer resp.Body.Close()
		if resp.StatusCode != 200 {
			return nil, fmt.Errorf("GET %s/%s: status %d", base, name, resp.StatusCode)
		}
		b, err := io.ReadAll(io.LimitReader(resp.Body, maxAdapterBytes+1))
		if err == nil && len(b) > maxAdapterBytes {
			err = fmt.Errorf("GET %s/%s: over %d bytes", base, name, maxAdapterBytes)
		}
		return b, err
	}
	raw, err := get(lora.ManifestFile)
	if err != nil {
		return "", "", cleanup, fmt.Errorf("an adapter URL needs its %s: %w", lora.ManifestFile, err)
	}
	m, err := lora.ReadManifest(raw)
	if err != nil {
		return "", "", cleanup, err
	}
	tmp, err := os.MkdirTemp("", "agemem-adapter-")
	if err != nil {
		return "", "", cleanup, err
	}
	cleanup = func() { os.RemoveAll(tmp) }
	for f := range m.Files {
		b, err := get(f)
		if err == nil {
			err = m.Check(f, b)
		}
		if err == nil {
			err = os.WriteFile(filepath.Join(tmp, f), b, 0o600)
		}
		if err != nil {
			cleanup()
			return "", "", func() {}, err
		}
	}
	return tmp, lora.Sum(raw), cleanup, nil
}
