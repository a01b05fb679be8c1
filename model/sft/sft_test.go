package sft

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/agemem/agemem/env/pretrain"
	"github.com/agemem/agemem/memtools"
	"github.com/agemem/agemem/model/chat"
	"github.com/agemem/agemem/model/lora"
	"github.com/agemem/agemem/model/optim"
	"github.com/agemem/agemem/model/qwen"
	"github.com/agemem/agemem/model/safetensors"
	"github.com/agemem/agemem/model/tokenizer"
	"github.com/agemem/agemem/model/train"
)

var (
	names = []string{"Ada", "Bram", "Cleo", "Dov", "Esme", "Finn", "Gus", "Hana", "Ivo", "Jun", "Kai", "Lea"}
	jobs  = []string{"a baker", "a pilot", "a chemist", "a poet", "a judge", "a farmer"}
)

// records writes n chat records in both styles a user may bring: the
// AgeMem format in content, and OpenAI tool_calls with tool results.
func records(t *testing.T, path string, n int, seed uint64) []string {
	r := rand.New(rand.NewPCG(seed, 1))
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var texts []string
	for i := range n {
		who, job := names[r.IntN(len(names))], jobs[r.IntN(len(jobs))]
		fact := fmt.Sprintf("%s is %s.", who, job)
		var msgs []map[string]any
		sys := map[string]any{"role": "system", "content": "You keep facts in memory with tools."}
		if i%2 == 0 {
			call := fmt.Sprintf(`<think>A fact to keep.</think>
<tool_call>[{"name":"Add_memory","arguments":{"content":%q}}]</tool_call>`, fact)
			msgs = []map[string]any{sys, {"role": "user", "content": "Note: " + fact}, {"role": "assistant", "content": call}}
		} else {
			msgs = []map[string]any{sys, {"role": "user", "content": "Note: " + fact},
				{"role": "assistant", "content": "", "tool_calls": []map[string]any{{"type": "function", "function": map[string]any{"name": "Add_memory", "arguments": map[string]any{"content": fact}}}}},
				{"role": "tool", "content": `{"status":"success"}`, "tool_call_id": "c1"},
				{"role": "assistant", "content": "<think>Stored.</think>\n<answer>Noted.</answer>"}}
		}
		raw, _ := json.Marshal(map[string]any{"messages": msgs})
		f.Write(append(raw, '\n'))
		texts = append(texts, string(raw))
	}
	return texts
}

// tinyPolicy trains a small tokenizer on the records and writes a random
// tiny Qwen3 with it.
func tinyPolicy(t *testing.T, texts []string) string {
	dir := t.TempDir()
	raw, err := tokenizer.Train(texts, tokenizer.TrainOptions{VocabSize: 420, Special: tokenizer.ChatML, Added: tokenizer.AgeMemTags})
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "tokenizer.json"), raw, 0o644); err != nil {
		t.Fatal(err)
	}
	tok, err := tokenizer.Parse(raw)
	if err != nil {
		t.Fatal(err)
	}
	if err := tokenizer.WriteConfig(dir, tok, chat.Qwen3Text, 512); err != nil {
		t.Fatal(err)
	}
	cfg := qwen.Config{ModelType: "qwen3", HiddenSize: 48, Layers: 2, Heads: 4, KVHeads: 2, HeadDim: 12, Intermediate: 96,
		RMSNormEps: 1e-6, RopeTheta: 1e4, TieEmbeddings: true, VocabSize: tok.VocabSize(), MaxPositions: 512}
	if err := qwen.InitRandom(dir, cfg, safetensors.F32, 1); err != nil {
		t.Fatal(err)
	}
	return dir
}

