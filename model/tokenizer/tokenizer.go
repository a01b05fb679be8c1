// Package tokenizer reads Hugging Face tokenizer.json files for byte-level
// BPE models (Qwen2, Qwen2.5, Qwen3, GPT-2 style) and encodes and decodes
// exactly as the reference implementation does: added tokens are split out
// first, the rest is NFC-normalised, cut by the Qwen pre-tokenizer, mapped
// byte by byte to printable characters and merged by BPE rank.
package tokenizer

import (
	"encoding/json"
	"fmt"
	"os"
	"sort"
	"strings"
	"sync"

	"golang.org/x/text/unicode/norm"

	"github.com/agemem/agemem/internal/jsonerr"
)

// AddedToken is a token matched verbatim before BPE (special tokens such as
// <|im_start|>, and added ones such as <think>).
type AddedToken struct {
	ID      int    `json:"id"`
	Content string `json:"content"`
	Special bool   `json:"special"`
}

// Tokenizer is a byte-level BPE tokenizer. It is safe for concurrent use.
type Tokenizer struct {
	vocab  map[string]int
	tokens []string // id -> token text (byte-level form, or an added token's content)
	merges map[uint64]merge
	// mergeList keeps the merges in rank order, for writers of other
	// formats (GGUF's tokenizer.ggml.merges).
	mergeList [][2]string
	added     []AddedToken // longest first, for matching
	addedID   map[int]AddedToken
	// addedFirst marks the bytes that start an added token.
	addedFirst [256]bool
	nfc        bool
	// pre cuts text before BPE: Qwen's regex, GPT-2's (a lone ByteLevel
	// pre-tokenizer: GPT-2, RoBERTa), WordsPattern or NamesPattern; prefixSpace adds
	// the leading space ByteLevel's add_prefix_space asks for.
	pre         func(string) []string
	prefixSpace bool
	// pattern is the Split regex pre cuts with ("" for GPT-2's lone
	// ByteLevel), for writers of formats that name their pre-tokenizer.
	pattern string

	cacheMu sync.RWMutex
	cache   map[string][]int
}

type merge struct{ rank, id int }

type fileJSON struct {
	AddedTokens []AddedToken `json:"added_tokens"`
	Normalizer  *struct {
		Type string `json:"type"`
	} `json:"normalizer"`
	PreTokenizer json.RawMessage `json:"pre_tokenizer"`
	Model        struct {
		Type   string            `json:"type"`
		Vocab  map[string]int    `json:"vocab"`
		Merges []json.RawMessage `json:"merges"`
	} `json:"model"`
}

// maxID bounds token ids: the largest vocabularies in use (Gemma's 262k,
// Qwen's 152k) are far below it.
const maxID = 1 << 24

// Load reads a tokenizer.json.
func Load(path string) (*Tokenizer, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	t, err := Parse(raw)
	if err != nil {
		return nil, fmt.Errorf("tokenizer %s: %w", path, err)
	}
	return t, nil
}

