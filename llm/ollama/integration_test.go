package ollama

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/ollama/ollama/api"

	"github.com/agemem/agemem/internal/testkit"
	"github.com/agemem/agemem/llm"
	"github.com/agemem/agemem/memtools"
	"github.com/agemem/agemem/model/gguf"
	"github.com/agemem/agemem/model/lora"
	"github.com/agemem/agemem/model/qwen"
	"github.com/agemem/agemem/model/safetensors"
)

// TestRealOllama runs against the Ollama at OLLAMA_HOST, and is skipped
// when none is set: a random tiny Qwen3 exported here is published and
// generates through raw prompts (Ollama loads our GGUF), then the tool
// format runs on AGEMEM_OLLAMA_MODEL (default qwen3:0.6b) and embeddings on
// AGEMEM_OLLAMA_EMBED_MODEL if set.
func TestRealOllama(t *testing.T) {
	host := os.Getenv("OLLAMA_HOST")
	if host == "" {
		t.Skip("set OLLAMA_HOST to run against a real Ollama")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	c, err := New(host, nil)
	if err != nil {
		t.Fatal(err)
	}
	v, err := c.Ping(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("Ollama %s at %s", v, c.Host())

	dir := filepath.Join(t.TempDir(), "tiny")
	cfg := qwen.Presets["tiny-qwen3"]
	cfg.VocabSize = 151680
	if err := qwen.InitRandom(dir, cfg, safetensors.F32, 1); err != nil {
		t.Fatal(err)
	}
	if err := lora.CopyFiles(testkit.QwenTokenizerDir(t), dir, "tokenizer.json", "tokenizer_config.json"); err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(t.TempDir(), "tiny.gguf")
	if _, err := gguf.ExportQwenFile(dir, file, gguf.ExportOptions{Type: gguf.Q8_0}); err != nil {
		t.Fatal(err)
	}
	name := "agemem-integration-test"
	if err := c.Publish(ctx, file, name, PublishOptions{System: memtools.SystemPrompt()}); err != nil {
		t.Fatal(err)
	}
	defer c.API.Delete(context.Background(), &api.DeleteRequest{Model: name})
	p := &Model{Client: c, Name: name, Raw: true, Sampling: llm.Sampling{MaxTokens: 8}}
	got, err := p.Chat(ctx, llm.Request{Messages: conv})
	if err != nil {
		t.Fatalf("our GGUF on Ollama: %v", err)
	}
	if got.PromptTokens == 0 || got.CompletionTokens == 0 {
		t.Errorf("our GGUF on Ollama: %+v", got)
	}

	model := os.Getenv("AGEMEM_OLLAMA_MODEL")
	if model == "" {
		model = "qwen3:0.6b"
	}
	if err := c.HasModel(ctx, model); errors.Is(err, ErrModelNotFound) {
		t.Logf("skipping the tools format: %v", err)
	} else if err != nil {
		t.Fatal(err)
	} else {
		p := memtools.FunctionCalling{Model: &Model{Client: c, Name: model, Sampling: llm.Sampling{MaxTokens: 512}}}
		got, err := p.Chat(ctx, llm.Request{Messages: conv})
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("%s in tools format: %s", model, got.Message.Content)
		if pr := memtools.Parse(got.Message.Content); len(pr.Calls) == 0 && !pr.HasAnswer {
			t.Errorf("neither a call nor an answer: %q", got.Message.Content)
		}
	}
	if em := os.Getenv("AGEMEM_OLLAMA_EMBED_MODEL"); em != "" {
		e, err := NewEmbedder(ctx, c, em, 0)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := e.Embed(ctx, []string{"Marla was born in Oslo", "Oslo"}); err != nil {
			t.Fatal(err)
		}
	}
}
