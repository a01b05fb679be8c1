package bert

import (
	"context"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/agemem/agemem/model/tape"
)

var tinyCfg = Config{ModelType: "bert", HiddenSize: 16, Layers: 2, Heads: 2, Intermediate: 32, MaxPositions: 24, HiddenAct: "gelu", LayerNormEps: 1e-12}

// tinyBERT writes a random encoder whose every parameter (LayerNorms and
// biases too) is random, so the reference exercises all of them.
func tinyBERT(t *testing.T, cfg Config) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "bert")
	if err := InitRandom(dir, cfg, testVocab(), true, 3); err != nil {
		t.Fatal(err)
	}
	w, err := Load[float32](dir, false)
	if err != nil {
		t.Fatal(err)
	}
	r := rand.New(rand.NewPCG(5, 6))
	for _, n := range w.Named {
		if strings.Contains(n.Name, "LayerNorm") || strings.HasSuffix(n.Name, ".bias") {
			for i := range n.V.Val {
				n.V.Val[i] += float32(r.NormFloat64() * 0.3)
			}
		} else {
			for i := range n.V.Val {
				n.V.Val[i] *= 20 // N(0, 0.4²): far from the identity-like init
			}
		}
	}
	if err := w.Save(dir); err != nil {
		t.Fatal(err)
	}
	return dir
}

// reference is an independent float64 BERT written the way the paper and
// transformers' modeling_bert describe it: a padded batch, an additive
// attention mask over the padding, the erf GELU, post-LayerNorm. It reads
// the parameters by their Hugging Face names.
func reference(p map[string][]float64, c Config, batch [][]int) (hidden [][][]float64, pooled map[string][][]float64) {
	h, nh := c.HiddenSize, c.Heads
	hd := h / nh
	L := 0
	for _, s := range batch {
		L = max(L, len(s))
	}
	linear := func(x []float64, name string, in, out int) []float64 {
		w, b := p[name+".weight"], p[name+".bias"]
		y := make([]float64, out)
		for o := range out {
			s := b[o]
			for i := range in {
				s += w[o*in+i] * x[i]
			}
			y[o] = s
		}
		return y
	}
	ln := func(x []float64, name string) []float64 {
		var mean, v float64
		for _, e := range x {
			mean += e
		}
		mean /= float64(len(x))
		for _, e := range x {
			v += (e - mean) * (e - mean)
		}
		v /= float64(len(x))
		y := make([]float64, len(x))
		for i, e := range x {
			y[i] = (e-mean)/math.Sqrt(v+c.LayerNormEps)*p[name+".weight"][i] + p[name+".bias"][i]
		}
		return y
	}
	pooled = map[string][][]float64{}
	for _, seq := range batch {
		mask := make([]bool, L)
		x := make([][]float64, L)
		for i := range L {
			id := 0 // [PAD]
			if i < len(seq) {
				id, mask[i] = seq[i], true
			}
			x[i] = make([]float64, h)
			for j := range h {
				x[i][j] = p["embeddings.word_embeddings.weight"][id*h+j] + p["embeddings.position_embeddings.weight"][(c.PositionOffset()+i)*h+j] +
					p["embeddings.token_type_embeddings.weight"][j]
			}
			x[i] = ln(x[i], "embeddings.LayerNorm")
		}
		for l := range c.Layers {
			pre := "encoder.layer." + string(rune('0'+l)) + "."
			q, k, v := make([][]float64, L), make([][]float64, L), make([][]float64, L)
			for i := range L {
				q[i], k[i], v[i] = linear(x[i], pre+"attention.self.query", h, h), linear(x[i], pre+"attention.self.key", h, h), linear(x[i], pre+"attention.self.value", h, h)
			}
			next := make([][]float64, L)
			for i := range L {
				ctx := make([]float64, h)
				for head := range nh {
					scores := make([]float64, L)
					m := math.Inf(-1)
					for j := range L {
						s := 0.0
						for d := range hd {
							s += q[i][head*hd+d] * k[j][head*hd+d]
						}
						s /= math.Sqrt(float64(hd))
						if !mask[j] {
							s += -1e30
						}
						scores[j] = s
						m = math.Max(m, s)
					}
					var z float64
					for j := range L {
						scores[j] = math.Exp(scores[j] - m)
						z += scores[j]
					}
					for j := range L {
						for d := range hd {
							ctx[head*hd+d] += scores[j] / z * v[j][head*hd+d]
						}
					}
				}
				a := linear(ctx, pre+"attention.output.dense", h, h)
				for j := range h {
					a[j] += x[i][j]
				}
				a = ln(a, pre+"attention.output.LayerNorm")
				inter := linear(a, pre+"intermediate.dense", h, c.Intermediate)
				for j, e := range inter {
					inter[j] = 0.5 * e * (1 + math.Erf(e/math.Sqrt2))
				}
				o := linear(inter, pre+"output.dense", c.Intermediate, h)
				for j := range h {
					o[j] += a[j]
				}
				next[i] = ln(o, pre+"output.LayerNorm")
			}
			x = next
		}
		hidden = append(hidden, x[:len(seq)])
		norm := func(v []float64) []float64 {
			var s float64
			for _, e := range v {
				s += e * e
			}
			out := make([]float64, len(v))
			for i, e := range v {
				out[i] = e / math.Sqrt(s)
			}
			return out
		}
		mean := make([]float64, h)
		for i := range len(seq) {
			for j := range h {
				mean[j] += x[i][j] / float64(len(seq))
			}
		}
		mlp := linear(x[0], "pooler.dense", h, h)
		for j := range mlp {
			mlp[j] = math.Tanh(mlp[j])
		}
		pooled[PoolCLS] = append(pooled[PoolCLS], norm(x[0]))
		pooled[PoolMean] = append(pooled[PoolMean], norm(mean))
		pooled[PoolCLSMLP] = append(pooled[PoolCLSMLP], norm(mlp))
	}
	return hidden, pooled
}

