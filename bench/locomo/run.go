package locomo

import (
	"context"
	"fmt"
	"sort"
	"strings"

	"github.com/agemem/agemem/embed"
	"github.com/agemem/agemem/llm"
	"github.com/agemem/agemem/model/chat"
)

// Turns lists a sample's turns in order with the text a retriever or a
// reader sees: "[date] speaker: text" (an image's caption appended).
func (s Sample) Turns() (ids, texts []string) {
	for _, ses := range s.Sessions {
		for _, t := range ses.Turns {
			text := t.Text
			if t.BlipCaption != "" {
				text += " [shares a photo: " + t.BlipCaption + "]"
			}
			ids = append(ids, t.DiaID)
			texts = append(texts, fmt.Sprintf("[%s] %s: %s", ses.DateTime, t.Speaker, text))
		}
	}
	return ids, texts
}

// RAG is plain embedding top-k over a sample's turns: the baseline the
// multi-index memory is measured against.
type RAG struct {
	Embedder embed.Embedder
	// cache holds each sample's turn vectors.
	cache map[string][][]float32
}

// Retrieve returns the dialogue ids of the k turns most similar to the
// question, best first.
func (r *RAG) Retrieve(ctx context.Context, s Sample, question string, k int) ([]string, error) {
	if k < 1 {
		return nil, fmt.Errorf("k %d: retrieve at least one turn", k)
	}
	ids, texts := s.Turns()
	if r.cache == nil {
		r.cache = map[string][][]float32{}
	}
	vs, ok := r.cache[s.ID]
	if !ok {
		var err error
		if vs, err = r.Embedder.Embed(ctx, texts); err != nil {
			return nil, err
		}
		r.cache[s.ID] = vs
	}
	q, err := r.Embedder.Embed(ctx, []string{question})
	if err != nil {
		return nil, err
	}
	order := make([]int, len(ids))
	score := make([]float64, len(ids))
	for i := range ids {
		order[i] = i
		score[i] = embed.Cosine(q[0], vs[i])
	}
	sort.SliceStable(order, func(a, b int) bool { return score[order[a]] > score[order[b]] })
	out := make([]string, 0, k)
	for _, i := range order[:min(k, len(order))] {
		out = append(out, ids[i])
	}
	return out, nil
}

// Retriever finds the turns a question needs.
type Retriever interface {
	Retrieve(ctx context.Context, s Sample, question string, k int) ([]string, error)
}

// RetrievalPredictions runs only the retrieval of every question (no model):
// predictions with an empty answer and the retrieved ids as context, for
// Score's evidence recall.
func RetrievalPredictions(ctx context.Context, samples []Sample, r Retriever, k int) ([]Prediction, error) {
	var out []Prediction
	for _, s := range samples {
		for i, q := range s.QA {
			ids, err := r.Retrieve(ctx, s, q.Question, k)
			if err != nil {
				return nil, fmt.Errorf("%s qa %d: %w", s.ID, i, err)
			}
			out = append(out, Prediction{SampleID: s.ID, QAIndex: i, Context: append([]string{}, ids...)})
		}
	}
	return out, nil
}

// qaPrompt is LoCoMo's question-answering instruction.
const qaPrompt = "Based on the above context, write an answer in the form of a short phrase for the following question. Answer with exact words from the context whenever possible.\n\nQuestion: %s\nShort answer:"

// Answer asks m every question with a context: the whole conversation
// (r nil: full-context) or the k retrieved turns.
func Answer(ctx context.Context, m llm.Model, samples []Sample, r Retriever, k int, progress func(done, total int)) ([]Prediction, error) {
	total := 0
	for _, s := range samples {
		total += len(s.QA)
	}
	var out []Prediction
	for _, s := range samples {
		ids, texts := s.Turns()
		byID := map[string]string{}
		for i, id := range ids {
			byID[id] = texts[i]
		}
		for i, q := range s.QA {
			var ctxIDs []string
			var lines []string
			if r == nil {
				lines, ctxIDs = texts, ids
			} else {
				got, err := r.Retrieve(ctx, s, q.Question, k)
				if err != nil {
					return nil, fmt.Errorf("%s qa %d: %w", s.ID, i, err)
				}
				ctxIDs = got
				for _, id := range got {
					lines = append(lines, byID[id])
				}
			}
			msg := fmt.Sprintf("A conversation between %s and %s:\n\n%s\n\n"+qaPrompt, s.SpeakerA, s.SpeakerB, strings.Join(lines, "\n"), q.Question)
			rep, err := m.Chat(ctx, llm.Request{Messages: []chat.Message{{Role: "user", Content: msg}}})
			if err != nil {
				return nil, fmt.Errorf("%s qa %d: %w", s.ID, i, err)
			}
			out = append(out, Prediction{SampleID: s.ID, QAIndex: i, Prediction: strings.TrimSpace(rep.Message.Content), Context: ctxIDs})
			if progress != nil {
				progress(len(out), total)
			}
		}
	}
	return out, nil
}
