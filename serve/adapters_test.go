package serve

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/agemem/agemem/llm/native"
	"github.com/agemem/agemem/memtools/ltm"
	"github.com/agemem/agemem/model/engine"
	"github.com/agemem/agemem/model/lora"
	"github.com/agemem/agemem/model/qwen"
)

// adapterServer is a native server over a random tiny Qwen3 with runtime
// adapters on, and an adapter for it saved as PEFT does.
func adapterServer(t *testing.T, on bool) (*testServer, *native.Checkpoint, string) {
	t.Helper()
	if on {
		t.Setenv(RuntimeAdaptersEnv, "true")
	} else {
		t.Setenv(RuntimeAdaptersEnv, "")
	}
	pol := randomPolicy(t)
	c := testConfig(t)
	c.Serve.MaxTokens = 16
	db, err := ltm.OpenSQLite(c.Memory.Path, ltm.SQLiteOptions{})
	if err != nil {
		t.Fatal(err)
	}
	s, err := New(with(c.options(), func(o *Options) { o.Native, o.Store = pol, db }))
	if err != nil {
		t.Fatal(err)
	}
	ts := &testServer{Server: newHTTPTest(s), srv: s, db: db}
	t.Cleanup(func() { ts.Close(); s.Close(); db.Close() })
	names, shape := qwen.Presets["tiny-qwen3"].Linears()
	a, err := lora.New(lora.Config{R: 4, Alpha: 8, TargetModules: []string{"q_proj", "v_proj", "up_proj"}}, names, shape, 7, true)
	if err != nil {
		t.Fatal(err)
	}
	// Scaled up so the adapter moves the distribution the test samples.
	for _, m := range a.Modules {
		for i := range m.B.Data {
			m.B.Data[i] *= 30
		}
	}
	dir := filepath.Join(t.TempDir(), "sql-lora")
	if err := a.Save(dir); err != nil {
		t.Fatal(err)
	}
	return ts, pol, dir
}

// TestAdapterEndpointsSpeakVLLM: the bodies vLLM documents load and unload
// an adapter, which /v1/models then lists; a key that is not an admin's,
// a server without the switch, a missing field and an unknown adapter get
// vLLM's answers.
func TestAdapterEndpointsSpeakVLLM(t *testing.T) {
	off, _, dir := adapterServer(t, false)
	r := do(t, "POST", off.URL+"/v1/load_lora_adapter", adminKey, map[string]string{"lora_name": "sql_adapter", "lora_path": dir})
	if r.Status != 404 || r.errorCode(t) != "runtime_adapters_off" || !strings.Contains(string(r.Body), RuntimeAdaptersEnv) {
		t.Fatalf("switch off: %d %s", r.Status, r.Body)
	}

	ts, _, dir := adapterServer(t, true)
	load := map[string]string{"lora_name": "sql_adapter", "lora_path": dir}
	if r := do(t, "POST", ts.URL+"/v1/load_lora_adapter", aliceKey, load); r.Status != 403 {
		t.Fatalf("a tenant's key loaded an adapter: %d %s", r.Status, r.Body)
	}
	if r := do(t, "POST", ts.URL+"/v1/load_lora_adapter", adminKey, map[string]string{"lora_name": "x"}); r.Status != 400 || r.errorCode(t) != "missing_parameter" {
		t.Fatalf("no lora_path: %d %s", r.Status, r.Body)
	}
	r = do(t, "POST", ts.URL+"/v1/load_lora_adapter", adminKey, load)
	if r.Status != 200 || string(r.Body) != "Success: LoRA adapter 'sql_adapter' added successfully." {
		t.Fatalf("load: %d %s", r.Status, r.Body)
	}
	var models struct {
		Data []map[string]any `json:"data"`
	}
	json.Unmarshal(do(t, "GET", ts.URL+"/v1/models", aliceKey, nil).Body, &models)
	if len(models.Data) != 2 || models.Data[1]["id"] != "sql_adapter" || models.Data[1]["parent"] != "agemem" || models.Data[1]["root"] != dir {
		t.Fatalf("/v1/models: %+v", models.Data)
	}
	if r := do(t, "GET", ts.URL+"/v1/models/sql_adapter", aliceKey, nil); r.Status != 200 {
		t.Fatalf("/v1/models/sql_adapter: %d", r.Status)
	}
	// The same bytes again are already loaded; other bytes under the name
	// are vLLM's 400 unless load_inplace.
	if r := do(t, "POST", ts.URL+"/v1/load_lora_adapter", adminKey, load); r.Status != 200 {
		t.Fatalf("reloading the same adapter: %d %s", r.Status, r.Body)
	}
	other := filepath.Join(t.TempDir(), "other")
	os.CopyFS(other, os.DirFS(dir))
	cfg, _ := os.ReadFile(filepath.Join(other, "adapter_config.json"))
	os.WriteFile(filepath.Join(other, "adapter_config.json"), []byte(strings.Replace(string(cfg), `"lora_alpha": 8`, `"lora_alpha": 16`, 1)), 0o644)
	if r := do(t, "POST", ts.URL+"/v1/load_lora_adapter", adminKey, map[string]string{"lora_name": "sql_adapter", "lora_path": other}); r.Status != 400 || !strings.Contains(string(r.Body), "has already been loaded") {
		t.Fatalf("another adapter under a loaded name: %d %s", r.Status, r.Body)
	}
	if r := do(t, "POST", ts.URL+"/v1/load_lora_adapter", adminKey, map[string]any{"lora_name": "sql_adapter", "lora_path": other, "load_inplace": true}); r.Status != 200 {
		t.Fatalf("load_inplace: %d %s", r.Status, r.Body)
	}
	r = do(t, "POST", ts.URL+"/v1/unload_lora_adapter", adminKey, map[string]string{"lora_name": "sql_adapter"})
	if r.Status != 200 || string(r.Body) != "Success: LoRA adapter 'sql_adapter' removed successfully." {
		t.Fatalf("unload: %d %s", r.Status, r.Body)
	}
	if r := do(t, "POST", ts.URL+"/v1/unload_lora_adapter", adminKey, map[string]string{"lora_name": "sql_adapter"}); r.Status != 404 || !strings.Contains(string(r.Body), "cannot be found") {
		t.Fatalf("unloading twice: %d %s", r.Status, r.Body)
	}
	r = do(t, "POST", ts.URL+"/v1/completions", aliceKey, map[string]any{"model": "sql_adapter", "prompt": []int{1, 2, 3}})
	if r.Status != 404 || r.errorCode(t) != "model_not_found" {
		t.Fatalf("completion on an unloaded adapter: %d %s", r.Status, r.Body)
	}
}

