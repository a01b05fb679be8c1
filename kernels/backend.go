// Package kernels defines the compute backend the model code runs on: a
// device that holds tensors and runs the engine's ops on them. The CPU
// backend (kernels/cpu) is the readable reference; a CUDA backend implements
// the same interface, so model code never changes with the device.
package kernels

// Tensor is a row-major float32 tensor on a backend's device. Model code
// never sees its storage: host memory on the CPU, device memory on a GPU.
type Tensor interface {
	Shape() []int
	Len() int
}

// Weight is a [rows, cols] weight matrix as a checkpoint stores it: float32
// values, or bfloat16 or IEEE half bits (then usually a view into a
// memory-mapped file). Exactly one of F32, BF16, F16 and Q8 is set.
type Weight struct {
	Rows, Cols int
	F32        []float32
	BF16       []uint16
	F16        []uint16
	// Q8 and Q8Scale hold the matrix as Q8_0 blocks, GGUF's 8-bit type:
	// each run of QK8 values along a row is Q8Scale[b]·Q8[i] (QuantizeQ8).
	Q8      []int8
	Q8Scale []float32
}

// Backend is a compute device. Shapes are in each method's comment; t is a
// number of tokens (rows), d a row width.
type Backend interface {
	Name() string

	// Zeros allocates a zeroed tensor.
	Zeros(shape ...int) Tensor
	// Empty allocates a tensor for an op to overwrite whole (MatMul's y,
	// an RMSNorm's output): its contents are unspecified until then, which
	// spares a device the memset.
	Empty(shape ...int) Tensor
	// FromHost copies host data into a new tensor.
	FromHost(data []float32, shape ...int) Tensor
	// ToHost copies a tensor out.
	ToHost(t Tensor) []float32
	// Upload makes a weight resident on the device (a view where it can).
	Upload(w Weight) Tensor
	// Rows is a view of rows [lo, hi) of a tensor's first dimension.
	Rows(t Tensor, lo, hi int) Tensor
	// CopyRows copies n rows of src from srcRow into dst at dstRow.
	CopyRows(dst Tensor, dstRow int, src Tensor, srcRow, n int)

	// Embedding: out[i, :] = table[ids[i], :].
	Embedding(out, table Tensor, ids []int)
	// MatMul: y[m, n] = x[m, k] · w[n, k]ᵀ (+ bias[n]); bias may be nil.
	MatMul(y, x, w, bias Tensor)
	// RMSNorm: y[r, :] = x[r, :] / sqrt(mean(x[r, :]²) + eps) · w, rows of len(w).
	RMSNorm(y, x, w Tensor, eps float32)
	// Rope rotates x[t, heads·headDim] in place, token i at position pos[i]
	// (rotate-half pairs, angle pos·theta^(-2j/headDim)).
	Rope(x Tensor, pos []int, heads, headDim int, theta float64)
	// Attention is causal grouped-query attention of q[t, heads·hd] (the
	// tokens at positions start..start+t-1) over the caches kc, vc
	// [maxT, kvHeads·hd] that already hold them; valid masks cache
	// positions (nil: all valid). out[t, heads·hd].
	Attention(out, q, kc, vc Tensor, valid []bool, start, heads, kvHeads, hd int)
	// SiLUMul: out = silu(gate) · up, elementwise.
	SiLUMul(out, gate, up Tensor)
	// Add: y += x.
	Add(y, x Tensor)
	// Softmax over the last dimension.
	Softmax(y, x Tensor)
	// LogSoftmax over the last dimension: y = x - logsumexp(x).
	LogSoftmax(y, x Tensor)

	// The ops of bidirectional encoders (BERT, RoBERTa):

	// LayerNorm: y[r, :] = (x[r, :] − mean)/sqrt(var + eps)·w + b, rows of
	// len(w), the variance biased (PyTorch's).
	LayerNorm(y, x, w, b Tensor, eps float32)
	// GELU: y = x·Φ(x) (erf), or with tanh the tanh approximation.
	GELU(y, x Tensor, tanh bool)
	// Tanh: y = tanh(x).
	Tanh(y, x Tensor)
	// SegmentAttention is bidirectional multi-head attention over packed
	// sequences: q, k, v, out [t, heads·hd], and row i attends to every
	// row of its segment, segment s being rows [bounds[s], bounds[s+1])
	// (bounds runs from 0 to t). The same result as a padded batch with a
	// padding mask, without work on padding.
	SegmentAttention(out, q, k, v Tensor, bounds []int, heads, hd int)
	// SegmentMean: out[s, :] = the mean of x's rows in segment s (bounds
	// as SegmentAttention's).
	SegmentMean(out, x Tensor, bounds []int)
}

