package sft

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/agemem/agemem/kernels/cpu"
	"github.com/agemem/agemem/llm"
	"github.com/agemem/agemem/llm/native"
	"github.com/agemem/agemem/model/chat"
	"github.com/agemem/agemem/model/optim"
	"github.com/agemem/agemem/model/qwen"
	"github.com/agemem/agemem/model/safetensors"
	"github.com/agemem/agemem/model/tokenizer"
)

// TestSFTTeachesInContextCopying: SFT teaches a micro model to say back a
// word it was told: the word after "Word:" at the end of the user's message,
// after up to three other words of the same twelve, so only the context
// says which. Untrained it says none of them; after 120 steps, every
// held-out one. This is copying at its simplest (a single-token word at a
// fixed place); copying the sentences of AgeMem's Stage 1 is beyond the
// models CPU minutes train (README, "Demo results").
func TestSFTTeachesInContextCopying(t *testing.T) {
	if testing.Short() {
		t.Skip("trains for about 15 s")
	}
	dir := t.TempDir()
	r := rand.New(rand.NewPCG(1, 1))
	words := strings.Fields("apple brick cloud drum eagle flint grape harp iris jade kite lemon")
	var corpus []string
	mk := func(w string, filler int) []map[string]any {
		var pad []string
		for range filler {
			pad = append(pad, words[r.IntN(len(words))])
		}
		return []map[string]any{{"role": "system", "content": "Repeat the word."}, {"role": "user", "content": strings.Join(pad, " ") + " Word: " + w}, {"role": "assistant", "content": w}}
	}
	for range 2000 {
		raw, _ := json.Marshal(map[string]any{"messages": mk(words[r.IntN(len(words))], r.IntN(4))})
		corpus = append(corpus, string(raw))
	}
	model, _ := microPolicy(t, dir, corpus, 400, "qwen3")
	c := DefaultConfig()
	c.Data, c.Out, c.Steps, c.BatchTokens, c.LR, c.EvalEvery, c.SaveEvery = filepath.Join(dir, "d.jsonl"), filepath.Join(dir, "out"), 120, 2048, 3e-3, 0, 0
	res, err := Run(context.Background(), Options{Config: c, Model: model, Optim: optim.DefaultConfig(), Dtype: safetensors.F32, Seed: 1, Log: io.Discard})
	if err != nil {
		t.Fatal(err)
	}
	copied := func(dir string) int {
		cp, err := native.Open(cpu.New(), dir, "", qwen.Options{})
		if err != nil {
			t.Fatal(err)
		}
		defer cp.Model.Close()
		g := cp.Start(native.Options{Sampling: llm.Sampling{MaxTokens: 4}})
		defer g.Close()
		r := rand.New(rand.NewPCG(9, 9)) // held-out fillers
		ok := 0
		for i := range 48 {
			w := words[i%len(words)]
			m := mk(w, r.IntN(4))
			comp, err := g.Chat(context.Background(), llm.Request{Messages: []chat.Message{{Role: "system", Content: m[0]["content"].(string)}, {Role: "user", Content: m[1]["content"].(string)}}})
			if err != nil {
				t.Fatal(err)
			}
			if strings.TrimSpace(comp.Message.Content) == w {
				ok++
			}
		}
		return ok
	}
	before, after := copied(model), copied(res.Policy)
	t.Logf("held-out words said back: %d/48 untrained, %d/48 after SFT", before, after)
	if before > 8 || after < 44 {
		t.Fatalf("said back %d/48 untrained, %d/48 after SFT", before, after)
	}
}