// TestCompletionsMatchTheNativeEngine: a prompt sent as token ids, with a
// seed, gives the token ids and log-probabilities the native engine gives
// on the same prompt and seed, through the served model and through a
// loaded adapter (which differ from each other).
func TestCompletionsMatchTheNativeEngine(t *testing.T) {
	ts, pol, dir := adapterServer(t, true)
	if r := do(t, "POST", ts.URL+"/v1/load_lora_adapter", adminKey, map[string]string{"lora_name": "sql_adapter", "lora_path": dir}); r.Status != 200 {
		t.Fatalf("load: %d %s", r.Status, r.Body)
	}
	prompt := pol.Tokenizer.Encode("<|im_start|>user\nWhere was Marla born?<|im_end|>\n<|im_start|>assistant\n")
	ad, _ := lora.Load(dir)
	withAdapter, err := pol.Model.WithAdapter(ad)
	if err != nil {
		t.Fatal(err)
	}
	var seen []string
	for _, c := range []struct {
		model string
		m     *qwen.Model
	}{{"agemem", pol.Model}, {"sql_adapter", withAdapter}} {
		e := native.New(c.m, pol.Tokenizer, pol.Template, native.Options{})
		for _, seed := range []int64{11, 12} {
			r := do(t, "POST", ts.URL+"/v1/completions", aliceKey, map[string]any{"model": c.model, "prompt": prompt, "max_tokens": 12,
				"temperature": 1, "top_p": 1, "seed": seed, "logprobs": 0, "return_token_ids": true, "return_tokens_as_token_ids": true})
			if r.Status != 200 {
				t.Fatalf("%s: %d %s", c.model, r.Status, r.Body)
			}
			var got struct {
				Model   string             `json:"model"`
				Choices []completionChoice `json:"choices"`
			}
			if err := json.Unmarshal(r.Body, &got); err != nil || len(got.Choices) != 1 {
				t.Fatalf("%s: %s", c.model, r.Body)
			}
			ch := got.Choices[0]
			want, err := e.Batching().GenerateBatch(context.Background(), []engine.Request{{Prompt: prompt,
				Sampling: engine.Sampling{Temperature: 1, TopP: 1, MaxTokens: 12, Seed: uint64(seed), StopIDs: e.StopIDs}}})
			if err != nil {
				t.Fatal(err)
			}
			if got.Model != c.model || len(ch.TokenIDs) == 0 || len(ch.PromptTokenIDs) != len(prompt) {
				t.Fatalf("%s: model %q, %d token ids, %d prompt ids", c.model, got.Model, len(ch.TokenIDs), len(ch.PromptTokenIDs))
			}
			if len(ch.TokenIDs) != len(want[0].Tokens) || ch.Logprobs == nil || len(ch.Logprobs.TokenLogprobs) != len(ch.TokenIDs) {
				t.Fatalf("%s seed %d: served %v, the engine %v", c.model, seed, ch.TokenIDs, want[0].Tokens)
			}
			for i := range want[0].Tokens {
				if ch.TokenIDs[i] != want[0].Tokens[i] || ch.Logprobs.TokenLogprobs[i] != want[0].LogProbs[i] {
					t.Fatalf("%s seed %d token %d: served %d (%v), the engine %d (%v)", c.model, seed, i, ch.TokenIDs[i], ch.Logprobs.TokenLogprobs[i], want[0].Tokens[i], want[0].LogProbs[i])
				}
				if ch.Logprobs.Tokens[i] != "token_id:"+itoa(want[0].Tokens[i]) {
					t.Fatalf("return_tokens_as_token_ids: %q", ch.Logprobs.Tokens[i])
				}
			}
			seen = append(seen, itoaAll(ch.TokenIDs))
		}
		e.Close()
	}
	if seen[0] == seen[2] && seen[1] == seen[3] {
		t.Fatal("the adapter sampled what the base did: the test cannot tell them apart")
	}
}

