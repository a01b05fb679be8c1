package tamem

import (
	"context"
	"errors"
	"fmt"
	"io"

	"github.com/agemem/agemem/bench/locomo"
	"github.com/agemem/agemem/embed"
	"github.com/agemem/agemem/internal/par"
	"github.com/agemem/agemem/llm"
)

// ConversationOf is a LoCoMo sample as TA-Mem's constructor reads it, a
// shared photo as its caption.
func ConversationOf(s locomo.Sample) Conversation {
	c := Conversation{ID: s.ID, SpeakerA: s.SpeakerA, SpeakerB: s.SpeakerB}
	for _, ses := range s.Sessions {
		st := SessionText{N: ses.N, Date: ses.DateTime}
		for _, t := range ses.Turns {
			text := t.Text
			if t.BlipCaption != "" {
				text += " [shares a photo: " + t.BlipCaption + "]"
			}
			st.Lines = append(st.Lines, Line{DiaID: t.DiaID, Speaker: t.Speaker, Text: text})
		}
		c.Sessions = append(c.Sessions, st)
	}
	return c
}

// Retriever is TA-Mem's database with no model (a locomo.Retriever):
// each conversation stored in pages of Window messages (Windows), each
// question answered by the database's fixed query plan (DB.Retrieve).
type Retriever struct {
	DB     *DB
	Window int
}

// Retrieve implements locomo.Retriever.
func (r Retriever) Retrieve(ctx context.Context, s locomo.Sample, question string, k int) ([]string, error) {
	if _, err := r.DB.Build(ctx, Windows(r.Window), ConversationOf(s), nil); err != nil {
		return nil, err
	}
	return r.DB.Retrieve(ctx, s.ID, question, k)
}

// LoCoMo is TA-Mem on LoCoMo: each conversation's database built in
// c.DB by m's extraction (c.Chunking; emb embeds the pages), then each of
// its questions answered by the retrieval agent on m within c.MaxTurns,
// c.Parallel at a time, kept in order. progress gets the questions
// answered so far; log the extraction's notices and a summary.
func LoCoMo(ctx context.Context, c Config, m llm.Model, emb embed.Embedder, samples []locomo.Sample, log io.Writer, progress func(done int)) ([]locomo.Prediction, error) {
	extract, suffix := c.Chunking.Extractor(m, emb)
	db, err := Open(c.DB, emb)
	if err != nil {
		return nil, err
	}
	defer db.Close()
	var preds []locomo.Prediction
	var turns, finalized, failed, tooLong int
	for _, s := range samples {
		conv := ConversationOf(s)
		conv.ID += suffix
		f, err := db.Build(ctx, extract, conv, func(msg string) { fmt.Fprintln(log, msg) })
		if err != nil {
			return nil, fmt.Errorf("%s: %w", s.ID, err)
		}
		failed += f
		answers, errs := answerAll(ctx, c, db, m, conv.ID, s, len(preds), progress)
		for i, a := range answers {
			err := errs[i]
			if errors.Is(err, llm.ErrContextFull) {
				// The question's prompt outgrew the model: unanswered, as
				// an evaluation of many questions should go on.
				tooLong++
				err = nil
			}
			if err != nil {
				return nil, fmt.Errorf("%s qa %d: %w", s.ID, i, err)
			}
			turns += a.Turns
			if a.Finalized {
				finalized++
			}
			preds = append(preds, locomo.Prediction{SampleID: s.ID, QAIndex: i, Prediction: a.Answer, Context: a.Context,
				Tools: a.Tools, Turns: a.Turns, Tokens: a.Tokens})
		}
	}
	if len(preds) > 0 {
		fmt.Fprintf(log, "ta-mem: %.2f turns a question, %.1f%% finalized within %d turns, %d session(s) stored whole after a failed extraction, %d question(s) unanswered: the prompt outgrew the model\n",
			float64(turns)/float64(len(preds)), 100*float64(finalized)/float64(len(preds)), c.MaxTurns, failed, tooLong)
	}
	return preds, nil
}

// answerAll answers the questions of one conversation (namespace ns),
// c.Parallel at a time (they are independent), in order; progress counts
// on from before, the questions of the conversations answered earlier.
func answerAll(ctx context.Context, c Config, db *DB, m llm.Model, ns string, s locomo.Sample, before int, progress func(int)) ([]Answered, []error) {
	answers := make([]Answered, len(s.QA))
	errs := make([]error, len(s.QA))
	par.Each(len(s.QA), c.Parallel, func(i int) {
		answers[i], errs[i] = db.Answer(ctx, m, ns, s.SpeakerA, s.SpeakerB, s.QA[i].Question, c.MaxTurns)
	}, func(done, _ int) {
		if progress != nil {
			progress(before + done)
		}
	})
	return answers, errs
}
