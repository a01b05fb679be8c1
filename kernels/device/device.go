// Package device opens the compute backend a user asks for: "cpu",
// "cuda" / "cuda:N", or "auto" (the first GPU if one can be opened, else the
// CPU, saying so once).
package device

import (
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"sync"

	"github.com/agemem/agemem/kernels"
	"github.com/agemem/agemem/kernels/cpu"
	"github.com/agemem/agemem/kernels/cuda"
)

var fallbackOnce sync.Once

// inferenceCPU is the CPU backend as Open gives it (BF16 GEMMs on bf16
// weights); OpenTrainers turns that off for training.
func inferenceCPU() *cpu.Backend { return &cpu.Backend{BF16: true} }

// Open returns the backend for spec, for inference: the CPU backend rounds
// activations to bf16 for GEMMs on bf16 weights (cpu.Backend.BF16), as the
// CUDA backend does. Messages (the device chosen, or the CPU fallback) go
// to log, which may be nil.
func Open(spec string, log io.Writer) (kernels.Backend, error) {
	if log == nil {
		log = io.Discard
	}
	switch {
	case spec == "cpu":
		return inferenceCPU(), nil
	case spec == "auto" || spec == "":
		g, err := cuda.New(0)
		if err == nil {
			describe(log, g)
			return g, nil
		}
		if !errors.Is(err, cuda.ErrNoDevice) {
			return nil, err
		}
		fallbackOnce.Do(func() { fmt.Fprintln(log, "no CUDA device found; using CPU") })
		return inferenceCPU(), nil
	case spec == "cuda" || strings.HasPrefix(spec, "cuda:"):
		n := 0
		if i, ok := strings.CutPrefix(spec, "cuda:"); ok {
			var err error
			if n, err = strconv.Atoi(i); err != nil || n < 0 {
				return nil, fmt.Errorf("device %q: want cuda:N with N a GPU ordinal", spec)
			}
		}
		g, err := cuda.New(n)
		if err != nil {
			return nil, fmt.Errorf("device %s: %w", spec, err)
		}
		describe(log, g)
		return g, nil
	}
	return nil, fmt.Errorf("device %q: want auto, cpu, cuda or cuda:N", spec)
}

func describe(log io.Writer, g *cuda.Backend) {
	free, total := g.MemInfo()
	fmt.Fprintf(log, "using %s, %.1f of %.1f GiB free\n", g.Device(), float64(free)/(1<<30), float64(total)/(1<<30))
}

// OpenTrainers opens the training devices named by model.devices (each as
// Open takes it, "auto" excepted) and the reducer that all-reduces their
// gradients: NCCL for two or more GPUs when libnccl.so.2 loads, else host
// memory (said on log). bf16 runs the GPUs' matmuls on tensor cores with
// bf16 inputs (model.train_dtype).
func OpenTrainers(specs []string, bf16 bool, log io.Writer) ([]kernels.TrainBackend, kernels.Reducer, error) {
	if log == nil {
		log = io.Discard
	}
	var bes []kernels.TrainBackend
	gpus := 0
	for i, s := range specs {
		if s == "auto" || s == "" {
			return nil, nil, fmt.Errorf("model.devices[%d]: name the device (cpu, cuda:N), not %q", i, s)
		}
		be, err := Open(s, log)
		if err != nil {
			return nil, nil, fmt.Errorf("model.devices[%d]: %w", i, err)
		}
		tr, ok := be.(kernels.TrainBackend)
		if !ok {
			return nil, nil, fmt.Errorf("model.devices[%d]: the %s backend cannot train", i, be.Name())
		}
		if g, ok := be.(*cuda.Backend); ok {
			g.BF16 = bf16
			gpus++
		}
		if c, ok := be.(*cpu.Backend); ok {
			c.BF16 = false // the replica's backward and its checks are float32
		}
		bes = append(bes, tr)
	}
	var reduce kernels.Reducer = kernels.HostReduce{}
	if gpus == len(bes) && gpus > 1 {
		n, err := cuda.NewNCCL(bes)
		if err == nil {
			return bes, n, nil
		}
		fmt.Fprintf(log, "NCCL unavailable (%v); all-reducing through host memory\n", err)
	}
	return bes, reduce, nil
}

// OpenEncoderTrainer opens spec (simcse.device) for training an encoder:
// a GPU, its matmuls on tensor cores with bf16 inputs when bf16, or nil
// where spec is cpu or auto finds no GPU (the caller trains on the CPU's
// autodiff tape).
func OpenEncoderTrainer(spec string, bf16 bool, log io.Writer) (kernels.EncoderTrainer, error) {
	if spec == "cpu" {
		return nil, nil
	}
	be, err := Open(spec, log)
	if err != nil {
		return nil, err
	}
	g, ok := be.(*cuda.Backend)
	if !ok {
		return nil, nil
	}
	g.BF16 = bf16
	return g, nil
}

// Memory describes a device's memory use for the logs: live tensors, the
// allocator's cache and the device's free memory (empty on the CPU).
func Memory(be kernels.Backend) string {
	g, ok := be.(*cuda.Backend)
	if !ok {
		return ""
	}
	live, cached := g.MemStats()
	free, total := g.MemInfo()
	return fmt.Sprintf("%s: %.2f GiB in tensors, %.2f GiB cached, %.1f of %.1f GiB free", g.Device(), float64(live)/(1<<30), float64(cached)/(1<<30), float64(free)/(1<<30), float64(total)/(1<<30))
}
