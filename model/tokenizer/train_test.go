package tokenizer

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/text/unicode/norm"
)

func trainingCorpus() []string {
	var texts []string
	names := []string{"Marla Quenby", "Velden", "Asca River", "Quaisil Industries", "Foutral Labs"}
	for i := range 300 {
		n := names[i%len(names)]
		texts = append(texts,
			fmt.Sprintf("%s is a town in Norvia with about %d people.", n, 1000+i*37),
			fmt.Sprintf("<|im_start|>user\nWhere was %s founded?<|im_end|>\n<|im_start|>assistant\n<think>Retrieve it.</think>\n<tool_call>[{\"name\": \"Retrieve_memory\", \"arguments\": {\"query\": \"%s\"}}]</tool_call><|im_end|>", n, n),
		)
	}
	return texts
}

func TestTrainedTokenizerLoadsAndRoundTrips(t *testing.T) {
	texts := trainingCorpus()
	opt := TrainOptions{VocabSize: 360, Special: ChatML, Added: AgeMemTags}
	raw, err := Train(texts, opt)
	if err != nil {
		t.Fatal(err)
	}
	again, _ := Train(texts, opt)
	if !bytes.Equal(raw, again) {
		t.Fatal("training is not deterministic")
	}
	tok, err := Parse(raw)
	if err != nil {
		t.Fatal(err)
	}
	if tok.VocabSize() != 360 {
		t.Fatalf("vocab size %d, want 360", tok.VocabSize())
	}
	var bytesIn, tokensOut int
	for _, s := range append(texts, "unseen: Zyxw 12345 中文 👍 ünïcode") {
		ids := tok.Encode(s)
		if got := tok.Decode(ids, false); got != norm.NFC.String(s) {
			t.Fatalf("round trip of %q gave %q", s, got)
		}
		bytesIn += len(s)
		tokensOut += len(ids)
	}
	if float64(bytesIn)/float64(tokensOut) < 2.5 {
		t.Fatalf("%.2f bytes per token: the merges do not compress", float64(bytesIn)/float64(tokensOut))
	}
	for _, s := range append(append([]string{}, ChatML...), AgeMemTags...) {
		if ids := tok.Encode(s); len(ids) != 1 {
			t.Fatalf("%s encodes to %v, want one id", s, ids)
		}
	}
	if id, _ := tok.TokenID("<|im_end|>"); !tok.IsSpecial(id) {
		t.Fatal("<|im_end|> must be special")
	}
	if _, err := Train(texts, TrainOptions{VocabSize: 100}); err == nil {
		t.Fatal("a vocabulary below 256 bytes must be refused")
	}
}

// TestTrainedTokenizerMatchesReference loads the trained files with the
// reference implementation (transformers.js): the same ids prove the file
// is a valid Hugging Face tokenizer and means what we think.
//
// With WordsPattern a word is cut the same after a space, a quote or a
// tag, which is what it is for.
func TestTrainedTokenizerMatchesReference(t *testing.T) {
	for _, pattern := range []string{QwenPattern, WordsPattern, NamesPattern} {
		checkTrainedAgainstReference(t, pattern)
	}
	raw, err := Train(trainingCorpus(), TrainOptions{VocabSize: 500, Special: ChatML, Added: AgeMemTags, Pattern: WordsPattern})
	if err != nil {
		t.Fatal(err)
	}
	tok, err := Parse(raw)
	if err != nil {
		t.Fatal(err)
	}
	name := tok.Encode("Gamair Trading ")
	for _, s := range []string{"By the way, Gamair Trading Company.", `{"content":"Gamair Trading Company"}`, "<answer>Gamair Trading Company</answer>"} {
		if ids := tok.Encode(s); !containsRun(ids, name) {
			t.Errorf("%q: %v does not contain the name's ids %v", s, ids, name)
		}
	}
	if _, err := Train(trainingCorpus(), TrainOptions{VocabSize: 500, Pattern: "\\w+"}); err == nil {
		t.Fatal("an unknown pattern must be refused")
	}
}

