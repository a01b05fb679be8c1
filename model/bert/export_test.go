package bert

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"
)

// TestExportForTransformers writes tiny random encoders (BERT with erf
// GELU, RoBERTa with the tanh one), the sentences and our embeddings in
// every pooling to $AGEMEM_HF_EXPORT, for testdata/hf_compare.py to check
// against Hugging Face transformers (and sentence-transformers where
// installed) on a machine that has them. Skipped otherwise.
func TestExportForTransformers(t *testing.T) {
	out := os.Getenv("AGEMEM_HF_EXPORT")
	if out == "" {
		t.Skip("set AGEMEM_HF_EXPORT=DIR to write encoders for the transformers comparison")
	}
	texts := []string{"Marla Quenby was born in Oslo in 1971.", "the capital of norway", "Oslo!", "a river flows through the city of oslo, marla"}
	for _, typ := range []string{"bert", "roberta"} {
		cfg := tinyCfg
		cfg.ModelType = typ
		cfg.Architectures = []string{"BertModel"}
		if typ == "roberta" {
			cfg.PadTokenID = 0
			cfg.HiddenAct = "gelu_new"
			cfg.Architectures = []string{"RobertaModel"}
		}
		src := tinyBERT(t, cfg)
		dir := filepath.Join(out, typ)
		if err := os.CopyFS(dir, os.DirFS(src)); err != nil {
			t.Fatal(err)
		}
		res := map[string]any{"texts": texts}
		for _, pool := range []string{PoolCLS, PoolCLSMLP, PoolMean} {
			enc, err := LoadEncoder(dir, pool, 0, nil)
			if err != nil {
				t.Fatal(err)
			}
			vs, err := enc.Embed(context.Background(), texts)
			if err != nil {
				t.Fatal(err)
			}
			res[pool] = vs
			var ids [][]int
			for _, s := range texts {
				ids = append(ids, enc.Tok.Encode(s, 0))
			}
			res["ids"] = ids
		}
		raw, _ := json.Marshal(res)
		if err := os.WriteFile(filepath.Join(dir, "agemem_embeddings.json"), raw, 0o644); err != nil {
			t.Fatal(err)
		}
	}
}
