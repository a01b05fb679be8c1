package bert

import (
	"context"
	"fmt"
	"sync"

	"github.com/agemem/agemem/kernels"
	"github.com/agemem/agemem/kernels/cpu"
)

// Encoder embeds sentences with a loaded encoder: an embed.Embedder.
// Texts are tokenised, truncated to the position table, packed end to end
// into batches of at most BatchTokens tokens (so a batch is sized by its
// tokens, not its count), encoded on Backend (the CPU when nil) and pooled.
// W is uploaded on first use; after changing W (training), call Reload.
// Embed is safe for concurrent use; batches run one at a time.
type Encoder struct {
	W           *Weights[float32]
	Tok         Tokenizer
	Pooling     string
	BatchTokens int
	Backend     kernels.Backend

	mu  sync.Mutex
	dev *deviceModel
}

// LoadEncoder opens the encoder and tokenizer in dir, to run on be (nil:
// the CPU).
func LoadEncoder(dir, pooling string, batchTokens int, be kernels.Backend) (*Encoder, error) {
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
	e := &Encoder{W: w, Tok: tok, Pooling: pooling, BatchTokens: batchTokens, Backend: be}
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

// Reload makes the next batch upload W again (its values changed).
func (e *Encoder) Reload() {
	e.mu.Lock()
	e.dev = nil
	e.mu.Unlock()
}

func (e *Encoder) encode(batch [][]int) ([][]float32, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.dev == nil {
		be := e.Backend
		if be == nil {
			be = cpu.New()
		}
		e.dev = upload(be, e.W)
	}
	return e.dev.encode(batch, e.Pooling)
}
