package tamem

import (
	"context"
	"fmt"
	"math"
	"sort"
	"strings"

	"github.com/agemem/agemem/embed"
	"github.com/agemem/agemem/llm"
)

// The chunking ablation (the paper's §IV-D): the session is cut into
// chunks before extraction, by length or by meaning, and the extractor,
// its segmentation instruction removed, writes one note per chunk. The
// paper's rows: fixed 512-token chunks with 25% overlap (F1 35.34),
// semantic chunks split below the 8th percentile of similarity (43.73),
// and the agent's own segmentation (44.34).

// Span is a chunk: messages Start to End of a session, inclusive.
type Span struct{ Start, End int }

// Chunker cuts a session's messages into spans covering all of them in
// order (they may overlap).
type Chunker func(ctx context.Context, lines []Line) ([]Span, error)

// FixedChunks are chunks of about tokens tokens (counted by count) that
// overlap by the share overlap of a chunk: each chunk takes messages until
// it holds tokens, and the next starts at the latest message from which
// the chunk's tail holds at least overlap × tokens (later, if the next
// chunk could not otherwise reach past this one). Messages are not split:
// a message longer than a chunk is a chunk of its own.
func FixedChunks(tokens int, overlap float64, count func(string) int) Chunker {
	return func(_ context.Context, lines []Line) ([]Span, error) {
		if tokens < 1 || overlap < 0 || overlap >= 1 {
			return nil, fmt.Errorf("tamem: fixed chunks of %d tokens overlapping by %g (want at least 1 token, an overlap in [0, 1))", tokens, overlap)
		}
		n := make([]int, len(lines))
		for i, l := range lines {
			n[i] = count(l.Speaker + ": " + l.Text)
		}
		var out []Span
		for lo := 0; lo < len(lines); {
			hi, size := lo, n[lo]
			for hi+1 < len(lines) && size+n[hi+1] <= tokens {
				hi++
				size += n[hi]
			}
			out = append(out, Span{lo, hi})
			if hi == len(lines)-1 {
				break
			}
			// The overlap: back from the chunk's end while its tail is
			// short of overlap × tokens, never back to lo (the next chunk
			// must move on).
			next, tail := hi+1, 0
			for next-1 > lo && float64(tail) < overlap*float64(tokens) {
				next--
				tail += n[next]
			}
			// ...and no further back than lets the next chunk reach a
			// message past this one's end: a chunk inside the last would
			// add nothing.
			for next <= hi && sum(n[next:hi+2]) > tokens {
				next++
			}
			lo = next
		}
		return out, nil
	}
}

func sum(xs []int) int {
	t := 0
	for _, x := range xs {
		t += x
	}
	return t
}

// Words counts whitespace-separated words: the token count of
// FixedChunks when the model's tokenizer is not at hand.
func Words(s string) int { return len(strings.Fields(s)) }

// SemanticChunks split between consecutive messages whose embeddings'
// cosine similarity is below the given percentile of the session's
// consecutive similarities (the paper: the 8th), as LangChain's semantic
// chunker splits on distances above a percentile.
func SemanticChunks(emb embed.Embedder, percentile float64) Chunker {
	return func(ctx context.Context, lines []Line) ([]Span, error) {
		if !(percentile >= 0 && percentile <= 100) {
			return nil, fmt.Errorf("tamem: split percentile %g is not in [0, 100]", percentile)
		}
		if len(lines) < 3 {
			return []Span{{0, len(lines) - 1}}, nil
		}
		texts := make([]string, len(lines))
		for i, l := range lines {
			texts[i] = l.Speaker + ": " + l.Text
		}
		vecs, err := emb.Embed(ctx, texts)
		if err != nil {
			return nil, err
		}
		sims := make([]float64, len(lines)-1)
		for i := range sims {
			sims[i] = embed.Cosine(vecs[i], vecs[i+1])
		}
		cut := Percentile(sims, percentile)
		var out []Span
		lo := 0
		for i, s := range sims {
			if s < cut {
				out = append(out, Span{lo, i})
				lo = i + 1
			}
		}
		return append(out, Span{lo, len(lines) - 1}), nil
	}
}

// Percentile is numpy's default (linear interpolation between the closest
// ranks) of xs at p in [0, 100].
func Percentile(xs []float64, p float64) float64 {
	s := append([]float64(nil), xs...)
	sort.Float64s(s)
	if len(s) == 0 {
		return math.NaN()
	}
	pos := p / 100 * float64(len(s)-1)
	i := int(math.Floor(pos))
	if i >= len(s)-1 {
		return s[len(s)-1]
	}
	return s[i] + (pos-float64(i))*(s[i+1]-s[i])
}

// ChunkPrompt is ExtractPrompt without its segmentation: the messages are
// one chunk, for which the extractor writes one note.
const ChunkPrompt = `You build a memory of a conversation. Read the numbered messages of one part of a session (its date is given) and write one note about all of them as a JSON object:
` + noteSchema + `Answer with a JSON array holding that one note, and nothing else.`

// ChunkExtractor is the ablation's extractor on m: the chunker cuts the
// session, and each chunk is extracted on its own (one call a chunk) into
// one page whose dialogue is the chunk. Whatever span the note gives, it
// covers the chunk.
func ChunkExtractor(m llm.Model, chunk Chunker) Extractor {
	return func(ctx context.Context, session int, date string, lines []Line) ([]Page, error) {
		spans, err := chunk(ctx, lines)
		if err != nil {
			return nil, err
		}
		var pages []Page
		for _, sp := range spans {
			part := lines[sp.Start : sp.End+1]
			notes, err := askNotes(ctx, m, ChunkPrompt, date, part)
			if err != nil {
				return nil, fmt.Errorf("messages %d-%d: %w", sp.Start, sp.End, err)
			}
			nt := notes[0]
			nt.Start, nt.End = sp.Start, sp.End
			pages = append(pages, Page{Session: session, Time: date, Dialogue: append([]Line(nil), part...), Note: nt})
		}
		return pages, nil
	}
}
