package bert

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"

	"github.com/agemem/agemem/internal/jsonerr"
	"github.com/agemem/agemem/model/tokenizer"
)

// Tokenizer turns a sentence into the encoder's ids, specials included.
type Tokenizer interface {
	Encode(text string, maxLen int) []int
	VocabSize() int
}

// BPE is RoBERTa's tokenizer: byte-level BPE (GPT-2's pre-tokenizer) with
// <s> … </s> around each sentence.
type BPE struct {
	*tokenizer.Tokenizer
	BOS, EOS int
}

// Encode returns <s> tokens </s>, truncated to at most maxLen ids (0: no
// limit) with </s> kept.
func (b *BPE) Encode(text string, maxLen int) []int {
	ids := append([]int{b.BOS}, b.Tokenizer.Encode(text)...)
	if maxLen > 1 && len(ids)+1 > maxLen {
		ids = ids[:maxLen-1]
	}
	return append(ids, b.EOS)
}

// LoadTokenizer reads the encoder's tokenizer from dir: tokenizer.json
// (a WordPiece or a byte-level BPE model) or vocab.txt.
func LoadTokenizer(dir string) (Tokenizer, error) {
	raw, err := os.ReadFile(filepath.Join(dir, "tokenizer.json"))
	if err != nil {
		return LoadWordPiece(dir)
	}
	var head struct {
		Model struct {
			Type string `json:"type"`
		} `json:"model"`
		Post *struct {
			Type string `json:"type"`
			CLS  []any  `json:"cls"`
			SEP  []any  `json:"sep"`
		} `json:"post_processor"`
	}
	if err := json.Unmarshal(raw, &head); err != nil {
		return nil, fmt.Errorf("%s/tokenizer.json: %w", dir, jsonerr.Explain(err))
	}
	if head.Model.Type != "BPE" {
		return LoadWordPiece(dir)
	}
	t, err := tokenizer.Parse(raw)
	if err != nil {
		return nil, fmt.Errorf("%s/tokenizer.json: %w", dir, err)
	}
	bos, eos := "<s>", "</s>"
	if p := head.Post; p != nil && p.Type == "RobertaProcessing" && len(p.CLS) == 2 && len(p.SEP) == 2 {
		bos, _ = p.CLS[0].(string)
		eos, _ = p.SEP[0].(string)
	}
	b := &BPE{Tokenizer: t}
	var ok1, ok2 bool
	b.BOS, ok1 = t.TokenID(bos)
	b.EOS, ok2 = t.TokenID(eos)
	if !ok1 || !ok2 {
		return nil, fmt.Errorf("%s/tokenizer.json: no %s or %s token to open and close a sentence", dir, bos, eos)
	}
	return b, nil
}