// Parse reads tokenizer.json bytes.
func Parse(raw []byte) (*Tokenizer, error) {
	var f fileJSON
	if err := json.Unmarshal(raw, &f); err != nil {
		return nil, fmt.Errorf("not a tokenizer.json: %w", jsonerr.Explain(err))
	}
	if f.Model.Type != "BPE" {
		return nil, fmt.Errorf("model type %q: only byte-level BPE is supported", f.Model.Type)
	}
	if len(f.Model.Vocab) == 0 {
		return nil, fmt.Errorf("model.vocab is empty")
	}
	if f.Normalizer != nil && f.Normalizer.Type != "NFC" {
		return nil, fmt.Errorf("normalizer %q: only NFC (or none) is supported", f.Normalizer.Type)
	}
	t := &Tokenizer{vocab: f.Model.Vocab, merges: map[uint64]merge{}, addedID: map[int]AddedToken{}, cache: map[string][]int{}}
	t.nfc = f.Normalizer != nil
	var pre struct {
		Type           string `json:"type"`
		AddPrefixSpace bool   `json:"add_prefix_space"`
		Pretokenizers  []struct {
			Type    string `json:"type"`
			Pattern struct {
				Regex string `json:"Regex"`
			} `json:"pattern"`
		} `json:"pretokenizers"`
	}
	t.pre, t.pattern = PreTokenize, QwenPattern
	if len(f.PreTokenizer) > 0 && json.Unmarshal(f.PreTokenizer, &pre) == nil {
		switch {
		case pre.Type == "ByteLevel":
			t.pre, t.prefixSpace, t.pattern = PreTokenizeGPT2, pre.AddPrefixSpace, ""
		case pre.Type == "Sequence" && len(pre.Pretokenizers) > 0 && pre.Pretokenizers[0].Type == "Split":
			// A regex cut by hand here or none: cutting with another
			// pattern would give the model token ids it was not trained on.
			regex := pre.Pretokenizers[0].Pattern.Regex
			if t.pre, t.pattern = patterns[regex], regex; t.pre == nil {
				return nil, fmt.Errorf("pre_tokenizer: Split regex %q is not one this tokenizer implements (Qwen's, WordsPattern, NamesPattern)", regex)
			}
		}
	}
	// Ids index a table of every id up to the largest: a corrupt id must
	// be an error, not an index out of range or a table of billions.
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
		n = max(n, a.ID+1)
	}
	t.tokens = make([]string, n)
	for s, id := range f.Model.Vocab {
		t.tokens[id] = s
	}
	for i, m := range f.Model.Merges {
		// Merges are "a b" strings (older files) or ["a", "b"] pairs.
		var a, b string
		var pair []string
		var s string
		if json.Unmarshal(m, &pair) == nil && len(pair) == 2 {
			a, b = pair[0], pair[1]
		} else if json.Unmarshal(m, &s) == nil {
			var ok bool
			if a, b, ok = strings.Cut(s, " "); !ok {
				return nil, fmt.Errorf("merges[%d] = %q is not a pair", i, s)
			}
		} else {
			return nil, fmt.Errorf("merges[%d] is neither \"a b\" nor [a, b]", i)
		}
		ia, oka := t.vocab[a]
		ib, okb := t.vocab[b]
		im, okm := t.vocab[a+b]
		if !oka || !okb || !okm {
			return nil, fmt.Errorf("merges[%d] (%q, %q) names a token missing from the vocab", i, a, b)
		}
		key := uint64(ia)<<32 | uint64(ib)
		if _, dup := t.merges[key]; !dup {
			t.merges[key] = merge{i, im}
		}
		t.mergeList = append(t.mergeList, [2]string{a, b})
	}
	for _, a := range f.AddedTokens {
		if a.Content == "" {
			return nil, fmt.Errorf("added token %d is empty", a.ID)
		}
		t.added = append(t.added, a)
		t.addedFirst[a.Content[0]] = true
		t.addedID[a.ID] = a
		t.tokens[a.ID] = a.Content
	}
	sort.SliceStable(t.added, func(i, j int) bool { return len(t.added[i].Content) > len(t.added[j].Content) })
	for b := range 256 {
		if _, ok := t.vocab[string(byteToRune[b])]; !ok {
			return nil, fmt.Errorf("vocab lacks the byte-level token for byte %#x", b)
		}
	}
	return t, nil
}

// Pattern is the pre-tokenizer regex the tokenizer cuts text with
// (QwenPattern, WordsPattern, ...), or "" for GPT-2's ByteLevel
// pre-tokenizer.
func (t *Tokenizer) Pattern() string { return t.pattern }

// VocabSize is the number of ids, added tokens included.
func (t *Tokenizer) VocabSize() int { return len(t.tokens) }

// Token returns the text of id: a vocab entry in byte-level form, an added
// token's content, or "" for an id no entry names.
func (t *Tokenizer) Token(id int) string {
	if id < 0 || id >= len(t.tokens) {
		return ""
	}
	return t.tokens[id]
}

// IsAdded reports whether id is an added token (special or not).
func (t *Tokenizer) IsAdded(id int) bool {
	_, ok := t.addedID[id]
	return ok
}

// Merges returns the BPE merges in rank order.
func (t *Tokenizer) Merges() [][2]string { return append([][2]string(nil), t.mergeList...) }

// TokenID returns the id of a token (an added token's content, or a vocab
// entry in byte-level form).
func (t *Tokenizer) TokenID(s string) (int, bool) {
	for _, a := range t.added {
		if a.Content == s {
			return a.ID, true
		}
	}
	id, ok := t.vocab[s]
	return id, ok
}

// IsSpecial reports whether id is a special added token.
func (t *Tokenizer) IsSpecial(id int) bool { return t.addedID[id].Special }

// Encode returns the ids of text. Added and special tokens in the text are
// recognised (a chat template's <|im_start|> becomes one id).
func (t *Tokenizer) Encode(text string) []int {
	var ids []int
	for len(text) > 0 {
		pos, tok := t.nextAdded(text)
		if pos < 0 {
			ids = t.encodeOrdinary(ids, text)
			break
		}
		ids = t.encodeOrdinary(ids, text[:pos])
		ids = append(ids, tok.ID)
		text = text[pos+len(tok.Content):]
	}
	return ids
}

// Count implements stm.Tokenizer.
func (t *Tokenizer) Count(text string) int { return len(t.Encode(text)) }

// nextAdded finds the earliest added token in text (longest at a tie) in
// one pass: only positions whose byte starts some added token are tried.
func (t *Tokenizer) nextAdded(text string) (int, AddedToken) {
	for i := 0; i < len(text); i++ {
		if !t.addedFirst[text[i]] {
			continue
		}
		for _, a := range t.added { // longest first
			if strings.HasPrefix(text[i:], a.Content) {
				return i, a
			}
		}
	}
	return -1, AddedToken{}
}

func (t *Tokenizer) encodeOrdinary(ids []int, text string) []int {
	if text == "" {
		return ids
	}
	if t.nfc {
		text = norm.NFC.String(text)
	}
	if t.prefixSpace && !strings.HasPrefix(text, " ") {
		text = " " + text
	}
	for _, piece := range t.pre(text) {
		ids = append(ids, t.bpe(piece)...)
	}
	return ids
}

