// Package qwentest gives tests a tiny Qwen3 of random weights that carries
// the real Qwen3 tokenizer, so that what it reads and writes is what a
// Qwen3 checkpoint would (chat templates, tool calls, special tokens).
package qwentest

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/agemem/agemem/internal/testkit"
	"github.com/agemem/agemem/model/qwen"
	"github.com/agemem/agemem/model/safetensors"
	"github.com/agemem/agemem/model/tokenizer"
)

// Tokenizer is the reference Qwen3 tokenizer `make deps` installs.
func Tokenizer(tb testing.TB) *tokenizer.Tokenizer {
	tb.Helper()
	p := testkit.QwenTokenizer(tb)
	if _, err := os.Stat(p); err != nil {
		tb.Fatalf("run `make deps`: %v", err)
	}
	tok, err := tokenizer.Load(p)
	if err != nil {
		tb.Fatal(err)
	}
	return tok
}

// Model is the tiny-qwen3 preset with tok's vocabulary, random weights of
// dtype (seed 5), loaded on the CPU.
func Model(tb testing.TB, tok *tokenizer.Tokenizer, dtype safetensors.DType) *qwen.Model {
	tb.Helper()
	cfg := qwen.Presets["tiny-qwen3"]
	cfg.VocabSize = tok.VocabSize()
	dir := filepath.Join(tb.TempDir(), "m")
	if err := qwen.InitRandom(dir, cfg, dtype, 5); err != nil {
		tb.Fatal(err)
	}
	m, err := qwen.Load(dir)
	if err != nil {
		tb.Fatal(err)
	}
	return m
}