func TestLoadMasksAssistantTokens(t *testing.T) {
	dir := t.TempDir()
	data := filepath.Join(dir, "sft.jsonl")
	texts := records(t, data, 4, 1)
	model := tinyPolicy(t, texts)
	tok, err := tokenizer.Load(filepath.Join(model, "tokenizer.json"))
	if err != nil {
		t.Fatal(err)
	}
	learned := func(e Example) string {
		var ids []int
		for j, id := range e.Seq.IDs {
			if e.Seq.Loss[j] {
				ids = append(ids, id)
			}
		}
		return tok.Decode(ids, false)
	}
	// Qwen2.5's template renders every prefix of a conversation unchanged,
	// so a record is one example whose every assistant turn is learned.
	for _, lossOn := range []string{"last", "all"} {
		ex, err := Load(data, tok, chat.Qwen25, lossOn, 0)
		if err != nil {
			t.Fatal(err)
		}
		if len(ex) != 4 {
			t.Fatalf("%s: %d examples from 4 records", lossOn, len(ex))
		}
		for i, e := range ex {
			text := learned(e)
			if !strings.HasSuffix(text, "<|im_end|>") || strings.Contains(text, "Note:") || strings.Contains(text, "<|im_start|>") {
				t.Fatalf("%s record %d learns %q", lossOn, i, text)
			}
			calls := strings.Count(text, "<tool_call>")
			switch {
			case i%2 == 0 && calls != 1:
				t.Fatalf("%s record %d: the AgeMem tool call is not learned: %q", lossOn, i, text)
			case i%2 == 1 && lossOn == "all" && (calls != 1 || !strings.Contains(text, "Noted.")):
				t.Fatalf("all record %d: both assistant turns should be learned: %q", i, text)
			case i%2 == 1 && lossOn == "last" && (calls != 0 || !strings.Contains(text, "Noted.")):
				t.Fatalf("last record %d: only the final reply should be learned: %q", i, text)
			}
		}
	}
	// Qwen3's renders the last assistant turn with a think block that it
	// drops once the turn is history: the first reply of a two-turn record
	// is learned as generated (its own example, think block included), the
	// second in the shared conversation.
	ex, err := Load(data, tok, chat.Qwen3, "all", 0)
	if err != nil {
		t.Fatal(err)
	}
	if len(ex) != 6 {
		t.Fatalf("Qwen3: %d examples from 4 records, want 6", len(ex))
	}
	for i, want := range []string{"<tool_call>", "<think>\n\n</think>\n\n<tool_call>", "Noted.", "<tool_call>", "<think>\n\n</think>\n\n<tool_call>", "Noted."} {
		if text := learned(ex[i]); !strings.Contains(text, want) || strings.Count(text, "<|im_end|>") != 1 {
			t.Fatalf("Qwen3 example %d learns %q, want one turn with %q", i, text, want)
		}
	}
}

// TestConversationsWeightTheirReplies: `data sft`'s merged records learn
// each reply once, weight 0 leaves a reply out, and a weight other than 0
// or 1, or on a message that is not the assistant's, is an error naming it.
func TestConversationsWeightTheirReplies(t *testing.T) {
	tok, err := tokenizer.Parse(mustTrain(t))
	if err != nil {
		t.Fatal(err)
	}
	load := func(line, lossOn string) ([]Example, error) {
		path := filepath.Join(t.TempDir(), "sft.jsonl")
		os.WriteFile(path, []byte(line+"\n"), 0o644)
		return Load(path, tok, chat.Qwen25, lossOn, 0)
	}
	line := `{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo", "weight": 0}, {"role": "user", "content": "there"}, {"role": "assistant", "content": "hey", "weight": 1}]}`
	ex, err := load(line, "all")
	if err != nil {
		t.Fatal(err)
	}
	var ids []int
	for j, id := range ex[0].Seq.IDs {
		if ex[0].Seq.Loss[j] {
			ids = append(ids, id)
		}
	}
	if got := tok.Decode(ids, false); len(ex) != 1 || got != "hey<|im_end|>" {
		t.Fatalf("learned %q in %d examples, want only the weight-1 reply", got, len(ex))
	}
	for _, c := range []struct{ line, want string }{
		{`{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo", "weight": 2}]}`, "messages[1]: weight 2: want 0 or 1"},
		{`{"messages": [{"role": "user", "content": "hi", "weight": 1}, {"role": "assistant", "content": "yo"}]}`, "messages[0]: weight is for assistant messages"},
		{`{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo", "weight": 0}]}`, "no assistant message to learn"},
	} {
		if _, err := load(c.line, "all"); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: error %v, want %q", c.line, err, c.want)
		}
	}
	if _, err := load(`{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo", "weight": 0}]}`, "last"); err == nil || !strings.Contains(err.Error(), "weight 0") {
		t.Errorf("last with a weight-0 final reply: %v", err)
	}
}

