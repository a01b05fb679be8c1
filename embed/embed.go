// Package embed holds text embedders: enc(.) of the AgeMem paper (Eq. 8-10, 15).
package embed

import (
	"context"
	"fmt"
	"hash/fnv"
	"math"
	"strings"
	"unicode"
)

// Embedder turns texts into vectors, a batch at a time. Vectors are
// L2-normalised so that cosine similarity is a dot product.
type Embedder interface {
	Embed(ctx context.Context, texts []string) ([][]float32, error)
	Dim() int
}

// Hashing is a deterministic embedder that needs no weights: words, word
// bigrams and character n-grams of each word are hashed (FNV-1a) into Dim
// buckets with a sign taken from a second hash bit, then the vector is
// L2-normalised. Shared words and shared spellings give high cosine.
type Hashing struct {
	dim    int
	ngrams []int
}

// NewHashing returns a hashing embedder of dimension dim over the given
// character n-gram lengths (nil for words and bigrams only).
func NewHashing(dim int, charNgrams []int) *Hashing {
	return &Hashing{dim: dim, ngrams: append([]int(nil), charNgrams...)}
}

// Dim is the embedding dimension.
func (h *Hashing) Dim() int { return h.dim }

// Embed embeds each text. It never fails; ctx is honoured between texts.
func (h *Hashing) Embed(ctx context.Context, texts []string) ([][]float32, error) {
	out := make([][]float32, len(texts))
	for i, t := range texts {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		out[i] = h.One(t)
	}
	return out, nil
}

// Feature weights: whole words carry most of the meaning; n-grams make
// morphological variants ("stored", "stores") close; bigrams add order.
const (
	wordWeight   = 1.0
	bigramWeight = 0.5
	ngramWeight  = 0.25
)

// One embeds a single text.
func (h *Hashing) One(text string) []float32 {
	v := make([]float32, h.dim)
	words := Words(text)
	for i, w := range words {
		h.add(v, "w:"+w, wordWeight)
		if i > 0 {
			h.add(v, "b:"+words[i-1]+" "+w, bigramWeight)
		}
		padded := "<" + w + ">"
		r := []rune(padded)
		for _, n := range h.ngrams {
			for j := 0; j+n <= len(r); j++ {
				h.add(v, "c:"+string(r[j:j+n]), ngramWeight/float32(len(h.ngrams)))
			}
		}
	}
	Normalize(v)
	return v
}

func (h *Hashing) add(v []float32, feature string, w float32) {
	f := fnv.New64a()
	f.Write([]byte(feature))
	x := f.Sum64()
	idx := int(x % uint64(h.dim))
	if (x>>63)&1 == 1 {
		w = -w
	}
	v[idx] += w
}

// Words lower-cases text and splits it into runs of letters and digits.
func Words(text string) []string {
	return strings.FieldsFunc(strings.ToLower(text), func(r rune) bool {
		return !unicode.IsLetter(r) && !unicode.IsDigit(r)
	})
}

// Normalize scales v to unit L2 norm in place; a zero vector stays zero.
func Normalize(v []float32) {
	var s float64
	for _, x := range v {
		s += float64(x) * float64(x)
	}
	if s == 0 {
		return
	}
	inv := float32(1 / math.Sqrt(s))
	for i := range v {
		v[i] *= inv
	}
}

// Cosine is the cosine similarity of Eq. 9, for vectors of any norm.
func Cosine(a, b []float32) float64 {
	var ab, aa, bb float64
	for i := range a {
		ab += float64(a[i]) * float64(b[i])
		aa += float64(a[i]) * float64(a[i])
		bb += float64(b[i]) * float64(b[i])
	}
	if aa == 0 || bb == 0 {
		return 0
	}
	return ab / math.Sqrt(aa*bb)
}

// Remote is an embedder behind a server's batch endpoint (Ollama's
// /api/embed, an OpenAI-compatible /v1/embeddings): texts go Batch a
// request, and every reply must hold one vector a text, all of one
// dimension (the one a probe learned), which comes back unit-normalised
// so that a store's dot product is the cosine.
type Remote struct {
	// Request returns one batch's vectors in order.
	Request func(ctx context.Context, texts []string) ([][]float32, error)
	// Invalid is the error for a reply that breaks those rules; msg says
	// how, naming the text.
	Invalid func(msg string) error
	Batch   int // texts a request (0: 64)
	dim     int
}

// NewRemote learns the model's dimension from a probe's vector, so that a
// missing or unusable model fails at start.
func NewRemote(ctx context.Context, request func(context.Context, []string) ([][]float32, error), invalid func(msg string) error) (*Remote, error) {
	r := &Remote{Request: request, Invalid: invalid}
	v, err := r.Embed(ctx, []string{"dimension probe"})
	if err != nil {
		return nil, err
	}
	r.dim = len(v[0])
	return r, nil
}

// Dim implements Embedder.
func (r *Remote) Dim() int { return r.dim }

// Embed implements Embedder.
func (r *Remote) Embed(ctx context.Context, texts []string) ([][]float32, error) {
	batch, dim := r.Batch, r.dim
	if batch <= 0 {
		batch = 64
	}
	out := make([][]float32, 0, len(texts))
	for start := 0; start < len(texts); start += batch {
		part := texts[start:min(start+batch, len(texts))]
		vs, err := r.Request(ctx, part)
		if err != nil {
			return nil, err
		}
		if len(vs) != len(part) {
			return nil, r.Invalid(fmt.Sprintf("%d vectors for %d texts", len(vs), len(part)))
		}
		for i, v := range vs {
			if dim == 0 {
				dim = len(v)
			}
			if len(v) == 0 || len(v) != dim {
				return nil, r.Invalid(fmt.Sprintf("a %d-dimensional vector for text %d, want %d", len(v), start+i, dim))
			}
			Normalize(v)
			out = append(out, v)
		}
	}
	return out, nil
}
