package bert

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"unicode"

	"golang.org/x/text/unicode/norm"

	"github.com/agemem/agemem/internal/jsonerr"
)

// WordPiece is BERT's tokenizer: the BertNormalizer (control characters
// dropped, whitespace unified, CJK characters spaced out, optional
// lowercasing and accent stripping), the BertPreTokenizer (whitespace and
// punctuation split) and greedy longest-match-first WordPiece with the
// "##" continuation prefix, as Hugging Face's tokenizers does.
type WordPiece struct {
	vocab    map[string]int
	tokens   []string
	Lower    bool
	Strip    bool // strip accents (defaults to Lower, as BERT's does)
	Prefix   string
	MaxChars int
	UNK      int
	CLS, SEP int
	PAD      int
	special  map[string]int // matched verbatim before normalisation
}

// LoadWordPiece reads dir/tokenizer.json (a WordPiece model) or, without
// one, dir/vocab.txt with tokenizer_config.json's do_lower_case.
func LoadWordPiece(dir string) (*WordPiece, error) {
	if raw, err := os.ReadFile(filepath.Join(dir, "tokenizer.json")); err == nil {
		w, err := ParseWordPieceJSON(raw)
		if err != nil {
			return nil, fmt.Errorf("%s/tokenizer.json: %w", dir, err)
		}
		return w, nil
	}
	path := filepath.Join(dir, "vocab.txt")
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("%s has neither tokenizer.json nor vocab.txt: %w", dir, err)
	}
	defer f.Close()
	var toks []string
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<16), 1<<20)
	for sc.Scan() {
		toks = append(toks, strings.TrimRight(sc.Text(), "\r"))
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	lower := true
	if raw, err := os.ReadFile(filepath.Join(dir, "tokenizer_config.json")); err == nil {
		var tc struct {
			DoLower *bool `json:"do_lower_case"`
		}
		if json.Unmarshal(raw, &tc) == nil && tc.DoLower != nil {
			lower = *tc.DoLower
		}
	}
	w, err := NewWordPiece(toks, lower)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return w, nil
}

// NewWordPiece builds a tokenizer over tokens (id = index), with BERT's
// special tokens, which must be present.
func NewWordPiece(tokens []string, lower bool) (*WordPiece, error) {
	w := &WordPiece{vocab: make(map[string]int, len(tokens)), tokens: tokens, Lower: lower, Strip: lower,
		Prefix: "##", MaxChars: 100, special: map[string]int{}}
	for i, t := range tokens {
		w.vocab[t] = i // a repeated line takes the later id, as transformers' load_vocab does
	}
	for _, s := range []struct {
		name string
		id   *int
	}{{"[UNK]", &w.UNK}, {"[CLS]", &w.CLS}, {"[SEP]", &w.SEP}, {"[PAD]", &w.PAD}} {
		id, ok := w.vocab[s.name]
		if !ok {
			return nil, fmt.Errorf("the vocabulary has no %s token", s.name)
		}
		*s.id = id
		w.special[s.name] = id
	}
	if id, ok := w.vocab["[MASK]"]; ok {
		w.special["[MASK]"] = id
	}
	return w, nil
}

// maxID bounds token ids (as the BPE tokenizer's): a corrupt file's id in
// the billions must be an error, not a table of billions of entries.
const maxID = 1 << 24

// ParseWordPieceJSON reads a tokenizer.json whose model is WordPiece.
func ParseWordPieceJSON(raw []byte) (*WordPiece, error) {
	var f struct {
		AddedTokens []struct {
			ID      int    `json:"id"`
			Content string `json:"content"`
		} `json:"added_tokens"`
		Normalizer *struct {
			Type         string `json:"type"`
			Lowercase    bool   `json:"lowercase"`
			StripAccents *bool  `json:"strip_accents"`
		} `json:"normalizer"`
		Model struct {
			Type     string         `json:"type"`
			Vocab    map[string]int `json:"vocab"`
			Prefix   string         `json:"continuing_subword_prefix"`
			MaxChars int            `json:"max_input_chars_per_word"`
		} `json:"model"`
	}
	if err := json.Unmarshal(raw, &f); err != nil {
		return nil, fmt.Errorf("not a tokenizer.json: %w", jsonerr.Explain(err))
	}
	if f.Model.Type != "WordPiece" {
		return nil, fmt.Errorf("model type %q is not WordPiece", f.Model.Type)
	}
	n := 0
	for s, id := range f.Model.Vocab {
		if id < 0 || id >= maxID {
			return nil, fmt.Errorf("vocab entry %q has id %d, outside [0, %d)", s, id, maxID)
		}
		n = max(n, id+1)
	}
	for _, a := range f.AddedTokens {
		if a.ID < 0 || a.ID >= maxID {
			return nil, fmt.Errorf("added token %q has id %d, outside [0, %d)", a.Content, a.ID, maxID)
		}
		if a.Content == "" {
			return nil, fmt.Errorf("added token %d is empty (it would match everywhere)", a.ID)
		}
		n = max(n, a.ID+1)
	}
	toks := make([]string, n)
	for s, id := range f.Model.Vocab {
		toks[id] = s
	}
	for _, a := range f.AddedTokens { // ids past the model's vocabulary count too
		if toks[a.ID] == "" {
			toks[a.ID] = a.Content
		}
	}
	lower := false
	if f.Normalizer != nil {
		if f.Normalizer.Type != "BertNormalizer" {
			return nil, fmt.Errorf("normalizer %q: only BertNormalizer is supported", f.Normalizer.Type)
		}
		lower = f.Normalizer.Lowercase
	}
	w, err := NewWordPiece(toks, lower)
	if err != nil {
		return nil, err
	}
	if f.Normalizer != nil && f.Normalizer.StripAccents != nil {
		w.Strip = *f.Normalizer.StripAccents
	}
	if f.Model.Prefix != "" {
		w.Prefix = f.Model.Prefix
	}
	if f.Model.MaxChars > 0 {
		w.MaxChars = f.Model.MaxChars
	}
	for _, a := range f.AddedTokens {
		w.special[a.Content] = a.ID
	}
	return w, nil
}