// bpe encodes one pre-token: its bytes as byte-level symbols, then the
// lowest-ranked adjacent pair merged until none is in the merge table.
func (t *Tokenizer) bpe(piece string) []int {
	t.cacheMu.RLock()
	if ids, ok := t.cache[piece]; ok {
		t.cacheMu.RUnlock()
		return ids
	}
	t.cacheMu.RUnlock()
	syms := make([]int, len(piece))
	for i := 0; i < len(piece); i++ {
		syms[i] = t.vocab[string(byteToRune[piece[i]])]
	}
	for len(syms) > 1 {
		bestRank, bestAt, bestID := -1, -1, 0
		for i := 0; i+1 < len(syms); i++ {
			if m, ok := t.merges[uint64(syms[i])<<32|uint64(syms[i+1])]; ok && (bestRank < 0 || m.rank < bestRank) {
				bestRank, bestAt, bestID = m.rank, i, m.id
			}
		}
		if bestAt < 0 {
			break
		}
		// Merge every occurrence of the best pair, left to right, as the
		// reference does within one step.
		a, b := syms[bestAt], syms[bestAt+1]
		out := syms[:0]
		for i := 0; i < len(syms); i++ {
			if i+1 < len(syms) && syms[i] == a && syms[i+1] == b {
				out = append(out, bestID)
				i++
				continue
			}
			out = append(out, syms[i])
		}
		syms = out
	}
	if len(piece) <= 64 {
		t.cacheMu.Lock()
		if len(t.cache) > 1<<16 {
			t.cache = map[string][]int{}
		}
		t.cache[piece] = syms
		t.cacheMu.Unlock()
	}
	return syms
}

// Decode turns ids back into text; bytes that do not form UTF-8 become
// U+FFFD, as the reference's errors="replace" does. With skipSpecial,
// special tokens are dropped.
func (t *Tokenizer) Decode(ids []int, skipSpecial bool) string {
	var d Decoder
	d.t, d.skipSpecial = t, skipSpecial
	var sb strings.Builder
	for _, id := range ids {
		sb.WriteString(d.Add(id))
	}
	sb.WriteString(d.Flush())
	return sb.String()
}

// Decoder decodes a stream of ids, holding back the bytes of a character
// whose UTF-8 encoding is not complete yet (a token can end mid-character).
type Decoder struct {
	t           *Tokenizer
	skipSpecial bool
	pending     []byte
}

// NewDecoder returns a streaming decoder.
func (t *Tokenizer) NewDecoder(skipSpecial bool) *Decoder {
	return &Decoder{t: t, skipSpecial: skipSpecial}
}

// Add consumes one id and returns the text that is now complete.
func (d *Decoder) Add(id int) string {
	if id < 0 || id >= len(d.t.tokens) {
		return d.flushBytes() + "\uFFFD"
	}
	if a, ok := d.t.addedID[id]; ok {
		if a.Special && d.skipSpecial {
			return ""
		}
		return d.flushBytes() + a.Content
	}
	for _, r := range d.t.tokens[id] {
		b, ok := runeToByte[r]
		if !ok {
			return d.flushBytes() + "\uFFFD"
		}
		d.pending = append(d.pending, b)
	}
	// Emit every complete character; keep a trailing partial one.
	cut := len(d.pending)
	for back := 1; back <= 3 && back <= len(d.pending); back++ {
		c := d.pending[len(d.pending)-back]
		if c&0xC0 != 0x80 { // the start of the last character
			if need := utf8Len(c); need > back {
				cut = len(d.pending) - back
			}
			break
		}
	}
	out := strings.ToValidUTF8(string(d.pending[:cut]), "\uFFFD")
	d.pending = append(d.pending[:0], d.pending[cut:]...)
	return out
}

// Flush returns whatever is held back, invalid bytes replaced.
func (d *Decoder) Flush() string { return d.flushBytes() }

func (d *Decoder) flushBytes() string {
	if len(d.pending) == 0 {
		return ""
	}
	s := strings.ToValidUTF8(string(d.pending), "\uFFFD")
	d.pending = d.pending[:0]
	return s
}

func utf8Len(c byte) int {
	switch {
	case c < 0x80:
		return 1
	case c>>5 == 0x6:
		return 2
	case c>>4 == 0xE:
		return 3
	case c>>3 == 0x1E:
		return 4
	}
	return 1
}

// byteToRune is GPT-2's bytes_to_unicode: printable bytes stand for
// themselves, the others are shifted to code points from 256 up.
var byteToRune, runeToByte = func() ([256]rune, map[rune]byte) {
	var b2r [256]rune
	r2b := map[rune]byte{}
	n := 0
	for b := range 256 {
		if (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF) {
			b2r[b] = rune(b)
		} else {
			b2r[b] = rune(256 + n)
			n++
		}
		r2b[b2r[b]] = byte(b)
	}
	return b2r, r2b
}()
