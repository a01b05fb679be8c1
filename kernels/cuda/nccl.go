package cuda

import (
	"fmt"
	"runtime"
	"sync"

	"github.com/agemem/agemem/kernels"
)

type ncclLib struct {
	CommInitAll    func(comms *uintptr, ndev int32, devs *int32) int32
	AllReduce      func(send, recv uint64, count uint64, dtype, op int32, comm uintptr, stream uintptr) int32
	GroupStart     func() int32
	GroupEnd       func() int32
	GetErrorString func(r int32) *byte
}

var (
	ncclOnce sync.Once
	nccl     ncclLib
	ncclErr  error
)

// NCCL all-reduces gradients between GPUs of this process with NVIDIA's
// collective library (libnccl.so.2, loaded at run time): it implements
// model/train's Reducer. Backends must be this package's, one per GPU.
type NCCL struct {
	comms []uintptr
	devs  []*Backend
}

// NewNCCL opens communicators over the backends' GPUs. It fails (and the
// caller falls back to host memory) when libnccl.so.2 cannot be loaded.
func NewNCCL(bes []kernels.TrainBackend) (*NCCL, error) {
	ncclOnce.Do(func() {
		lib, _, err := open([]string{"libnccl.so.2", "libnccl.so"})
		if err != nil {
			ncclErr = err
			return
		}
		ncclErr = bind(lib, &nccl, func(f string) string { return "nccl" + f })
	})
	if ncclErr != nil {
		return nil, ncclErr
	}
	n := &NCCL{comms: make([]uintptr, len(bes))}
	ords := make([]int32, len(bes))
	for i, be := range bes {
		g, ok := be.(*Backend)
		if !ok {
			return nil, fmt.Errorf("NCCL: device %d is %s, not a GPU", i, be.Name())
		}
		n.devs = append(n.devs, g)
		ords[i] = g.ordinal
	}
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	n.devs[0].bind()
	if r := nccl.CommInitAll(&n.comms[0], int32(len(ords)), &ords[0]); r != 0 {
		return nil, fmt.Errorf("ncclCommInitAll: %s", goString(nccl.GetErrorString(r)))
	}
	return n, nil
}

// Name implements Reducer.
func (n *NCCL) Name() string { return "NCCL" }

// AllReduce implements Reducer: one in-place ncclAllReduce (sum) per
// parameter across the GPUs, grouped so that NCCL runs them together.
func (n *NCCL) AllReduce(_ []kernels.TrainBackend, grads [][]kernels.Tensor) error {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	if r := nccl.GroupStart(); r != 0 {
		return fmt.Errorf("ncclGroupStart: %s", goString(nccl.GetErrorString(r)))
	}
	for i, g := range n.devs {
		g.bind()
		for _, t := range grads[i] {
			p := ptr(t)
			// ncclFloat32 = 7, ncclSum = 0, on the GPU's stream: after
			// the backward that wrote the gradient, before the optimiser.
			if r := nccl.AllReduce(p, p, uint64(t.Len()), 7, 0, n.comms[i], g.stream); r != 0 {
				nccl.GroupEnd()
				return fmt.Errorf("ncclAllReduce: %s", goString(nccl.GetErrorString(r)))
			}
		}
	}
	if r := nccl.GroupEnd(); r != 0 {
		return fmt.Errorf("ncclGroupEnd: %s", goString(nccl.GetErrorString(r)))
	}
	for i := range grads {
		for _, t := range grads[i] {
			runtime.KeepAlive(t)
		}
	}
	return nil
}
