package tamem

import (
	"context"
	"fmt"
	"math"
	"strconv"
	"strings"
	"testing"

	"github.com/agemem/agemem/embed"
	"github.com/agemem/agemem/llm"
	"github.com/agemem/agemem/model/chat"
)

// linesOf makes messages whose token count is their text (for FixedChunks
// by a count that reads it).
func linesOf(counts ...int) []Line {
	out := make([]Line, len(counts))
	for i, c := range counts {
		out[i] = Line{DiaID: fmt.Sprint(i), Speaker: "A", Text: strconv.Itoa(c)}
	}
	return out
}

func readCount(s string) int {
	n, _ := strconv.Atoi(strings.TrimPrefix(s, "A: "))
	return n
}

// FixedChunks on hand-worked sessions: chunks fill to the token budget,
// the next starts where the last quarter (2.5 of 10 tokens) begins, a
// message longer than a chunk stands alone, and no overlap gives
// disjoint chunks.
func TestFixedChunksHandWorked(t *testing.T) {
	ctx := context.Background()
	for _, c := range []struct {
		counts  []int
		overlap float64
		want    string
	}{
		{[]int{4, 4, 4, 4, 4}, 0.25, "[{0 1} {1 2} {2 3} {3 4}]"},
		{[]int{4, 4, 4, 4, 4}, 0, "[{0 1} {2 3} {4 4}]"},
		{[]int{12, 3, 3}, 0.25, "[{0 0} {1 2}]"},
		{[]int{2, 2, 2, 2, 2, 2, 9}, 0.25, "[{0 4} {3 5} {6 6}]"},
		{[]int{7}, 0.25, "[{0 0}]"},
	} {
		got, err := FixedChunks(10, c.overlap, readCount)(ctx, linesOf(c.counts...))
		if err != nil || fmt.Sprint(got) != c.want {
			t.Errorf("%v at %g: %v %v, want %s", c.counts, c.overlap, got, err, c.want)
		}
	}
	if _, err := FixedChunks(10, 1, readCount)(ctx, linesOf(1)); err == nil {
		t.Error("an overlap of a whole chunk was accepted")
	}
}

// Percentile is numpy's (linear interpolation): np.percentile([1, 2, 3,
// 4], 8) is 1.24, the median of four 2.5.
func TestPercentileMatchesNumpy(t *testing.T) {
	for _, c := range []struct {
		xs   []float64
		p    float64
		want float64
	}{{[]float64{1, 2, 3, 4}, 8, 1.24}, {[]float64{3, 1, 2, 4}, 50, 2.5}, {[]float64{5}, 8, 5}, {[]float64{1, 2}, 100, 2}} {
		if got := Percentile(c.xs, c.p); math.Abs(got-c.want) > 1e-12 {
			t.Errorf("Percentile(%v, %g) = %v, want %v", c.xs, c.p, got, c.want)
		}
	}
}

// SemanticChunks split a session of two topics where the topic changes:
// the least similar neighbours are the last line about the cat and the
// first about taxes.
func TestSemanticChunksSplitAtTheTopic(t *testing.T) {
	lines := []Line{
		{Speaker: "A", Text: "My cat Luna chased a mouse in the garden."},
		{Speaker: "B", Text: "Your cat Luna loves the garden mouse hunts."},
		{Speaker: "A", Text: "Luna the cat caught the garden mouse at last."},
		{Speaker: "B", Text: "Good cat, Luna! The mouse had it coming."},
		{Speaker: "A", Text: "I filed my income tax return with the accountant."},
		{Speaker: "B", Text: "Did the accountant find an income tax refund?"},
		{Speaker: "A", Text: "The tax refund from the accountant was small."},
	}
	got, err := SemanticChunks(embed.NewHashing(512, []int{3, 4}), 8)(context.Background(), lines)
	if err != nil || fmt.Sprint(got) != "[{0 3} {4 6}]" {
		t.Fatalf("%v %v", got, err)
	}
	if got, _ := SemanticChunks(embed.NewHashing(64, nil), 8)(context.Background(), lines[:2]); fmt.Sprint(got) != "[{0 1}]" {
		t.Fatalf("two lines: %v", got)
	}
}

type chunkNotes struct{ calls []string }

func (m *chunkNotes) Chat(_ context.Context, req llm.Request) (llm.Response, error) {
	m.calls = append(m.calls, req.Messages[1].Content)
	if strings.Contains(req.Messages[1].Content, "[0] A: 9") {
		return llm.Response{Message: chat.Message{Content: "no notes here"}}, nil
	}
	n := strings.Count(req.Messages[1].Content, "\n[") - 1 // the last message's number
	return llm.Response{Message: chat.Message{Content: fmt.Sprintf(`[{"start": 0, "end": %d, "summary": "part %d", "tag": "t"}]`, n, len(m.calls))}}, nil
}

// ChunkExtractor writes one page a chunk: the chunk's dialogue, its note
// over the chunk's span in the session; a chunk the model fails on is
// named by its messages (Build then stores the session whole).
func TestChunkExtractorPagesAreChunks(t *testing.T) {
	m := &chunkNotes{}
	ext := ChunkExtractor(m, FixedChunks(10, 0.25, readCount))
	pages, err := ext(context.Background(), 3, "8 May 2023", linesOf(4, 4, 4, 4, 4))
	if err != nil || len(pages) != 4 || len(m.calls) != 4 {
		t.Fatalf("%v: %d pages, %d calls", err, len(pages), len(m.calls))
	}
	p := pages[1]
	if p.Session != 3 || p.Note.Start != 1 || p.Note.End != 2 || len(p.Dialogue) != 2 || p.Dialogue[0].DiaID != "1" || p.Note.Summary != "part 2" {
		t.Fatalf("page %+v", p)
	}
	if !strings.HasPrefix(m.calls[0], "Session date: 8 May 2023.\n[0] A: 4\n[1] A: 4\n") {
		t.Fatalf("prompt %q", m.calls[0])
	}
	if _, err := ext(context.Background(), 3, "d", linesOf(4, 9)); err == nil || !strings.Contains(err.Error(), "messages 1-1") {
		t.Fatalf("a failed chunk: %v", err)
	}
}
