package fleet_test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/agemem/agemem/embed"
	"github.com/agemem/agemem/kernels/device"
	"github.com/agemem/agemem/llm"
	"github.com/agemem/agemem/llm/native"
	"github.com/agemem/agemem/memtools"
	"github.com/agemem/agemem/memtools/ltm"
	"github.com/agemem/agemem/model/chat"
	"github.com/agemem/agemem/model/lora"
	"github.com/agemem/agemem/model/qwen"
	"github.com/agemem/agemem/rl/fleet"
	"github.com/agemem/agemem/rl/rollout"
	"github.com/agemem/agemem/serve"
)

var tiny = filepath.Join("..", "..", "checkpoints", "tiny")

// engine is our serve over the shipped tiny policy, runtime adapters on.
func engine(t *testing.T) (*httptest.Server, *native.Checkpoint) {
	t.Helper()
	t.Setenv(serve.RuntimeAdaptersEnv, "true")
	be, _ := device.Open("cpu", nil)
	ck, err := native.Open(be, tiny, "", qwen.Options{})
	if err != nil {
		t.Fatal(err)
	}
	db, err := ltm.OpenSQLite(filepath.Join(t.TempDir(), "m.db"), ltm.SQLiteOptions{})
	if err != nil {
		t.Fatal(err)
	}
	sc := serve.DefaultConfig()
	sc.KeysEnv = ""
	agent := memtools.DefaultAgent()
	agent.SystemPrompt = "compact"
	srv, err := serve.New(serve.Options{Config: sc, Agent: agent, Tools: memtools.DefaultOptions(), Namespace: "default", Native: ck, Store: db, Embedder: embed.NewHashing(64, []int{3})})
	if err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewServer(srv.Handler())
	t.Cleanup(func() { ts.Close(); srv.Close(); db.Close() })
	return ts, ck
}