// MaxTopK is the largest k a TopKer must select.
const MaxTopK = 64

// TopKer is a backend that selects nearest neighbours on its device: for
// each row of queries [q, d], the k rows of index [n, d] with the largest
// dot product (cosine similarity for L2-normalised rows), best first, ties
// to the lower row, with their scores; fewer than k when n < k. k is at
// most MaxTopK.
type TopKer interface {
	Backend
	TopK(index, queries Tensor, k int) (rows [][]int, scores [][]float32, err error)
}

// Dims is a tensor shape; backends embed it in their tensor types.
type Dims []int

// Shape implements Tensor.
func (d Dims) Shape() []int { return d }

// Len implements Tensor: the number of elements.
func (d Dims) Len() int {
	n := 1
	for _, x := range d {
		n *= x
	}
	return n
}

// TrainBackend is a Backend that also trains: the backward of each forward op
// and the optimiser, so that a training step (forward, backward, update)
// runs where the weights live. Backward ops accumulate (+=) into their
// gradient outputs, so a tensor used twice sums both contributions and
// micro-batches add up; any gradient output may be nil where it is not
// needed.
type TrainBackend interface {
	Backend

	// Zero clears a tensor.
	Zero(t Tensor)
	// AddScaled: y += s·x.
	AddScaled(y, x Tensor, s float32)
	// Dropout: y = x ∘ keep / (1−p), keep drawn from seed as DropoutBits
	// says (y may be x).
	Dropout(y, x Tensor, p float64, seed uint64)
	// GEMMOperand returns x as MatMul, MatMulAdd and MatMulBackward read
	// it (their x, or MatMulBackward's dy), for GEMMs that share it: a
	// backend whose GEMMs round their operands to bfloat16 rounds it once
	// into a copy that only those GEMMs may read; others return x.
	GEMMOperand(x Tensor) Tensor
	// DropoutOperand returns Dropout(x) as a new tensor that only MatMul,
	// MatMulAdd and MatMulBackward read, as their x: a backend whose GEMMs
	// round that operand to bfloat16 returns it so rounded, made in one
	// pass in half the memory (LoRA's dropped-out input).
	DropoutOperand(x Tensor, p float64, seed uint64) Tensor
	// DropoutAdd: y += x ∘ keep / (1−p), Dropout's mask: the backward of a
	// dropout accumulated into its input's gradient in one pass.
	DropoutAdd(y, x Tensor, p float64, seed uint64)

	// MatMulAdd: y += s·x·wᵀ (MatMul's shapes, no bias): a LoRA branch
	// added into its base projection's output without a temporary.
	MatMulAdd(y, x, w Tensor, s float32)
	// MatMulBackward of MatMul(y, x, w, bias): dx += dy·w, dw += dyᵀ·x,
	// db += Σ_rows dy.
	MatMulBackward(dx, dw, db, dy, x, w Tensor)
	// RMSNormBackward of RMSNorm(y, x, w, eps): dx, dw.
	RMSNormBackward(dx, dw, dy, x, w Tensor, eps float32)
	// RopeBackward rotates dy back in place: it becomes dx (a rotation's
	// inverse is its transpose).
	RopeBackward(dy Tensor, pos []int, heads, headDim int, theta float64)
	// SiLUMulBackward of SiLUMul(out, gate, up).
	SiLUMulBackward(dgate, dup, dy, gate, up Tensor)
	// EmbeddingBackward of Embedding(out, table, ids): dtable[ids[i]] += dy[i].
	EmbeddingBackward(dtable, dy Tensor, ids []int)
	// AttentionBackward of Attention(out, q, k, v, nil, start, ...) where
	// k and v hold exactly the start+t positions attended to: dq, dk, dv
	// from dout and the forward's out.
	AttentionBackward(dq, dk, dv, dout, out, q, k, v Tensor, start, heads, kvHeads, hd int)
	// LogProbs: out[i] = log softmax(logits[i, :])[targets[i]], without
	// materialising the log-softmax (targets[i] < 0: 0), and the entropy
	// of each row's distribution into ent (nil: not wanted).
	LogProbs(out, ent, logits Tensor, targets []int)
	// LogProbsBackward: dlogits[i, :] += dout[i]·(onehot(targets[i]) −
	// softmax(logits[i, :])).
	LogProbsBackward(dlogits, dout, logits Tensor, targets []int)

	// NarrowBF16 returns a copy of x [rows, ...] rounded to bfloat16 (to
	// nearest even), in half x's memory, as a [rows, width] table that
	// Embedding reads rows of back as float32: activation checkpoints under
	// mixed precision keep each layer's input so.
	NarrowBF16(x Tensor) Tensor
	// NarrowBF16Into rounds x to bfloat16 into dst, a bf16 tensor of x's
	// size (NarrowBF16's, or a bf16 weight Upload made), in place: the
	// working copy of a weight whose float32 master lives elsewhere
	// (ZeRO-2, model.zero_stage) takes each update so.
	NarrowBF16Into(dst, x Tensor)

	// SumSquares: acc[0] += Σ x² (the global gradient norm, summed over
	// parameters on the device).
	SumSquares(acc, x Tensor)
	// AdamW is one fused step of AdamW over w with gradient g and moments
	// m, v, the gradient first scaled so the global norm sqrt(sumSq[0])
	// is at most s.MaxNorm (sumSq nil or MaxNorm 0: no clipping).
	AdamW(w, g, m, v, sumSq Tensor, s AdamWStep)
}