// The tape's encoder, packed, matches the padded, masked reference in
// float64 to rounding and in float32 (the Encoder used for embeddings,
// split over several token-sized batches) to float32 precision, for BERT
// and RoBERTa position ids.
func TestEncoderMatchesReference(t *testing.T) {
	texts := []string{"Marla Quenby was born in Oslo in 1971.", "the capital of norway", "Oslo!", "a river flows through the city of oslo, marla"}
	for _, typ := range []string{"bert", "roberta"} {
		cfg := tinyCfg
		cfg.ModelType = typ
		if typ == "roberta" {
			cfg.PadTokenID = 0
			cfg.HiddenAct = "gelu" // the reference uses erf
		}
		dir := tinyBERT(t, cfg)
		w64, err := Load[float64](dir, false)
		if err != nil {
			t.Fatal(err)
		}
		p := map[string][]float64{}
		for _, n := range w64.Named {
			p[n.Name] = n.V.Val
		}
		tok, _ := LoadWordPiece(dir)
		var batch [][]int
		for _, s := range texts {
			batch = append(batch, tok.Encode(s, 0))
		}
		wantH, wantP := reference(p, w64.Config, batch)
		tp := tape.New[float64]()
		h, segs, err := w64.Forward(tp, batch, 0, 0, 0)
		if err != nil {
			t.Fatal(err)
		}
		worst := 0.0
		for b, s := range segs {
			for i := range s.Hi - s.Lo {
				for j := range cfg.HiddenSize {
					worst = math.Max(worst, math.Abs(h.Val[(s.Lo+i)*cfg.HiddenSize+j]-wantH[b][i][j]))
				}
			}
		}
		if worst > 1e-10 {
			t.Errorf("%s: hidden states differ from the reference by %.2e", typ, worst)
		}
		for _, pool := range []string{PoolCLS, PoolCLSMLP, PoolMean} {
			pv, err := w64.Pool(tp, h, segs, pool)
			if err != nil {
				t.Fatal(err)
			}
			enc, err := LoadEncoder(dir, pool, 24, nil) // a batch per sentence or two
			if err != nil {
				t.Fatal(err)
			}
			got32, err := enc.Embed(context.Background(), texts)
			if err != nil {
				t.Fatal(err)
			}
			var w64err, w32err float64
			for b := range batch {
				for j := range cfg.HiddenSize {
					w64err = math.Max(w64err, math.Abs(pv.Val[b*cfg.HiddenSize+j]-wantP[pool][b][j]))
					w32err = math.Max(w32err, math.Abs(float64(got32[b][j])-wantP[pool][b][j]))
				}
			}
			if w64err > 1e-10 || w32err > 2e-5 {
				t.Errorf("%s %s pooling: float64 off by %.2e, float32 encoder off by %.2e", typ, pool, w64err, w32err)
			}
		}
	}
}

