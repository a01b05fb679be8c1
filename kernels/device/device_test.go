package device

import (
	"bytes"
	"strings"
	"testing"

	"github.com/agemem/agemem/kernels/cpu"
	"github.com/agemem/agemem/kernels/cuda"
)

func TestOpen(t *testing.T) {
	// For inference the CPU rounds activations to bf16 on bf16 weights, as
	// the GPU does.
	if be, err := Open("cpu", nil); err != nil || be.Name() != "cpu" || !be.(*cpu.Backend).BF16 {
		t.Fatalf("cpu: %v", err)
	}
	var log bytes.Buffer
	be, err := Open("auto", &log)
	if err != nil {
		t.Fatal(err)
	}
	if _, gpuErr := cuda.New(0); gpuErr != nil {
		if be.Name() != "cpu" || !strings.Contains(log.String(), "no CUDA device found; using CPU") {
			t.Fatalf("auto without a GPU: %s, log %q", be.Name(), log.String())
		}
		if _, err := Open("cuda:0", nil); err == nil {
			t.Fatal("cuda:0 without a GPU must be an error")
		}
	} else if be.Name() != "cuda" || !strings.Contains(log.String(), "using ") {
		t.Fatalf("auto with a GPU: %s, log %q", be.Name(), log.String())
	}
	for _, bad := range []string{"tpu", "cuda:x", "cuda:-1"} {
		if _, err := Open(bad, nil); err == nil {
			t.Errorf("%q must be refused", bad)
		}
	}
}

// An encoder trains on the tape (nil) on the CPU, on a GPU where one is
// named or found.
func TestOpenEncoderTrainer(t *testing.T) {
	if et, err := OpenEncoderTrainer("cpu", true, nil); err != nil || et != nil {
		t.Fatalf("cpu: %v, %v", et, err)
	}
	et, err := OpenEncoderTrainer("auto", true, nil)
	if _, gpuErr := cuda.New(0); gpuErr != nil {
		if err != nil || et != nil {
			t.Fatalf("auto without a GPU: %v, %v", et, err)
		}
	} else if err != nil || et == nil || !et.(*cuda.Backend).BF16 {
		t.Fatalf("auto with a GPU: %v, %v", et, err)
	}
	if _, err := OpenEncoderTrainer("cuda:x", false, nil); err == nil {
		t.Fatal("cuda:x must be refused")
	}
}

func TestOpenTrainers(t *testing.T) {
	bes, reduce, err := OpenTrainers([]string{"cpu", "cpu"}, true, nil)
	if err != nil || len(bes) != 2 || reduce.Name() != "host memory" {
		t.Fatalf("cpu, cpu: %d devices, %v, %v", len(bes), reduce, err)
	}
	for i, be := range bes {
		if be.(*cpu.Backend).BF16 { // training's backward and its checks are float32
			t.Errorf("training device %d rounds activations to bf16", i)
		}
	}
	for _, tc := range []struct {
		specs []string
		want  string
	}{
		{[]string{"cpu", "auto"}, `model.devices[1]: name the device`},
		{[]string{"tpu"}, `model.devices[0]: device "tpu"`},
	} {
		if _, _, err := OpenTrainers(tc.specs, false, nil); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: %v, want %q", tc.specs, err, tc.want)
		}
	}
	if _, gpuErr := cuda.New(0); gpuErr != nil {
		if _, _, err := OpenTrainers([]string{"cuda:0"}, false, nil); err == nil || !strings.Contains(err.Error(), "no CUDA device found") {
			t.Errorf("cuda:0 without a GPU: %v", err)
		}
	}
}