// EncoderTrainer is a TrainBackend that also trains bidirectional encoders
// (BERT, RoBERTa: SimCSE): the backward of each encoder op, and the
// encoder's attention with dropout on its probabilities. Backward ops
// accumulate into their gradients, as TrainBackend's do.
type EncoderTrainer interface {
	TrainBackend
	// LayerNormBackward of LayerNorm(y, x, w, b, eps): dx, dw, db (the
	// statistics recomputed from x).
	LayerNormBackward(dx, dw, db, dy, x, w Tensor, eps float32)
	// GELUBackward of GELU(y, x, tanh): dx += dy·GELU'(x).
	GELUBackward(dx, dy, x Tensor, tanh bool)
	// TanhBackward of Tanh(y, x), from its output: dx += dy·(1 − y²).
	TanhBackward(dx, dy, y Tensor)
	// SegmentMeanBackward of SegmentMean(out, x, bounds): each row r of
	// segment s gets dx[r] += dy[s]/n_s.
	SegmentMeanBackward(dx, dy Tensor, bounds []int)
	// SegmentAttentionDropout is SegmentAttention with dropout p on the
	// attention probabilities (BERT's attention_probs_dropout_prob): the
	// probability of query row i, head h, key row j is kept when
	// DropoutBits(seed, (i·heads + h)·t + j) passes DropoutThreshold(p) and
	// is scaled by 1/(1−p). p = 0 is SegmentAttention.
	SegmentAttentionDropout(out, q, k, v Tensor, bounds []int, heads, hd int, p float64, seed uint64)
	// SegmentAttentionBackward of SegmentAttentionDropout with the same
	// p and seed: dq, dk, dv (the probabilities recomputed).
	SegmentAttentionBackward(dq, dk, dv, dout, q, k, v Tensor, bounds []int, heads, hd int, p float64, seed uint64)
}

// AttentionDropoutCounter is the counter of EncoderTrainer's attention
// dropout mask for query row i, head h and key row j of t rows.
func AttentionDropoutCounter(i, h, j, heads, t int) uint64 {
	return (uint64(i)*uint64(heads)+uint64(h))*uint64(t) + uint64(j)
}

