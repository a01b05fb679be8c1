package bert

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/agemem/agemem/internal/testkit"
	"github.com/agemem/agemem/model/tokenizer"
)

// testVocab is a small BERT vocabulary: specials, characters, their
// continuations, words and suffixes.
func testVocab() []string {
	v := []string{"[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"}
	chars := "abcdefghijklmnopqrstuvwxyz0123456789.,!?'\"-()$%:;/北京是"
	for _, c := range chars {
		v = append(v, string(c))
	}
	for _, c := range "abcdefghijklmnopqrstuvwxyz0123456789" {
		v = append(v, "##"+string(c))
	}
	v = append(v, "the", "was", "born", "in", "oslo", "marla", "quen", "##by", "capital", "of", "norway", "river",
		"flows", "through", "un", "##aff", "##able", "##ing", "##ed", "##s", "cafe", "is", "a", "city", "1971", "memory")
	return v
}

func writeTokenizerJSON(t *testing.T, vocab []string, lower bool) string {
	t.Helper()
	m := map[string]int{}
	for i, s := range vocab {
		m[s] = i
	}
	var added []map[string]any
	for i, s := range vocab[:5] {
		added = append(added, map[string]any{"id": i, "content": s, "single_word": false, "lstrip": false, "rstrip": false, "normalized": false, "special": true})
	}
	tj := map[string]any{
		"version": "1.0", "truncation": nil, "padding": nil, "added_tokens": added,
		"normalizer":    map[string]any{"type": "BertNormalizer", "clean_text": true, "handle_chinese_chars": true, "strip_accents": nil, "lowercase": lower},
		"pre_tokenizer": map[string]any{"type": "BertPreTokenizer"},
		"post_processor": map[string]any{"type": "TemplateProcessing",
			"single": []any{map[string]any{"SpecialToken": map[string]any{"id": "[CLS]", "type_id": 0}}, map[string]any{"Sequence": map[string]any{"id": "A", "type_id": 0}}, map[string]any{"SpecialToken": map[string]any{"id": "[SEP]", "type_id": 0}}},
			"pair":   []any{},
			"special_tokens": map[string]any{"[CLS]": map[string]any{"id": "[CLS]", "ids": []int{2}, "tokens": []string{"[CLS]"}},
				"[SEP]": map[string]any{"id": "[SEP]", "ids": []int{3}, "tokens": []string{"[SEP]"}}}},
		"decoder": map[string]any{"type": "WordPiece", "prefix": "##", "cleanup": true},
		"model":   map[string]any{"type": "WordPiece", "unk_token": "[UNK]", "continuing_subword_prefix": "##", "max_input_chars_per_word": 100, "vocab": m},
	}
	raw, _ := json.Marshal(tj)
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "tokenizer.json"), raw, 0o644); err != nil {
		t.Fatal(err)
	}
	return dir
}

// Our WordPiece encodes exactly as Hugging Face's tokenizers: accents,
// case, CJK, punctuation, control characters, unknown and over-long words,
// special tokens in the text; from tokenizer.json and from vocab.txt.
func TestWordPieceMatchesHuggingFace(t *testing.T) {
	texts := []string{
		"Marla Quenby was born in Oslo in 1971.",
		"The  capital\tof Norway, Oslo! (unaffable?)",
		"CAFÉ Café café — naïve 北京是 a city",
		"flowing rivers flowed; thxq zzz",
		"control\u0000chars\u200b and \u00a0 spaces",
		"Marla was [MASK] in Oslo [SEP] extra",
		strings.Repeat("a", 120) + " is long",
		"",
		"$100 - 50% : don't \"quote\"",
	}
	for _, lower := range []bool{true, false} {
		dir := writeTokenizerJSON(t, testVocab(), lower)
		in, _ := json.Marshal(texts)
		cmd := exec.Command("node", "testdata/encode.mjs", filepath.Join(dir, "tokenizer.json"))
		cmd.Env = append(os.Environ(), "NPM_PREFIX="+testkit.NPM(t))
		cmd.Stderr = os.Stderr
		cmd.Stdin = strings.NewReader(string(in))
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("node: %v", err)
		}
		var want [][]int
		if err := json.Unmarshal(out, &want); err != nil {
			t.Fatalf("%s: %v", out, err)
		}
		w, err := LoadWordPiece(dir)
		if err != nil {
			t.Fatal(err)
		}
		for i, s := range texts {
			if got := w.Encode(s, 0); !slices.Equal(got, want[i]) {
				t.Errorf("lower %v, %.40q:\n ours %v\n HF   %v", lower, s, got, want[i])
			}
		}
	}
	// vocab.txt with do_lower_case reads the same vocabulary.
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "vocab.txt"), []byte(strings.Join(testVocab(), "\n")+"\n"), 0o644)
	os.WriteFile(filepath.Join(dir, "tokenizer_config.json"), []byte(`{"do_lower_case": true}`), 0o644)
	fromTxt, err := LoadWordPiece(dir)
	if err != nil {
		t.Fatal(err)
	}
	fromJSON, _ := LoadWordPiece(writeTokenizerJSON(t, testVocab(), true))
	for _, s := range texts {
		if a, b := fromTxt.Encode(s, 0), fromJSON.Encode(s, 0); !slices.Equal(a, b) {
			t.Errorf("%.40q: vocab.txt %v, tokenizer.json %v", s, a, b)
		}
	}
	// Truncation keeps [CLS] and [SEP].
	if ids := fromTxt.Encode("the capital of norway is oslo", 4); len(ids) != 4 || ids[0] != fromTxt.CLS || ids[3] != fromTxt.SEP {
		t.Errorf("truncated: %v", ids)
	}
}