func TestLoadNamesBadRecords(t *testing.T) {
	tok, err := tokenizer.Parse(mustTrain(t))
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ line, want string }{
		{`{"messages": [{"role": "user", "content": "hi"}`, "sft.jsonl:2: not a chat record"},
		{`{"messages": []}`, `sft.jsonl:2: no "messages"`},
		{`{"messages": [{"role": "robot", "content": "hi"}]}`, `messages[0]: role "robot"`},
		{`{"messages": [{"role": "user", "content": "hi"}]}`, "no assistant message"},
		{`{"messages": [{"role": "assistant", "content": "a"}, {"role": "user", "content": "b"}]}`, "must end with the assistant message"},
		{`{"messages": [{"role": "user", "content": [{"type": "text"}]}, {"role": "assistant", "content": "a"}]}`, "sft.jsonl:2: not a chat record ({\"messages\": [...]}): messages.content is a JSON array where a string belongs"},
		{`[{"role": "user", "content": "hi"}]`, "a JSON array stands where an object belongs"},
		{`{"messages": [{"role": "assistant", "content": "a", "weight": "1"}]}`, "messages.weight is a JSON string where an integer belongs"},
	} {
		path := filepath.Join(t.TempDir(), "sft.jsonl")
		good := `{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]}`
		os.WriteFile(path, []byte(good+"\n"+c.line+"\n"), 0o644)
		_, err := Load(path, tok, chat.Qwen3, "last", 0)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: error %v, want %q", c.line, err, c.want)
		}
	}
	path := filepath.Join(t.TempDir(), "sft.jsonl")
	os.WriteFile(path, []byte(`{"messages": [{"role": "user", "content": "hi there, this is long"}, {"role": "assistant", "content": "yo"}]}`+"\n"), 0o644)
	if _, err := Load(path, tok, chat.Qwen3, "last", 5); err == nil || !strings.Contains(err.Error(), "exceed the model's 5 positions") {
		t.Errorf("over-long record: %v", err)
	}
}

func mustTrain(t *testing.T) []byte {
	raw, err := tokenizer.Train([]string{"hi there yo"}, tokenizer.TrainOptions{VocabSize: 300, Special: tokenizer.ChatML, Added: tokenizer.AgeMemTags})
	if err != nil {
		t.Fatal(err)
	}
	return raw
}

