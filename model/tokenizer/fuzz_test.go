package tokenizer

import (
	"testing"
)

// FuzzParse: tokenizer.json bytes of any shape parse with an error or as a
// tokenizer that encodes any text into ids it can decode. `make test` runs
// the seeds; `make fuzz` explores.
func FuzzParse(f *testing.F) {
	texts := []string{"Laimford is a town in Baipeaia.", "<think>1838: Wipynd Labs.</think>", "héllo 世界 🙂"}
	good, err := Train(texts, TrainOptions{VocabSize: 300, Special: ChatML, Added: AgeMemTags, Pattern: WordsPattern})
	if err != nil {
		f.Fatal(err)
	}
	f.Add(good, "Laimford <|im_start|>héllo")
	f.Add([]byte(`{"model":{"type":"BPE","vocab":{"a":0},"merges":[]},"added_tokens":[{"id":-3,"content":"<x>"}]}`), "a")
	f.Add([]byte(`{"model":{"type":"BPE","vocab":{"a":2000000000},"merges":[]}}`), "a")
	f.Add([]byte(`{"model":{"type":"BPE","vocab":{"a":0},"merges":["a a"]}}`), "aa")
	f.Fuzz(func(t *testing.T, raw []byte, text string) {
		tok, err := Parse(raw)
		if err != nil {
			return
		}
		ids := tok.Encode(text)
		for _, id := range ids {
			if id < 0 || id >= tok.VocabSize() {
				t.Fatalf("Encode(%q) gave id %d outside the vocabulary of %d", text, id, tok.VocabSize())
			}
		}
		tok.Decode(ids, false)
		tok.Decode(ids, true)
	})
}