// VocabSize is the number of ids.
func (w *WordPiece) VocabSize() int { return len(w.tokens) }

// Encode returns [CLS] tokens [SEP], truncated to at most maxLen ids
// (0: no limit) as Hugging Face's truncation does: the end is cut, [SEP]
// kept.
func (w *WordPiece) Encode(text string, maxLen int) []int {
	ids := []int{w.CLS}
	for _, part := range w.splitSpecial(text) {
		if id, ok := w.special[part]; ok {
			ids = append(ids, id)
			continue
		}
		for _, word := range w.preTokenize(w.normalize(part)) {
			ids = w.wordPiece(ids, word)
		}
	}
	if maxLen > 1 && len(ids)+1 > maxLen {
		ids = ids[:maxLen-1]
	}
	return append(ids, w.SEP)
}

// splitSpecial cuts out special tokens written in the text ([MASK]).
func (w *WordPiece) splitSpecial(text string) []string {
	var out []string
	for text != "" {
		at, which := -1, ""
		for s := range w.special {
			if i := strings.Index(text, s); i >= 0 && (at < 0 || i < at || (i == at && len(s) > len(which))) {
				at, which = i, s
			}
		}
		if at < 0 {
			out = append(out, text)
			break
		}
		if at > 0 {
			out = append(out, text[:at])
		}
		out = append(out, which)
		text = text[at+len(which):]
	}
	return out
}

func (w *WordPiece) normalize(s string) string {
	var b strings.Builder
	for _, r := range s {
		switch {
		case r == 0 || r == 0xFFFD || isControl(r):
			continue
		case isWhitespace(r):
			b.WriteRune(' ')
		case isCJK(r):
			b.WriteRune(' ')
			b.WriteRune(r)
			b.WriteRune(' ')
		default:
			b.WriteRune(r)
		}
	}
	out := b.String()
	if w.Strip {
		var sb strings.Builder
		for _, r := range norm.NFD.String(out) {
			if !unicode.Is(unicode.Mn, r) {
				sb.WriteRune(r)
			}
		}
		out = sb.String()
	}
	if w.Lower {
		out = strings.ToLower(out)
	}
	return out
}

// preTokenize splits on whitespace and isolates every punctuation
// character.
func (w *WordPiece) preTokenize(s string) []string {
	var out []string
	var cur []rune
	flush := func() {
		if len(cur) > 0 {
			out = append(out, string(cur))
			cur = cur[:0]
		}
	}
	for _, r := range s {
		switch {
		case unicode.IsSpace(r):
			flush()
		case isPunct(r):
			flush()
			out = append(out, string(r))
		default:
			cur = append(cur, r)
		}
	}
	flush()
	return out
}

// wordPiece appends the greedy longest-match pieces of word, or [UNK] for
// a word that cannot be covered or is too long.
func (w *WordPiece) wordPiece(ids []int, word string) []int {
	rs := []rune(word)
	if len(rs) > w.MaxChars {
		return append(ids, w.UNK)
	}
	start := len(ids)
	for lo := 0; lo < len(rs); {
		hi, found := len(rs), -1
		for ; hi > lo; hi-- {
			sub := string(rs[lo:hi])
			if lo > 0 {
				sub = w.Prefix + sub
			}
			if id, ok := w.vocab[sub]; ok {
				found = id
				break
			}
		}
		if found < 0 {
			return append(ids[:start], w.UNK)
		}
		ids = append(ids, found)
		lo = hi
	}
	return ids
}

func isWhitespace(r rune) bool {
	return r == ' ' || r == '\t' || r == '\n' || r == '\r' || unicode.Is(unicode.Zs, r)
}

func isControl(r rune) bool {
	if r == '\t' || r == '\n' || r == '\r' {
		return false
	}
	return unicode.In(r, unicode.Cc, unicode.Cf, unicode.Co, unicode.Cs)
}

// isPunct is BERT's: ASCII non-alphanumeric symbols and Unicode P*.
func isPunct(r rune) bool {
	if (r >= 33 && r <= 47) || (r >= 58 && r <= 64) || (r >= 91 && r <= 96) || (r >= 123 && r <= 126) {
		return true
	}
	return unicode.IsPunct(r)
}

func isCJK(r rune) bool {
	return (r >= 0x4E00 && r <= 0x9FFF) || (r >= 0x3400 && r <= 0x4DBF) || (r >= 0x20000 && r <= 0x2A6DF) ||
		(r >= 0x2A700 && r <= 0x2B73F) || (r >= 0x2B740 && r <= 0x2B81F) || (r >= 0x2B820 && r <= 0x2CEAF) ||
		(r >= 0xF900 && r <= 0xFAFF) || (r >= 0x2F800 && r <= 0x2FA1F)
}
