package bert

import (
	"fmt"
	"math"

	"github.com/agemem/agemem/kernels"
	"github.com/agemem/agemem/model/tape"
)

// deviceModel is the encoder's weights resident on a compute backend (the
// CPU's views of them, or copies in GPU memory) and the inference forward
// pass over them: the same computation as Weights.Forward and Pool
// without the tape, so batches run where the weights live.
type deviceModel struct {
	be             kernels.Backend
	cfg            Config
	word, pos, typ kernels.Tensor
	embLNW, embLNB kernels.Tensor
	layers         []deviceLayer
	pooler         *deviceLinear
}

type deviceLinear struct{ w, b kernels.Tensor }

type deviceLayer struct {
	q, k, v, attnOut deviceLinear
	attnLNW, attnLNB kernels.Tensor
	inter, out       deviceLinear
	outLNW, outLNB   kernels.Tensor
}

// upload puts w on be: matrices as weights (bfloat16 on a GPU in BF16
// mode), vectors (biases, LayerNorms) as float32 tensors.
func upload(be kernels.Backend, w *Weights[float32]) *deviceModel {
	mat := func(v *tape.Var[float32]) kernels.Tensor {
		return be.Upload(kernels.Weight{Rows: v.Rows, Cols: v.Cols, F32: v.Val})
	}
	vec := func(v *tape.Var[float32]) kernels.Tensor { return be.FromHost(v.Val, len(v.Val)) }
	lin := func(l Linear[float32]) deviceLinear { return deviceLinear{mat(l.W), vec(l.B)} }
	m := &deviceModel{be: be, cfg: w.Config, word: mat(w.Word), pos: mat(w.Pos), typ: mat(w.Type), embLNW: vec(w.EmbLNW), embLNB: vec(w.EmbLNB)}
	for _, L := range w.Layers {
		m.layers = append(m.layers, deviceLayer{
			q: lin(L.Q), k: lin(L.K), v: lin(L.V), attnOut: lin(L.AttnOut),
			attnLNW: vec(L.AttnLNW), attnLNB: vec(L.AttnLNB),
			inter: lin(L.Inter), out: lin(L.Out),
			outLNW: vec(L.OutLNW), outLNB: vec(L.OutLNB),
		})
	}
	if w.Pooler != nil {
		p := lin(*w.Pooler)
		m.pooler = &p
	}
	return m
}

// encode runs a batch of token-id sequences, packed end to end, and
// returns each one's pooled, L2-normalised vector.
func (m *deviceModel) encode(batch [][]int, pooling string) ([][]float32, error) {
	be, c := m.be, m.cfg
	var ids, pos, types, first []int
	bounds := []int{0}
	for b, seq := range batch {
		if len(seq) == 0 || len(seq) > c.MaxTokens() {
			return nil, fmt.Errorf("sequence %d has %d tokens; the encoder takes 1 to %d", b, len(seq), c.MaxTokens())
		}
		first = append(first, len(ids))
		for i, id := range seq {
			if id < 0 || id >= c.VocabSize {
				return nil, fmt.Errorf("sequence %d: token id %d is outside the vocabulary of %d", b, id, c.VocabSize)
			}
			ids, pos, types = append(ids, id), append(pos, c.PositionOffset()+i), append(types, 0)
		}
		bounds = append(bounds, len(ids))
	}
	if pooling == PoolCLSMLP && m.pooler == nil {
		return nil, fmt.Errorf("pooling cls_mlp needs the checkpoint's pooler.dense")
	}
	t, h := len(ids), c.HiddenSize
	eps := float32(c.LayerNormEps)
	x, tmp := be.Zeros(t, h), be.Zeros(t, h)
	be.Embedding(x, m.word, ids)
	be.Embedding(tmp, m.pos, pos)
	be.Add(x, tmp)
	be.Embedding(tmp, m.typ, types)
	be.Add(tmp, x)
	be.LayerNorm(x, tmp, m.embLNW, m.embLNB, eps)
	q, k, v, a := be.Zeros(t, h), be.Zeros(t, h), be.Zeros(t, h), be.Zeros(t, h)
	mid := be.Zeros(t, c.Intermediate)
	for _, L := range m.layers {
		be.MatMul(q, x, L.q.w, L.q.b)
		be.MatMul(k, x, L.k.w, L.k.b)
		be.MatMul(v, x, L.v.w, L.v.b)
		be.SegmentAttention(a, q, k, v, bounds, c.Heads, h/c.Heads)
		be.MatMul(tmp, a, L.attnOut.w, L.attnOut.b)
		be.Add(tmp, x)
		be.LayerNorm(x, tmp, L.attnLNW, L.attnLNB, eps)
		be.MatMul(mid, x, L.inter.w, L.inter.b)
		be.GELU(mid, mid, c.HiddenAct != "gelu")
		be.MatMul(tmp, mid, L.out.w, L.out.b)
		be.Add(tmp, x)
		be.LayerNorm(x, tmp, L.outLNW, L.outLNB, eps)
	}
	p := be.Zeros(len(batch), h)
	switch pooling {
	case PoolMean:
		be.SegmentMean(p, x, bounds)
	case PoolCLS, PoolCLSMLP:
		be.Embedding(p, x, first) // each sequence's first row
		if pooling == PoolCLSMLP {
			pm := be.Zeros(len(batch), h)
			be.MatMul(pm, p, m.pooler.w, m.pooler.b)
			be.Tanh(p, pm)
		}
	default:
		return nil, fmt.Errorf("pooling %q is not one of cls, cls_mlp, mean", pooling)
	}
	flat := be.ToHost(p)
	out := make([][]float32, len(batch))
	for i := range out {
		out[i] = l2Normalize(flat[i*h : (i+1)*h])
	}
	return out, nil
}

// l2Normalize is v/max(‖v‖, 1e-12), as the tape's L2Normalize.
func l2Normalize(v []float32) []float32 {
	var s float64
	for _, x := range v {
		s += float64(x) * float64(x)
	}
	n := math.Max(math.Sqrt(s), 1e-12)
	out := make([]float32, len(v))
	for i, x := range v {
		out[i] = float32(float64(x) / n)
	}
	return out
}