// LSEAttender is a TrainBackend whose training attention can keep the
// rows' log-sum-exps for its backward, which then skips computing them
// again: on the CUDA backend's tensor-core kernels a recomputing step runs
// two attention forwards a layer instead of three.
type LSEAttender interface {
	// AttentionLSE is Attention(out, q, k, v, nil, start, ...) that also
	// writes lse [t, heads], the natural log-sum-exp of each query row's
	// scaled scores; false: the backend does not keep it here (out is
	// written, lse is not).
	AttentionLSE(out, lse, q, k, v Tensor, start, heads, kvHeads, hd int) bool
	// AttentionBackwardLSE is AttentionBackward given AttentionLSE's lse.
	AttentionBackwardLSE(dq, dk, dv, dout, out, lse, q, k, v Tensor, start, heads, kvHeads, hd int)
}

// PagedAttender is a Backend whose attention reads a paged KV cache where
// it lies: PagedAttention is Attention (valid nil) with position j's key
// and value in row rows[j] of kpool and vpool [blocks·blockSize,
// kvHeads·hd], a block table expanded to positions. Without it a paged
// cache gathers its rows into contiguous tensors first.
type PagedAttender interface {
	Backend
	PagedAttention(out, q, kpool, vpool Tensor, rows []int, start, heads, kvHeads, hd int)
}

// DecodeAttender is a Backend that runs a decode step's attention for a
// batch of sequences in one call: row r of q, k and v is sequence r's new
// token, at position pos[r]. Its key and value are written to its cache
// and it attends causally over positions 0..pos[r]: with rows[r] nil the
// cache is kc[r], vc[r] ([maxT, kvHeads·hd], position j in row j); else
// kc[r], vc[r] are a block pool and position j lies in its row rows[r][j]
// (a paged cache's block table, at least pos[r]+1 long). The same as
// CopyRows and Attention (or PagedAttention) per sequence, which on a GPU
// is three launches a sequence and layer.
type DecodeAttender interface {
	Backend
	DecodeAttention(out, q, k, v Tensor, kc, vc []Tensor, rows [][]int, pos []int, heads, kvHeads, hd int)
}

// PolicyGradienter is a TrainBackend that runs a policy-gradient loss
// where the log-probabilities are, so a GRPO step reads nothing back. The
// loss is rl/grpo's, and the kernel is held to it in tests.
type PolicyGradienter interface {
	TrainBackend
	// PolicyGradient is step-wise GRPO's per-token objective (Eq. 6)
	// where the log-probabilities are, so a step reads nothing back: with
	// ρ = exp(logp − old) (old nil: ρ = 1, π_old = π_θ detached),
	// ℓ = −min(ρA, clip(ρ, 1−ε, 1+ε)A) and Schulman's k3
	// kl = exp(ref − logp) − (ref − logp) − 1, it writes
	// dlogp[i] = w[i]·(dℓ/dlogp + β·dkl/dlogp) and adds Σ w·ℓ, Σ w·kl, the
	// clipped tokens and Σ ent (ent may be nil) into stats[0..3]; ref nil
	// is no reference (every kl 0, rl.beta 0)
	// (PolicyStatsOf names them once read).
	PolicyGradient(dlogp, stats, logp, ent, old, ref, adv, w Tensor, clip, beta float32)
}

// PolicyStats are a policy loss's sums over tokens.
type PolicyStats struct {
	Surrogate float64 // Σ w·ℓ_clip
	KL        float64 // Σ w·kl
	Clipped   float64 // tokens whose ratio was clipped
	Entropy   float64 // Σ entropy
}

// PolicyStatsOf names the sums a PolicyGradient kernel leaves in its stats
// tensor.
func PolicyStatsOf(v []float32) PolicyStats {
	return PolicyStats{Surrogate: float64(v[0]), KL: float64(v[1]), Clipped: float64(v[2]), Entropy: float64(v[3])}
}

// AdamWStep are one AdamW update's scalars: PyTorch's AdamW with
// decoupled decay,
//
//	w ← w·Decay − LR·(m/BC1)/(sqrt(v/BC2) + Eps)
//
// with Decay = 1 − lr·weight_decay (1 for norms and biases) and BCi the
// bias corrections 1 − βiᵗ.
type AdamWStep struct {
	LR, Beta1, Beta2, Eps, Decay, BC1, BC2 float64
	MaxNorm                                float64
}
