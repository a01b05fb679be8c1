package locomo

import (
	"context"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/agemem/agemem/embed"
	"github.com/agemem/agemem/llm"
	"github.com/agemem/agemem/model/chat"
)

// randomRetriever picks k turns at random: the floor retrieval must beat.
type randomRetriever struct{ r *rand.Rand }

func (x randomRetriever) Retrieve(_ context.Context, s Sample, _ string, k int) ([]string, error) {
	ids, _ := s.Turns()
	x.r.Shuffle(len(ids), func(i, j int) { ids[i], ids[j] = ids[j], ids[i] })
	return ids[:min(k, len(ids))], nil
}

// TestRAGRecall: embedding top-5 over the turns finds the evidence of the
// synthetic questions far better than chance (retrieval measured without a
// model).
func TestRAGRecall(t *testing.T) {
	raw, _ := Synth(4, 8, 3)
	samples, err := Parse(raw)
	if err != nil {
		t.Fatal(err)
	}
	recall := func(r Retriever) float64 {
		preds, err := RetrievalPredictions(context.Background(), samples, r, 5)
		if err != nil {
			t.Fatal(err)
		}
		rep, _, err := Score(samples, preds)
		if err != nil {
			t.Fatal(err)
		}
		return rep.Recall.Mean
	}
	rag := recall(&RAG{Embedder: embed.NewHashing(512, []int{3, 4})})
	chance := recall(randomRetriever{rand.New(rand.NewPCG(1, 1))})
	t.Logf("evidence recall@5: RAG (hashing) %.3f, random %.3f", rag, chance)
	if !(rag > 0.3 && rag > 2*chance) {
		t.Fatalf("RAG recall@5 %.3f against chance %.3f", rag, chance)
	}
	// No turn to retrieve is an error, not a crash (k -1 made a slice of
	// negative capacity).
	for _, k := range []int{0, -1} {
		if _, err := RetrievalPredictions(context.Background(), samples, &RAG{Embedder: embed.NewHashing(64, []int{3})}, k); err == nil {
			t.Errorf("k %d: no error", k)
		}
	}
}

// echoModel answers with the last line of the context before the question.
type echoModel struct{ prompts []string }

func (e *echoModel) Chat(_ context.Context, req llm.Request) (llm.Response, error) {
	e.prompts = append(e.prompts, req.Messages[0].Content)
	return llm.Response{Message: chat.Message{Content: " Not mentioned "}}, nil
}

// TestAnswerPlumbing: every question is asked once with its context (all
// turns for full context, the k retrieved for RAG) and LoCoMo's prompt,
// the prediction trimmed.
func TestAnswerPlumbing(t *testing.T) {
	raw, _ := Synth(1, 3, 5)
	samples, _ := Parse(raw)
	m := &echoModel{}
	preds, err := Answer(context.Background(), m, samples, &RAG{Embedder: embed.NewHashing(128, []int{3})}, 2, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(preds) != len(samples[0].QA) || preds[0].Prediction != "Not mentioned" || len(preds[0].Context) != 2 {
		t.Fatalf("%d predictions, first %+v", len(preds), preds[0])
	}
	if !strings.Contains(m.prompts[0], "Short answer:") || !strings.Contains(m.prompts[0], samples[0].QA[0].Question) {
		t.Fatalf("prompt:\n%s", m.prompts[0])
	}
	full, _ := Answer(context.Background(), m, samples, nil, 0, nil)
	ids, _ := samples[0].Turns()
	if len(full[0].Context) != len(ids) {
		t.Fatalf("full context holds %d of %d turns", len(full[0].Context), len(ids))
	}
}