// SimCSE trains through every op: the float64 gradient of an InfoNCE loss
// over a packed batch matches finite differences on a sample of every
// parameter.
func TestEncoderGradients(t *testing.T) {
	dir := tinyBERT(t, tinyCfg)
	w, err := Load[float64](dir, true)
	if err != nil {
		t.Fatal(err)
	}
	tok, _ := LoadWordPiece(dir)
	batch := [][]int{tok.Encode("marla was born in oslo", 0), tok.Encode("the capital of norway", 0), tok.Encode("oslo", 0)}
	loss := func() (float64, *tape.Tape[float64], *tape.Var[float64]) {
		tp := tape.New[float64]()
		h, segs, _ := w.Forward(tp, batch, 0, 0, 0)
		a, _ := w.Pool(tp, h, segs, PoolCLSMLP)
		b, _ := w.Pool(tp, h, segs, PoolMean)
		lp := tp.LogProbs(tp.Scale(tp.Linear(a, b, nil), 1/0.05), []int{0, 1, 2})
		s := 0.0
		for _, v := range lp.Val {
			s -= v
		}
		return s, tp, lp
	}
	_, tp, lp := loss()
	dy := []float64{-1, -1, -1}
	tp.Backward(lp, dy)
	r := rand.New(rand.NewPCG(1, 1))
	const h = 1e-6
	for _, n := range w.Named {
		for range 3 {
			i := r.IntN(len(n.V.Val))
			orig := n.V.Val[i]
			n.V.Val[i] = orig + h
			up, _, _ := loss()
			n.V.Val[i] = orig - h
			down, _, _ := loss()
			n.V.Val[i] = orig
			num := (up - down) / (2 * h)
			var g float64
			if n.V.Grad != nil {
				g = n.V.Grad[i]
			}
			if math.Abs(num-g) > 1e-5*math.Max(1, math.Abs(num)) {
				t.Errorf("%s[%d]: tape %.8g, finite differences %.8g", n.Name, i, g, num)
			}
		}
	}
}

func TestLoadErrors(t *testing.T) {
	dir := tinyBERT(t, tinyCfg)
	for _, c := range []struct {
		cfg  string
		want string
	}{
		{`{"model_type": "gpt2", "hidden_size": 16, "num_hidden_layers": 1, "num_attention_heads": 2, "intermediate_size": 8, "vocab_size": 9, "max_position_embeddings": 8}`, "only bert and roberta"},
		{`{"model_type": "bert", "hidden_size": 15, "num_hidden_layers": 1, "num_attention_heads": 2, "intermediate_size": 8, "vocab_size": 9, "max_position_embeddings": 8}`, "multiple of num_attention_heads"},
		{`{"model_type": "bert", "hidden_size": 16, "num_hidden_layers": 3, "num_attention_heads": 2, "intermediate_size": 32, "vocab_size": 120, "max_position_embeddings": 24}`, "encoder.layer.2"},
		{`{"model_type": "bert", "hidden_size": 16, "num_hidden_layers": 2, "num_attention_heads": 2, "intermediate_size": 64, "vocab_size": 120, "max_position_embeddings": 24}`, "has shape"},
		{`{"model_type": "bert", "hidden_act": "relu6", "hidden_size": 16, "num_hidden_layers": 2, "num_attention_heads": 2, "intermediate_size": 32, "vocab_size": 120, "max_position_embeddings": 24}`, "hidden_act"},
	} {
		if err := writeFile(filepath.Join(dir, "config.json"), c.cfg); err != nil {
			t.Fatal(err)
		}
		if _, err := Load[float32](dir, false); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v", c.want, err)
		}
	}
	good := tinyBERT(t, tinyCfg)
	if _, err := LoadEncoder(good, "max", 0, nil); err == nil || !strings.Contains(err.Error(), "pooling") {
		t.Errorf("bad pooling: %v", err)
	}
	w, _ := Load[float32](good, false)
	if _, _, err := w.Forward(tape.New[float32](), [][]int{make([]int, 30)}, 0, 0, 0); err == nil || !strings.Contains(err.Error(), "1 to 24") {
		t.Errorf("too long: %v", err)
	}
	if _, _, err := w.Forward(tape.New[float32](), [][]int{{2, 9999}}, 0, 0, 0); err == nil || !strings.Contains(err.Error(), "outside the vocabulary") {
		t.Errorf("bad id: %v", err)
	}
}

func writeFile(path, s string) error { return os.WriteFile(path, []byte(s), 0o644) }