// Under NamesPattern a name is the same ids wherever it stands: after a
// space, a quote, a tag or a colon and before a space, a full stop, a quote
// or a tag. Under WordsPattern its last word differs before a space, which
// is how a memory ("Pebrond Wemound is a composer") holds it.
func TestNamesPatternCutsANameTheSameEverywhere(t *testing.T) {
	texts := append(trainingCorpus(), "Pebrond Wemound is a composer born in 1980.", "Who was born first, Pebrond Wemound or Bozo Moquil?")
	places := []string{"Pebrond Wemound is a composer born in 1980.", `{"content":"Pebrond Wemound"}`, "<answer>Pebrond Wemound</answer>",
		"1980: Pebrond Wemound. The earlier is 1878: Bozo Moquil.", "Who was born first, Pebrond Wemound or Bozo Moquil?"}
	for _, c := range []struct {
		pattern string
		same    bool
	}{{NamesPattern, true}, {WordsPattern, false}} {
		raw, err := Train(texts, TrainOptions{VocabSize: 500, Special: ChatML, Added: AgeMemTags, Pattern: c.pattern})
		if err != nil {
			t.Fatal(err)
		}
		tok, err := Parse(raw)
		if err != nil {
			t.Fatal(err)
		}
		name := tok.Encode("Pebrond Wemound")
		var missing []string
		for _, s := range places {
			if !containsRun(tok.Encode(s), name) {
				missing = append(missing, s)
			}
		}
		if same := len(missing) == 0; same != c.same {
			t.Errorf("pattern %q: the name's ids in every place %v, want %v (not in %q)", c.pattern, same, c.same, missing)
		}
	}
	if got, want := PreTokenizeNames("Pebrond Wemound is a composer, born in 1980.\n<answer>Zoë Ölund</answer>"),
		[]string{"Pebrond", " ", "Wemound", " ", "is ", "a ", "composer", ",", " ", "born ", "in ", "1", "9", "8", "0", ".", "\n", "<", "answer", ">", "Zoë", " ", "Ölund", "</", "answer", ">"}; fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("PreTokenizeNames: %q, want %q", got, want)
	}
}

// A tokenizer.json whose Split regex is none this package cuts is refused,
// not cut with Qwen's regex: the ids would not be the ones its model knows.
func TestLoadRefusesAnUnknownSplitRegex(t *testing.T) {
	raw, err := Train(trainingCorpus(), TrainOptions{VocabSize: 300, Pattern: NamesPattern})
	if err != nil {
		t.Fatal(err)
	}
	llama3 := `(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`
	q, _ := json.Marshal(NamesPattern)
	l, _ := json.Marshal(llama3)
	if !bytes.Contains(raw, q) {
		t.Fatalf("the trained file does not hold NamesPattern %s", q)
	}
	_, err = Parse(bytes.Replace(raw, q, l, 1))
	if err == nil || !strings.Contains(err.Error(), "Split regex") {
		t.Fatalf("an unknown Split regex: got %v, want an error naming it", err)
	}
}

func containsRun(ids, run []int) bool {
	for i := 0; i+len(run) <= len(ids); i++ {
		if fmt.Sprint(ids[i:i+len(run)]) == fmt.Sprint(run) {
			return true
		}
	}
	return false
}

func checkTrainedAgainstReference(t *testing.T, pattern string) {
	_, prefix := qwen3(t)
	raw, err := Train(trainingCorpus(), TrainOptions{VocabSize: 500, Special: ChatML, Added: AgeMemTags, Pattern: pattern})
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "tokenizer.json"), raw, 0o644)
	tok, err := Load(filepath.Join(dir, "tokenizer.json"))
	if err != nil {
		t.Fatal(err)
	}
	if err := WriteConfig(dir, tok, "{{ messages }}", 8192); err != nil {
		t.Fatal(err)
	}
	texts := append(corpus()[:100], trainingCorpus()[:20]...)
	want := reference(t, prefix, texts, dir)
	for i, s := range texts {
		if got := tok.Encode(s); fmt.Sprint(got) != fmt.Sprint(want[i]) {
			t.Fatalf("%q:\n ours %v\n  ref %v", s, got, want[i])
		}
	}
	if !strings.Contains(string(raw), `"type": "BPE"`) {
		t.Fatal("not a BPE tokenizer.json")
	}
}

// Under WordsPattern a year is four digit tokens, as under Qwen's pattern; a
// tokenizer trained with the earlier WordsRunsPattern (a number a token)
// keeps cutting numbers whole when it is loaded again.
func TestWordsPatternCutsDigits(t *testing.T) {
	var texts []string
	for i := range 400 {
		texts = append(texts, fmt.Sprintf("Marla Quenby was born in %d.", 1820+i%5))
	}
	pieces := func(pattern string) []string {
		raw, err := Train(texts, TrainOptions{VocabSize: 320, Special: ChatML, Pattern: pattern})
		if err != nil {
			t.Fatal(err)
		}
		tok, err := Parse(raw)
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, id := range tok.Encode("born in 1822.") {
			out = append(out, tok.Decode([]int{id}, false))
		}
		return out
	}
	if got, want := pieces(WordsPattern), []string{"born ", "in ", "1", "8", "2", "2", "."}; fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("WordsPattern: %q, want %q", got, want)
	}
	if got, want := pieces(WordsRunsPattern), []string{"born ", "in ", "1822", "."}; fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("WordsRunsPattern: %q, want %q", got, want)
	}
	if got, want := PreTokenizeWords("in 1822 people, 7"), []string{"in ", "1", "8", "2", "2", " ", "people", ",", " ", "7"}; fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("PreTokenizeWords: %q, want %q", got, want)
	}
}