// TestSFTTeachesCopyingToldFacts: SFT teaches a micro policy to answer from
// a fact it was told: "Bakori is a town in Nemarfen. Which country is
// Bakori in?", answered "Nemarfen". Every held-out country is a name
// training never answered (syllables drawn afresh: several tokens each),
// so only copying the tokens after "in" answers it; the untrained model
// answers none, the SFT'd one (500 steps) 40 of 60 (46 with other
// training draws; the test asks for half). With a second fact to
// choose between (finding the asked town first), 300 steps answered 1 of
// 60: that needs the induction make demo's copy pretraining builds (README,
// "Demo results"), beyond CI's minutes.
func TestSFTTeachesCopyingToldFacts(t *testing.T) {
	if testing.Short() {
		t.Skip("trains for about a minute")
	}
	const steps = 500
	dir := t.TempDir()
	r := rand.New(rand.NewPCG(2, 2))
	syl := strings.Fields("ba ko ri mu te la vo ne si da pu gor fen thal wick mar")
	seen := map[string]bool{}
	name := func(r *rand.Rand) string {
		var b strings.Builder
		for range 2 + r.IntN(2) {
			b.WriteString(syl[r.IntN(len(syl))])
		}
		s := b.String()
		return strings.ToUpper(s[:1]) + s[1:]
	}
	mk := func(r *rand.Rand) ([]map[string]any, string) {
		town, country := name(r), name(r)
		user := fmt.Sprintf("%s is a town in %s. Which country is %s in?", town, country, town)
		return []map[string]any{{"role": "user", "content": user}, {"role": "assistant", "content": country}}, country
	}
	var corpus []string
	for range 4000 {
		m, ans := mk(r)
		seen[ans] = true
		raw, _ := json.Marshal(map[string]any{"messages": m})
		corpus = append(corpus, string(raw))
	}
	model, tok := microPolicy(t, dir, corpus, 320, "qwen2")
	c := DefaultConfig()
	c.Data, c.Out, c.Steps, c.BatchTokens, c.LR, c.EvalEvery, c.SaveEvery = filepath.Join(dir, "d.jsonl"), filepath.Join(dir, "out"), steps, 4096, 3e-3, 0, 0
	res, err := Run(context.Background(), Options{Config: c, Model: model, Optim: optim.DefaultConfig(), Dtype: safetensors.F32, Seed: 1, Log: io.Discard})
	if err != nil {
		t.Fatal(err)
	}
	const n = 60
	answered := func(dir string) (ok, multi int) {
		cp, err := native.Open(cpu.New(), dir, "", qwen.Options{})
		if err != nil {
			t.Fatal(err)
		}
		defer cp.Model.Close()
		g := cp.Start(native.Options{Sampling: llm.Sampling{MaxTokens: 8}})
		defer g.Close()
		r := rand.New(rand.NewPCG(9, 9))
		for i := 0; i < n; {
			m, ans := mk(r)
			if seen[ans] {
				continue // only countries training never answered
			}
			i++
			comp, err := g.Chat(context.Background(), llm.Request{Messages: []chat.Message{{Role: "user", Content: m[0]["content"].(string)}}})
			if err != nil {
				t.Fatal(err)
			}
			if strings.TrimSpace(comp.Message.Content) == ans {
				ok++
				if len(tok.Encode(ans)) > 1 {
					multi++
				}
			}
		}
		return ok, multi
	}
	b0, _ := answered(model)
	a, multi := answered(res.Policy)
	t.Logf("held-out questions answered exactly: %d/%d untrained, %d/%d after %d SFT steps (%d of them several tokens long)", b0, n, a, n, steps, multi)
	if b0 > 0 || a < n/2 || multi < n/2 {
		t.Fatalf("answered %d/%d untrained, %d/%d after SFT (%d several tokens long)", b0, n, a, n, multi)
	}
}

// microPolicy writes records (JSON lines) to dir/d.jsonl, learns a BPE of
// vocab tokens on them (words pre-tokenizer) and a random micro model of
// modelType beside it in dir/m, which it returns with its tokenizer.
func microPolicy(t *testing.T, dir string, records []string, vocab int, modelType string) (string, *tokenizer.Tokenizer) {
	t.Helper()
	if err := os.WriteFile(filepath.Join(dir, "d.jsonl"), []byte(strings.Join(records, "\n")+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	tokRaw, err := tokenizer.Train(records, tokenizer.TrainOptions{VocabSize: vocab, Special: tokenizer.ChatML, Added: tokenizer.AgeMemTags, Pattern: tokenizer.WordsPattern})
	if err != nil {
		t.Fatal(err)
	}
	tok, err := tokenizer.Parse(tokRaw)
	if err != nil {
		t.Fatal(err)
	}
	model := filepath.Join(dir, "m")
	os.MkdirAll(model, 0o755)
	os.WriteFile(filepath.Join(model, "tokenizer.json"), tokRaw, 0o644)
	tokenizer.WriteConfig(model, tok, chat.Qwen25Text, 4096)
	mc := qwen.Config{ModelType: modelType, HiddenSize: 64, Layers: 2, Heads: 4, KVHeads: 2, HeadDim: 16, Intermediate: 128, RMSNormEps: 1e-6, RopeTheta: 1e4, TieEmbeddings: true, VocabSize: tok.VocabSize(), MaxPositions: 4096}
	if err := qwen.InitRandom(model, mc, safetensors.F32, 1); err != nil {
		t.Fatal(err)
	}
	return model, tok
}
