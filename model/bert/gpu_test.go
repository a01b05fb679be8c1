package bert

import (
	"context"
	"errors"
	"math"
	"testing"

	"github.com/agemem/agemem/kernels/cuda"
)

// TestEncoderOnGPU: the encoder's batches on the GPU give the CPU's
// embeddings, for BERT and RoBERTa position ids, both GELUs and every
// pooling, with sequences packed several to a batch.
func TestEncoderOnGPU(t *testing.T) {
	g, err := cuda.New(0)
	if errors.Is(err, cuda.ErrNoDevice) {
		t.Skipf("GPU test skipped: %v", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	texts := []string{"Marla Quenby was born in Oslo in 1971.", "the capital of norway", "Oslo!", "a river flows through the city of oslo, marla", "x"}
	for _, typ := range []string{"bert", "roberta"} {
		cfg := tinyCfg
		cfg.ModelType = typ
		cfg.Layers = 3
		if typ == "roberta" {
			cfg.PadTokenID = 0
			cfg.HiddenAct = "gelu_new"
		}
		dir := tinyBERT(t, cfg)
		for _, pool := range []string{PoolCLS, PoolCLSMLP, PoolMean} {
			onCPU, err := LoadEncoder(dir, pool, 40, nil)
			if err != nil {
				t.Fatal(err)
			}
			onGPU, err := LoadEncoder(dir, pool, 40, g)
			if err != nil {
				t.Fatal(err)
			}
			want, err := onCPU.Embed(context.Background(), texts)
			if err != nil {
				t.Fatal(err)
			}
			got, err := onGPU.Embed(context.Background(), texts)
			if err != nil {
				t.Fatal(err)
			}
			worst := 0.0
			for i := range want {
				for j := range want[i] {
					worst = math.Max(worst, math.Abs(float64(got[i][j]-want[i][j])))
				}
			}
			t.Logf("%s %s: GPU vs CPU max abs difference %.2e", typ, pool, worst)
			if worst > 2e-5 {
				t.Errorf("%s %s: GPU embeddings differ from the CPU's by %.2e", typ, pool, worst)
			}
		}
	}
}