func TestWordPieceErrors(t *testing.T) {
	if _, err := LoadWordPiece(t.TempDir()); err == nil || !strings.Contains(err.Error(), "vocab.txt") {
		t.Errorf("empty dir: %v", err)
	}
	if _, err := NewWordPiece([]string{"[PAD]", "a"}, true); err == nil || !strings.Contains(err.Error(), "[UNK]") {
		t.Errorf("no specials: %v", err)
	}
	if _, err := ParseWordPieceJSON([]byte(`{"model": {"type": "BPE"}}`)); err == nil || !strings.Contains(err.Error(), "not WordPiece") {
		t.Errorf("BPE: %v", err)
	}
	// Corrupt ids and an empty added token (which matched at every
	// position: Encode never returned) are refused by name.
	for file, want := range map[string]string{
		`{"model": {"type": "WordPiece", "vocab": {"[UNK]": 0, "a": 3000000000}}}`:                                                                `"a" has id 3000000000`,
		`{"model": {"type": "WordPiece", "vocab": {"[UNK]": -1}}}`:                                                                                `"[UNK]" has id -1`,
		`{"added_tokens": [{"id": 0, "content": ""}], "model": {"type": "WordPiece", "vocab": {"[UNK]": 0, "[CLS]": 1, "[SEP]": 2, "[PAD]": 3}}}`: "added token 0 is empty",
	} {
		if _, err := ParseWordPieceJSON([]byte(file)); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: %v, want %q", file, err, want)
		}
	}
}

// FuzzParseWordPieceJSON: a tokenizer.json of any bytes parses with an
// error or as a tokenizer whose encodings end and stay within its
// vocabulary. `make test` runs the seeds; `make fuzz` explores.
func FuzzParseWordPieceJSON(f *testing.F) {
	f.Add([]byte(`{"added_tokens": [{"id": 4, "content": "[MASK]"}, {"id": 9, "content": "<x>"}], "normalizer": {"type": "BertNormalizer", "lowercase": true}, "model": {"type": "WordPiece", "vocab": {"[UNK]": 0, "[CLS]": 1, "[SEP]": 2, "[PAD]": 3, "[MASK]": 4, "a": 5, "##b": 6}}}`), "ab [MASK] <x> c")
	f.Add([]byte(`{"model": {"type": "WordPiece", "continuing_subword_prefix": "", "max_input_chars_per_word": 1, "vocab": {"[UNK]": 0, "[CLS]": 7, "[SEP]": 2, "[PAD]": 2}}}`), "héllo wörld")
	f.Fuzz(func(t *testing.T, raw []byte, text string) {
		w, err := ParseWordPieceJSON(raw)
		if err != nil {
			return
		}
		for _, id := range w.Encode(text, 0) {
			if id < 0 || id >= w.VocabSize() {
				t.Fatalf("%q encodes to id %d of a vocabulary of %d", text, id, w.VocabSize())
			}
		}
	})
}

// RoBERTa's byte-level BPE (GPT-2 pre-tokenizer, <s> … </s>) encodes as
// Hugging Face's tokenizers does.
func TestRobertaBPEMatchesHuggingFace(t *testing.T) {
	corpus := []string{"Marla Quenby was born in Oslo in 1971.", "The capital of Norway is Oslo!", "It's what they'll say, isn't it?",
		"Numbers like 12345 and 3.14 appear.", "  spaced   out\ttext\n\nlines", "naïve café 北京"}
	raw, err := tokenizer.Train(append(corpus, corpus...), tokenizer.TrainOptions{VocabSize: 420, Special: []string{"<s>", "<pad>", "</s>", "<unk>"}})
	if err != nil {
		t.Fatal(err)
	}
	var tj map[string]any
	json.Unmarshal(raw, &tj)
	tj["normalizer"] = nil
	tj["pre_tokenizer"] = map[string]any{"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true}
	tj["decoder"] = map[string]any{"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true}
	tj["post_processor"] = map[string]any{"type": "RobertaProcessing", "sep": []any{"</s>", 2}, "cls": []any{"<s>", 0}, "trim_offsets": true, "add_prefix_space": false}
	dir := t.TempDir()
	out, _ := json.Marshal(tj)
	os.WriteFile(filepath.Join(dir, "tokenizer.json"), out, 0o644)
	texts := append(corpus, "we've they're I'm you'd", "Zürich's 2024-05-06 costs $1,000.50", "trailing spaces   ", "tab\tand\u00a0nbsp", "(hello) [Oslo] {x} 'quoted' \"q\"", "")
	in, _ := json.Marshal(texts)
	cmd := exec.Command("node", "testdata/encode.mjs", filepath.Join(dir, "tokenizer.json"))
	cmd.Env = append(os.Environ(), "NPM_PREFIX="+testkit.NPM(t))
	cmd.Stdin = strings.NewReader(string(in))
	cmd.Stderr = os.Stderr
	res, err := cmd.Output()
	if err != nil {
		t.Fatalf("node: %v", err)
	}
	var want [][]int
	if err := json.Unmarshal(res, &want); err != nil {
		t.Fatal(err)
	}
	tok, err := LoadTokenizer(dir)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := tok.(*BPE); !ok {
		t.Fatalf("loaded %T, want *BPE", tok)
	}
	for i, s := range texts {
		if got := tok.Encode(s, 0); !slices.Equal(got, want[i]) {
			t.Errorf("%.40q:\n ours %v\n HF   %v", s, got, want[i])
		}
	}
}