func adapter(t *testing.T, seed uint64) *lora.Adapter {
	cfg, err := qwen.LoadConfig(tiny)
	if err != nil {
		t.Fatal(err)
	}
	names, shape := cfg.Linears()
	a, err := lora.New(lora.Config{R: 4, Alpha: 8, PeftType: "LORA", TargetModules: []string{"q_proj", "v_proj"}}, names, shape, seed, true)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

func listed(t *testing.T, url string) []string {
	resp, err := http.Get(url + "/models")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var m struct {
		Data []struct {
			ID string `json:"id"`
		} `json:"data"`
	}
	json.NewDecoder(resp.Body).Decode(&m)
	var out []string
	for _, d := range m.Data {
		out = append(out, d.ID)
	}
	return out
}

// TestEnginesLoadEachVersion: two serve engines load each published
// version (over HTTP from the trainer, or from a shared directory), drop
// the one before, and answer rollouts tagged with it; a dead engine is
// reported and left out while the other serves.
func TestEnginesLoadEachVersion(t *testing.T) {
	a, ck := engine(t)
	b, _ := engine(t)
	codec := native.NewCodec(ck.Tokenizer, ck.Template, ck.Model.MaxPositions, 0)
	for _, shared := range []bool{false, true} {
		pub, err := fleet.NewPublisher(t.TempDir(), "agemem", shared, "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer pub.Close()
		f, err := fleet.New(fleet.Options{URLs: []string{a.URL + "/v1", b.URL + "/v1"}, Timeout: 30 * time.Second, Retries: 1}, nil)
		if err != nil {
			t.Fatal(err)
		}
		prev := ""
		for v := range 2 {
			ad, err := pub.Publish(v, adapter(t, uint64(v+1)))
			if err != nil {
				t.Fatal(err)
			}
			if !strings.HasPrefix(ad.Name, "agemem-v"+string(rune('0'+v))+"-") {
				t.Fatalf("name %s", ad.Name)
			}
			up, err := f.Load(context.Background(), ad, prev, func(u string) string { return pub.PathFor(ad, u) })
			if err != nil || len(up) != 2 {
				t.Fatalf("shared %v v%d: %v, up %v", shared, v, err, up)
			}
			for _, u := range up {
				if got := listed(t, u); !slices.Contains(got, ad.Name) || (prev != "" && slices.Contains(got, prev)) {
					t.Fatalf("%s lists %v after loading %s over %s", u, got, ad.Name, prev)
				}
			}
			ms, _ := f.Models(up, ad.Name, codec, llm.Sampling{MaxTokens: 8})
			resp, err := ms[1].Chat(context.Background(), llm.Request{Messages: []chat.Message{{Role: "user", Content: "hi"}}, Sampling: &llm.Sampling{Temperature: 1, Seed: 3, MaxTokens: 8}})
			if err != nil || resp.Model != ad.Name || len(resp.ResponseIDs) == 0 {
				t.Fatalf("a rollout call on %s: %v %+v", up[1], err, resp)
			}
			prev = ad.Name
		}
		// Unloading what an engine no longer has is not a failure of the load.
		ad, _ := pub.Publish(5, adapter(t, 9))
		if _, err := f.Load(context.Background(), ad, "never-loaded", func(u string) string { return pub.PathFor(ad, u) }); err != nil {
			t.Fatal(err)
		}
	}
	// A dead engine: out of the load, and its calls are engine errors.
	dead := httptest.NewServer(http.NotFoundHandler())
	deadURL := dead.URL + "/v1"
	dead.Close()
	pub, _ := fleet.NewPublisher(t.TempDir(), "agemem", false, "127.0.0.1:0")
	defer pub.Close()
	f, _ := fleet.New(fleet.Options{URLs: []string{a.URL + "/v1", deadURL}, Timeout: 5 * time.Second, Retries: 1}, nil)
	ad, _ := pub.Publish(1, adapter(t, 1))
	up, err := f.Load(context.Background(), ad, "", func(u string) string { return pub.PathFor(ad, u) })
	if err != nil || len(up) != 1 || up[0] != a.URL+"/v1" {
		t.Fatalf("with a dead engine: up %v, %v", up, err)
	}
	ms, _ := f.Models([]string{deadURL}, ad.Name, codec, llm.Sampling{MaxTokens: 8})
	var ee *rollout.EngineError
	if _, err := ms[0].Chat(context.Background(), llm.Request{Messages: []chat.Message{{Role: "user", Content: "hi"}}}); !errors.As(err, &ee) {
		t.Fatalf("a call on a dead engine: %v, want an EngineError", err)
	}
	f2, _ := fleet.New(fleet.Options{URLs: []string{deadURL}, Timeout: time.Second}, nil)
	if _, err := f2.Load(context.Background(), ad, "", func(u string) string { return pub.PathFor(ad, u) }); err == nil || !strings.Contains(err.Error(), deadURL) {
		t.Fatalf("no engine up: %v", err)
	}
}

// TestHungAndStaleEnginesFail: an engine that does not answer within the
// timeout, and one that answers with another model than the adapter asked
// for, fail their calls as engine errors (the rollout is played again
// elsewhere; the stale reply is never trained on).
func TestHungAndStaleEnginesFail(t *testing.T) {
	_, ck := engine(t)
	codec := native.NewCodec(ck.Tokenizer, ck.Template, ck.Model.MaxPositions, 0)
	hung := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body) // so that the server notices the client leave
		select {
		case <-r.Context().Done():
		case <-time.After(time.Minute):
		}
	}))
	defer hung.Close()
	stale := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.Write([]byte(`{"model":"agemem-v1-00000000","choices":[{"text":"hi","token_ids":[5,6],"finish_reason":"length","logprobs":{"tokens":["a","b"],"token_logprobs":[-1,-2]}}]}`))
	}))
	defer stale.Close()
	f, _ := fleet.New(fleet.Options{URLs: []string{hung.URL + "/v1", stale.URL + "/v1"}, Timeout: 500 * time.Millisecond}, nil)
	ms, _ := f.Models([]string{hung.URL + "/v1", stale.URL + "/v1"}, "agemem-v2-11111111", codec, llm.Sampling{MaxTokens: 8})
	req := llm.Request{Messages: []chat.Message{{Role: "user", Content: "hi"}}}
	start := time.Now()
	var ee *rollout.EngineError
	if _, err := ms[0].Chat(context.Background(), req); !errors.As(err, &ee) || time.Since(start) > 5*time.Second {
		t.Fatalf("hung engine: %v after %v", err, time.Since(start))
	}
	if _, err := ms[1].Chat(context.Background(), req); !errors.As(err, &ee) || !strings.Contains(err.Error(), "stale") {
		t.Fatalf("stale engine: %v", err)
	}
}
