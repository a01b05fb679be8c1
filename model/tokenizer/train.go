package tokenizer

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"golang.org/x/text/unicode/norm"
)

// TrainOptions configure Train.
type TrainOptions struct {
	// VocabSize is the total vocabulary, byte tokens and added tokens included.
	VocabSize int
	// MinFrequency stops training when the best pair is rarer than this.
	MinFrequency int
	// Special are special added tokens (skipped when decoding with
	// skipSpecial), e.g. the ChatML markers.
	Special []string
	// Added are ordinary added tokens matched verbatim, e.g. "<think>".
	Added []string
	// Pattern is the pre-tokenizer: QwenPattern (the default),
	// WordsPattern, WordsRunsPattern or NamesPattern.
	Pattern string
}

// ChatML are the special tokens of the Qwen chat format, in Qwen's order.
var ChatML = []string{"<|endoftext|>", "<|im_start|>", "<|im_end|>"}

// AgeMemTags are the tags of the AgeMem response format and of tool
// responses, added whole so that a small model emits each as one token.
var AgeMemTags = []string{"<think>", "</think>", "<tool_call>", "</tool_call>", "<answer>", "</answer>", "<tool_response>", "</tool_response>"}

// Train learns a byte-level BPE on texts with the Qwen pre-tokenizer and
// NFC normaliser, and returns a Hugging Face tokenizer.json that Load (and
// the Hugging Face libraries) read. Training is deterministic: ties between
// equally frequent pairs go to the pair whose merged text sorts first.
func Train(texts []string, o TrainOptions) ([]byte, error) {
	added := append(append([]string(nil), o.Special...), o.Added...)
	if o.VocabSize < 256+len(added) {
		return nil, fmt.Errorf("vocab size %d is below the 256 byte tokens plus %d added tokens", o.VocabSize, len(added))
	}
	minFreq := max(o.MinFrequency, 2)
	if o.Pattern == "" {
		o.Pattern = QwenPattern
	}
	pre, ok := patterns[o.Pattern]
	if !ok {
		return nil, fmt.Errorf("pre-tokenizer pattern %q: want QwenPattern, WordsPattern or NamesPattern", o.Pattern)
	}
	// Word counts, with the added tokens cut out so no merge learns them.
	counts := map[string]int{}
	for _, t := range texts {
		for _, a := range added {
			t = strings.ReplaceAll(t, a, " ")
		}
		for _, p := range pre(norm.NFC.String(t)) {
			counts[p]++
		}
	}
	words := make([]string, 0, len(counts))
	for w := range counts {
		words = append(words, w)
	}
	sort.Strings(words)
	vocab := make([]string, 256)
	index := map[string]int{}
	for b := range 256 {
		vocab[b] = string(byteToRune[b])
		index[vocab[b]] = b
	}
	syms := make([][]int, len(words))
	for i, w := range words {
		for j := 0; j < len(w); j++ {
			syms[i] = append(syms[i], int(w[j]))
		}
	}
	var merges [][2]string
	for len(vocab)+len(added) < o.VocabSize {
		pairs := map[[2]int]int{}
		for i, s := range syms {
			c := counts[words[i]]
			for j := 0; j+1 < len(s); j++ {
				pairs[[2]int{s[j], s[j+1]}] += c
			}
		}
		best, bestN := [2]int{}, 0
		for p, n := range pairs {
			if n > bestN || (n == bestN && vocab[p[0]]+vocab[p[1]] < vocab[best[0]]+vocab[best[1]]) ||
				(n == bestN && vocab[p[0]]+vocab[p[1]] == vocab[best[0]]+vocab[best[1]] && vocab[p[0]] < vocab[best[0]]) {
				best, bestN = p, n
			}
		}
		if bestN < minFreq {
			break
		}
		text := vocab[best[0]] + vocab[best[1]]
		id, ok := index[text]
		if !ok {
			id = len(vocab)
			vocab = append(vocab, text)
			index[text] = id
		}
		merges = append(merges, [2]string{vocab[best[0]], vocab[best[1]]})
		for i, s := range syms {
			out := s[:0]
			for j := 0; j < len(s); j++ {
				if j+1 < len(s) && s[j] == best[0] && s[j+1] == best[1] {
					out = append(out, id)
					j++
					continue
				}
				out = append(out, s[j])
			}
			syms[i] = out
		}
	}
	return marshalTokenizer(vocab, merges, o.Special, o.Added, o.Pattern)
}

func marshalTokenizer(vocab []string, merges [][2]string, special, added []string, pattern string) ([]byte, error) {
	type addedJSON struct {
		ID         int    `json:"id"`
		Content    string `json:"content"`
		SingleWord bool   `json:"single_word"`
		LStrip     bool   `json:"lstrip"`
		RStrip     bool   `json:"rstrip"`
		Normalized bool   `json:"normalized"`
		Special    bool   `json:"special"`
	}
	var at []addedJSON
	for i, s := range special {
		at = append(at, addedJSON{ID: len(vocab) + i, Content: s, Special: true})
	}
	for i, s := range added {
		at = append(at, addedJSON{ID: len(vocab) + len(special) + i, Content: s})
	}
	v := make(map[string]int, len(vocab))
	for i, s := range vocab {
		v[s] = i
	}
	ms := make([][]string, len(merges))
	for i, m := range merges {
		ms[i] = []string{m[0], m[1]}
	}
	byteLevel := map[string]any{"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": false, "use_regex": false}
	doc := map[string]any{
		"version":      "1.0",
		"truncation":   nil,
		"padding":      nil,
		"added_tokens": at,
		"normalizer":   map[string]any{"type": "NFC"},
		"pre_tokenizer": map[string]any{"type": "Sequence", "pretokenizers": []any{
			map[string]any{"type": "Split", "pattern": map[string]any{"Regex": pattern}, "behavior": "Isolated", "invert": false},
			byteLevel,
		}},
		"post_processor": byteLevel,
		"decoder":        byteLevel,
		"model": map[string]any{
			"type": "BPE", "dropout": nil, "unk_token": nil, "continuing_subword_prefix": "", "end_of_word_suffix": "",
			"fuse_unk": false, "byte_fallback": false, "ignore_merges": false, "vocab": v, "merges": ms,
		},
	}
	return json.MarshalIndent(doc, "", "  ")
}

// QwenPattern is the pre-tokenizer regex that PreTokenize implements.
const QwenPattern = `(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`

// WriteConfig writes a tokenizer_config.json for a ChatML tokenizer with the
// given chat template, as Qwen's own files declare it.
func WriteConfig(dir string, t *Tokenizer, chatTemplate string, maxLength int) error {
	decoder := map[string]any{}
	for _, a := range t.added {
		decoder[fmt.Sprint(a.ID)] = map[string]any{"content": a.Content, "lstrip": false, "normalized": false, "rstrip": false, "single_word": false, "special": a.Special}
	}
	cfg := map[string]any{
		"add_bos_token": false, "add_prefix_space": false, "added_tokens_decoder": decoder,
		"bos_token": nil, "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>", "unk_token": nil,
		"chat_template": chatTemplate, "clean_up_tokenization_spaces": false, "errors": "replace",
		"model_max_length": maxLength, "split_special_tokens": false, "tokenizer_class": "Qwen2Tokenizer",
	}
	raw, err := json.MarshalIndent(cfg, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, "tokenizer_config.json"), raw, 0o644)
}