// TestCompletionsRefuseBadRequests: each way a completion request can be
// wrong is a 400 that names the parameter.
func TestCompletionsRefuseBadRequests(t *testing.T) {
	ts, _, _ := adapterServer(t, true)
	for _, c := range []struct {
		body  map[string]any
		param string
	}{
		{map[string]any{"model": "agemem", "prompt": []int{1, 1 << 30}}, "prompt[1]"},
		{map[string]any{"model": "agemem", "prompt": []int{}}, "prompt"},
		{map[string]any{"model": "agemem", "prompt": []int{1}, "logprobs": 5}, "logprobs"},
		{map[string]any{"model": "agemem", "prompt": []int{1}, "max_tokens": 100000}, "max_tokens"},
		{map[string]any{"model": "agemem", "prompt": []int{1}, "stream": true}, "stream"},
		{map[string]any{"model": "agemem", "prompt": []int{1}, "best_of": 2}, "best_of"},
		{map[string]any{"model": "agemem", "prompt": map[string]int{"a": 1}}, "prompt"},
	} {
		r := do(t, "POST", ts.URL+"/v1/completions", aliceKey, c.body)
		var e struct {
			Error apiError `json:"error"`
		}
		json.Unmarshal(r.Body, &e)
		if r.Status != 400 || e.Error.Param != c.param {
			t.Errorf("%v: %d %s, want 400 naming %s", c.body, r.Status, r.Body, c.param)
		}
	}
}

// TestAdapterFromURLIsChecked: an adapter published over HTTP loads when
// its files match agemem_adapter.json and is refused, naming the file,
// when one does not (a torn or stale copy).
func TestAdapterFromURLIsChecked(t *testing.T) {
	ts, _, dir := adapterServer(t, true)
	files := map[string]string{}
	for _, f := range []string{"adapter_config.json", "adapter_model.safetensors"} {
		b, _ := os.ReadFile(filepath.Join(dir, f))
		files[f] = lora.Sum(b)
	}
	man, _ := json.Marshal(lora.Manifest{Name: "agemem-v1", Version: 1, Files: files})
	os.WriteFile(filepath.Join(dir, lora.ManifestFile), man, 0o644)
	pub := httptest.NewServer(http.FileServer(http.Dir(filepath.Dir(dir))))
	defer pub.Close()
	url := pub.URL + "/" + filepath.Base(dir)
	if r := do(t, "POST", ts.URL+"/v1/load_lora_adapter", adminKey, map[string]string{"lora_name": "agemem-v1", "lora_path": url}); r.Status != 200 {
		t.Fatalf("load from %s: %d %s", url, r.Status, r.Body)
	}
	raw, _ := os.ReadFile(filepath.Join(dir, "adapter_model.safetensors"))
	raw[len(raw)-1] ^= 1
	os.WriteFile(filepath.Join(dir, "adapter_model.safetensors"), raw, 0o644)
	r := do(t, "POST", ts.URL+"/v1/load_lora_adapter", adminKey, map[string]string{"lora_name": "agemem-v2", "lora_path": url})
	if r.Status != 404 || !strings.Contains(string(r.Body), "adapter_model.safetensors has SHA-256") {
		t.Fatalf("a corrupt download: %d %s", r.Status, r.Body)
	}
	// The same check holds for a shared directory.
	r = do(t, "POST", ts.URL+"/v1/load_lora_adapter", adminKey, map[string]string{"lora_name": "agemem-v2", "lora_path": dir})
	if r.Status != 404 || !strings.Contains(string(r.Body), "manifest says") {
		t.Fatalf("a corrupt shared directory: %d %s", r.Status, r.Body)
	}
}

func itoa(i int) string { b, _ := json.Marshal(i); return string(b) }

func itoaAll(ids []int) string { b, _ := json.Marshal(ids); return string(b) }