// TestSFTLearns runs the command's code end to end on a small corpus: the
// held-out loss falls, checkpoints, metrics and the loss curve appear, and
// the tuned policy writes responses the AgeMem parser accepts.
func TestSFTLearns(t *testing.T) {
	dir := t.TempDir()
	data := filepath.Join(dir, "sft.jsonl")
	texts := records(t, data, 120, 2)
	model := tinyPolicy(t, texts)
	o := testOptions(model)
	cfg := &o.Config
	cfg.Data, cfg.Out = data, filepath.Join(dir, "out")
	cfg.Steps, cfg.BatchTokens, cfg.LR, cfg.WarmupSteps = 60, 1024, 1e-2, 5
	cfg.EvalFraction, cfg.EvalEvery, cfg.SaveEvery = 0.1, 20, 30
	// One reply per record: the two reply styles of records() (AgeMem text
	// and Qwen3's think-block tool calls) are too many formats for 60 steps.
	cfg.LossOn = "last"
	o.GenEval, o.WellFormed = 8, memtools.WellFormed
	res, err := Run(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	if !(res.EvalLoss < 0.5*res.EvalLossStart) {
		t.Fatalf("held-out loss %.3f -> %.3f: expected at least halved", res.EvalLossStart, res.EvalLoss)
	}
	if res.ParseOK < res.ParseN*3/4 {
		t.Fatalf("%d of %d generated responses parse", res.ParseOK, res.ParseN)
	}
	for _, f := range []string{"metrics.jsonl", "loss.png", "checkpoint-30/trainer_state.json", "checkpoint-60/params.safetensors", "policy/model.safetensors", "policy/config.json", "policy/tokenizer.json", "policy/tokenizer_config.json"} {
		if _, err := os.Stat(filepath.Join(cfg.Out, f)); err != nil {
			t.Errorf("missing output: %v", err)
		}
	}
	// Resuming from step 30 ends where the uninterrupted run ended.
	o2 := o
	o2.Config.Out, o2.GenEval, o2.Resume = filepath.Join(dir, "out2"), 0, filepath.Join(cfg.Out, "checkpoint-30")
	os.MkdirAll(o2.Config.Out, 0o755)
	res2, err := Run(context.Background(), o2)
	if err != nil {
		t.Fatal(err)
	}
	if res2.TrainEnd != res.TrainEnd || res2.EvalLoss != res.EvalLoss {
		t.Fatalf("resumed run ends at train %v eval %v, uninterrupted %v %v", res2.TrainEnd, res2.EvalLoss, res.TrainEnd, res.EvalLoss)
	}
	t.Logf("held-out loss %.3f -> %.3f, %d/%d parse, %.0f tokens/s", res.EvalLossStart, res.EvalLoss, res.ParseOK, res.ParseN, res.TokensPerSec)
}

// TestSFTOnSimulatedDevices: model.devices [cpu, cpu] trains data-parallel
// (two micro-batches a step, one per device) to the loss the tape reaches,
// and a run resumed from a device checkpoint (weights and AdamW moments
// brought back from the devices) ends exactly where the uninterrupted one
// did.
func TestSFTOnSimulatedDevices(t *testing.T) {
	dir := t.TempDir()
	data := filepath.Join(dir, "sft.jsonl")
	texts := records(t, data, 60, 3)
	model := tinyPolicy(t, texts)
	base := testOptions(model)
	cfg := &base.Config
	cfg.Data = data
	cfg.Steps, cfg.BatchTokens, cfg.GradAccum, cfg.LR, cfg.WarmupSteps = 20, 512, 2, 1e-2, 2
	cfg.EvalFraction, cfg.EvalEvery, cfg.SaveEvery = 0.1, 0, 10
	runOn := func(devices []string, out, resume string) Result {
		o := base
		o.Learner.Devices, o.Config.Out, o.Resume = devices, filepath.Join(dir, out), resume
		os.MkdirAll(o.Config.Out, 0o755)
		res, err := Run(context.Background(), o)
		if err != nil {
			t.Fatal(err)
		}
		return res
	}
	tapeRes := runOn(nil, "tape", "")
	dev := runOn([]string{"cpu", "cpu"}, "dev", "")
	if !(dev.EvalLoss < 0.7*dev.EvalLossStart) {
		t.Fatalf("devices: held-out loss %.3f -> %.3f", dev.EvalLossStart, dev.EvalLoss)
	}
	if math.Abs(dev.EvalLoss-tapeRes.EvalLoss) > 0.02*tapeRes.EvalLoss {
		t.Fatalf("devices end at held-out loss %.4f, the tape at %.4f", dev.EvalLoss, tapeRes.EvalLoss)
	}
	resumed := runOn([]string{"cpu", "cpu"}, "dev2", filepath.Join(dir, "dev", "checkpoint-10"))
	if resumed.TrainEnd != dev.TrainEnd || resumed.EvalLoss != dev.EvalLoss {
		t.Fatalf("resumed device run ends at train %v eval %v, uninterrupted %v %v", resumed.TrainEnd, resumed.EvalLoss, dev.TrainEnd, dev.EvalLoss)
	}
	t.Logf("held-out loss: tape %.4f, 2 simulated devices %.4f (from %.4f)", tapeRes.EvalLoss, dev.EvalLoss, dev.EvalLossStart)
}

// testOptions fine-tune model with the default sft section, full weights.
func testOptions(model string) Options {
	return Options{Config: DefaultConfig(), Model: model, LoRA: lora.DefaultOptions(qwen.LoRATargets), Optim: optim.DefaultConfig(),
		Copies: pretrain.CopySource(pretrain.DefaultConfig()), Dtype: safetensors.F32, Seed: 1, ResponseBudget: 2048, YAML: "seed: 1\n", Log: io.Discard}
}

// TestCopySequencesKeepCopying: sft.copy_sequences mixes pretrain's copy
// sequences into every step, so after the same SFT the held-out copy loss
// (random spans, which only copying predicts) is lower than without them.
func TestCopySequencesKeepCopying(t *testing.T) {
	dir := t.TempDir()
	data := filepath.Join(dir, "sft.jsonl")
	model := tinyPolicy(t, records(t, data, 60, 4))
	tok, err := tokenizer.Load(filepath.Join(model, "tokenizer.json"))
	if err != nil {
		t.Fatal(err)
	}
	lo, hi, err := pretrain.SpanTokens(tok, tok.VocabSize())
	if err != nil {
		t.Fatal(err)
	}
	pc := pretrain.DefaultConfig()
	pc.SpanMin, pc.SpanMax, pc.GapMin, pc.GapMax = 6, 6, 2, 2
	held, _ := pretrain.NewSequences(pc, lo, hi, 77, nil)
	var seqs []train.Sequence
	for range 32 {
		seqs = append(seqs, held.Next())
	}
	copyLoss := func(copies int) float64 {
		o := testOptions(model)
		o.Config.Data, o.Config.Out = data, filepath.Join(dir, fmt.Sprint("out", copies))
		o.Config.Steps, o.Config.BatchTokens, o.Config.LR, o.Config.WarmupSteps, o.Config.EvalFraction = 150, 512, 3e-3, 5, 0
		o.Config.CopySequences, o.Copies = copies, pretrain.CopySource(pc)
		if _, err := Run(context.Background(), o); err != nil {
			t.Fatal(err)
		}
		p, err := train.Open(filepath.Join(o.Config.Out, "policy"), lora.Options{}, 1)
		if err != nil {
			t.Fatal(err)
		}
		l, err := train.EvalLoss(train.Tape{}, p.W, []train.Batch{train.Pack(seqs)})
		if err != nil {
			t.Fatal(err)
		}
		return l
	}
	without, with := copyLoss(0), copyLoss(16)
	t.Logf("held-out copy loss after SFT: %.3f without copy sequences, %.3f with 16 a step (no copying: %.3f)", without, with, math.Log(float64(hi-lo)))
	// Below 3/4 of the floor no unigram guess reaches: the span is copied.
	if chance := math.Log(float64(hi - lo)); !(with < 0.75*chance && with < without) {
		t.Fatalf("copy loss %.3f with copy sequences, %.3f without (floor without copying %.3f): they taught no copying", with, without, chance)
	}
}

// TestMarkCopies: the tokens a reply copies from its context are the
// record's own facts (the name and the job the user told), never the format
// (think phrases, JSON keys, tool names) nor words every reply has.
func TestMarkCopies(t *testing.T) {
	dir := t.TempDir()
	data := filepath.Join(dir, "sft.jsonl")
	texts := records(t, data, 120, 5)
	model := tinyPolicy(t, texts)
	tok, err := tokenizer.Load(filepath.Join(model, "tokenizer.json"))
	if err != nil {
		t.Fatal(err)
	}
	ex, err := Load(data, tok, chat.Qwen25, "all", 0)
	if err != nil {
		t.Fatal(err)
	}
	MarkCopies(ex)
	for i, e := range ex {
		var rec struct {
			Messages []struct{ Content string } `json:"messages"`
		}
		json.Unmarshal([]byte(texts[i]), &rec)
		fact := strings.TrimPrefix(rec.Messages[1].Content, "Note: ")
		who := strings.Fields(fact)[0]
		var copied []int
		for j, c := range e.Copy {
			if c {
				if !e.Seq.Loss[j] {
					t.Fatalf("record %d: an unlearned token marked", i)
				}
				copied = append(copied, e.Seq.IDs[j])
			}
		}
		var pieces []string
		for _, id := range copied {
			pieces = append(pieces, tok.Decode([]int{id}, false))
		}
		got := strings.Join(pieces, "|")
		for _, p := range pieces {
			if !strings.Contains(fact, strings.TrimSpace(p)) {
				t.Fatalf("record %d (%q): marked %q, not from the fact", i, fact, got)
			}
		}
		joined := strings.Join(pieces, "")
		job := strings.TrimSuffix(strings.Fields(fact)[3], ".")
		if !strings.Contains(joined, who[1:]) || !strings.Contains(joined, " is a "+job) {
			t.Fatalf("record %d (%q): the copied fact is not marked whole (%q)", i, fact, got)
		}
	}
	// Weights travel through Pack to the learned rows they belong to.
	a := train.Sequence{IDs: []int{1, 2, 3, 4}, Loss: []bool{false, false, true, true}, Weights: []float32{1, 1, 5, 1}}
	b := train.Sequence{IDs: []int{1, 2, 7}, Loss: []bool{false, false, true}}
	pb := train.Pack([]train.Sequence{a, b})
	if want := []float32{5, 1, 1}; fmt.Sprint(pb.Weights) != fmt.Sprint(want) || fmt.Sprint(pb.Targets) != "[3 4 7]" {
		t.Fatalf("packed weights %v for targets %v, want %v for [3 4 7]", pb.Weights, pb.Targets, want)
	}
	if train.Pack([]train.Sequence{b}).Weights != nil {
		t.Fatal("unweighted sequences should pack without weights")
	}
}
