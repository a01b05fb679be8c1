package bert

import (
	"context"
	"fmt"

	"github.com/agemem/agemem/model/tape"
)

// Encoder embeds sentences with a loaded encoder: an embed.Embedder.
// Texts are tokenised, truncated to the position table, packed end to end
// into batches of at most BatchTokens tokens (so a batch is sized by its
// tokens, not its count), encoded without gradients and pooled.
type Encoder struct {
	W           *Weights[float32]
	Tok         Tokenizer
	Pooling     string
	BatchTokens int
}

// LoadEncoder opens the encoder and tokenizer in dir.
func LoadEncoder(dir, pooling string, batchTokens int) (*Encoder, error) {
	w, err := Load[float32](dir, false)
	if err != nil {
		return nil, err
	}
	tok, err := LoadTokenizer(dir)
	if err != nil {
		return nil, err
	}
	if tok.VocabSize() > w.VocabSize {
		return nil, fmt.Errorf("%s: the tokenizer has %d ids but the embedding only %d rows", dir, tok.VocabSize(), w.VocabSize)
	}
	e := &Encoder{W: w, Tok: tok, Pooling: pooling, BatchTokens: batchTokens}
	if pooling == PoolCLSMLP && w.Pooler == nil {
		return nil, fmt.Errorf("%s: pooling cls_mlp needs pooler.dense, which the checkpoint lacks", dir)
	}
	if pooling != PoolCLS && pooling != PoolCLSMLP && pooling != PoolMean {
		return nil, fmt.Errorf("pooling %q is not one of cls, cls_mlp, mean", pooling)
	}
	return e, nil
}

// Dim implements embed.Embedder.
func (e *Encoder) Dim() int { return e.W.HiddenSize }

// Embed implements embed.Embedder.
func (e *Encoder) Embed(ctx context.Context, texts []string) ([][]float32, error) {
	budget := e.BatchTokens
	if budget <= 0 {
		budget = 8192
	}
	out := make([][]float32, len(texts))
	var batch [][]int
	var idx []int
	n := 0
	flush := func() error {
		if len(batch) == 0 {
			return nil
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		vs, err := e.encode(batch)
		if err != nil {
			return err
		}
		for i, v := range vs {
			out[idx[i]] = v
		}
		batch, idx, n = batch[:0], idx[:0], 0
		return nil
	}
	for i, t := range texts {
		ids := e.Tok.Encode(t, e.W.MaxTokens())
		if n+len(ids) > budget {
			if err := flush(); err != nil {
				return nil, err
			}
		}
		batch, idx, n = append(batch, ids), append(idx, i), n+len(ids)
	}
	if err := flush(); err != nil {
		return nil, err
	}
	return out, nil
}

func (e *Encoder) encode(batch [][]int) ([][]float32, error) {
	tp := tape.New[float32]()
	defer tp.Release()
	h, segs, err := e.W.Forward(tp, batch, 0, 0)
	if err != nil {
		return nil, err
	}
	p, err := e.W.Pool(tp, h, segs, e.Pooling)
	if err != nil {
		return nil, err
	}
	d := p.Cols
	vs := make([][]float32, len(batch))
	for i := range vs {
		vs[i] = append([]float32(nil), p.Val[i*d:(i+1)*d]...)
	}
	return vs, nil
}
