package openai_test

import (
	"context"
	"net/http/httptest"
	"path/filepath"
	"slices"
	"testing"

	"github.com/agemem/agemem/embed"
	"github.com/agemem/agemem/kernels/device"
	"github.com/agemem/agemem/llm"
	"github.com/agemem/agemem/llm/native"
	"github.com/agemem/agemem/llm/openai"
	"github.com/agemem/agemem/memtools"
	"github.com/agemem/agemem/memtools/ltm"
	"github.com/agemem/agemem/model/chat"
	"github.com/agemem/agemem/model/qwen"
	"github.com/agemem/agemem/serve"
)

// TestTokenModelMatchesTheNativeEngine: the shipped tiny policy behind our
// serve, driven with token ids, answers a conversation with the tokens,
// log-probabilities, text and finish reason the native engine gives on
// the same seed: rollouts on a remote engine are the rollouts in process.
func TestTokenModelMatchesTheNativeEngine(t *testing.T) {
	be, err := device.Open("cpu", nil)
	if err != nil {
		t.Fatal(err)
	}
	ck, err := native.Open(be, filepath.Join("..", "..", "checkpoints", "tiny"), "", qwen.Options{})
	if err != nil {
		t.Fatal(err)
	}
	db, err := ltm.OpenSQLite(filepath.Join(t.TempDir(), "m.db"), ltm.SQLiteOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	sc := serve.DefaultConfig()
	sc.KeysEnv = ""
	agent := memtools.DefaultAgent()
	agent.SystemPrompt = "compact"
	srv, err := serve.New(serve.Options{Config: sc, Agent: agent, Tools: memtools.DefaultOptions(), Namespace: "default",
		Native: ck, Store: db, Embedder: embed.NewHashing(64, []int{3})})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	ts := httptest.NewServer(srv.Handler())
	defer ts.Close()
	c := openai.DefaultConfig()
	c.BaseURL = ts.URL + "/v1"
	cl, err := c.Connect()
	if err != nil {
		t.Fatal(err)
	}
	codec := native.NewCodec(ck.Tokenizer, ck.Template, ck.Model.MaxPositions, 0)
	remote := &openai.TokenModel{Client: cl, Name: "agemem", Codec: codec, Sampling: llm.Sampling{MaxTokens: 48}}
	local := ck.Start(native.Options{Sampling: llm.Sampling{MaxTokens: 48}})
	defer local.Close()
	sys, _ := memtools.SystemPromptFor("compact")
	for _, seed := range []uint64{1, 2, 3} {
		req := llm.Request{Messages: []chat.Message{{Role: "system", Content: sys}, {Role: "user", Content: "Mira Holt was born in Lisbon."}},
			Sampling: &llm.Sampling{Temperature: 1, TopP: 1, MaxTokens: 48, Seed: seed}}
		got, err := remote.Chat(context.Background(), req)
		if err != nil {
			t.Fatal(err)
		}
		want, err := local.Chat(context.Background(), req)
		if err != nil {
			t.Fatal(err)
		}
		if got.Model != "agemem" || !slices.Equal(got.PromptIDs, want.PromptIDs) || !slices.Equal(got.ResponseIDs, want.ResponseIDs) ||
			!slices.Equal(got.LogProbs, want.LogProbs) || got.Message.Content != want.Message.Content || got.FinishReason != want.FinishReason {
			t.Fatalf("seed %d:\nremote %q %v %v %s\nnative %q %v %v %s", seed, got.Message.Content, got.ResponseIDs, got.LogProbs, got.FinishReason,
				want.Message.Content, want.ResponseIDs, want.LogProbs, want.FinishReason)
		}
		if len(got.ResponseIDs) < 2 {
			t.Fatalf("seed %d: a reply of %d tokens tests little", seed, len(got.ResponseIDs))
		}
	}
}
