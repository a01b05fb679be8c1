package cuda

import (
	"fmt"
	"runtime"
	"sync"

	"github.com/agemem/agemem/kernels"
)

// ncclUniqueID is NCCL's ncclUniqueId: 128 opaque bytes that rank 0 makes
// and every rank passes to ncclCommInitRank by value (System V: on the
// stack, as purego places structs over 64 bytes).
type ncclUniqueID struct{ Internal [128]byte }

// commInitRank is ncclCommInitRank's signature, named so that a test
// holds the by-value struct to the C ABI.
type commInitRank = func(comm *uintptr, nranks int32, id ncclUniqueID, rank int32) int32

type ncclLib struct {
	CommInitAll    func(comms *uintptr, ndev int32, devs *int32) int32
	GetUniqueId    func(id *ncclUniqueID) int32
	CommInitRank   commInitRank
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
	ranks int // processes the communicator spans (0: this one's GPUs)
}

func loadNCCL() error {
	ncclOnce.Do(func() {
		lib, _, err := open([]string{"libnccl.so.2", "libnccl.so"})
		if err != nil {
			ncclErr = err
			return
		}
		ncclErr = bind(lib, &nccl, func(f string) string { return "nccl" + f })
	})
	return ncclErr
}

// NewNCCL opens communicators over the backends' GPUs. It fails (and the
// caller falls back to host memory) when libnccl.so.2 cannot be loaded.
func NewNCCL(bes []kernels.TrainBackend) (*NCCL, error) {
	if err := loadNCCL(); err != nil {
		return nil, err
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

// NCCLUniqueID makes the id the ranks of a run across processes open
// their communicator with: rank 0 makes it, the control plane's
// rendezvous hands it to the others (NCCL's own recipe: any side channel).
func NCCLUniqueID() ([]byte, error) {
	if err := loadNCCL(); err != nil {
		return nil, err
	}
	var id ncclUniqueID
	if r := nccl.GetUniqueId(&id); r != 0 {
		return nil, fmt.Errorf("ncclGetUniqueId: %s", goString(nccl.GetErrorString(r)))
	}
	return id.Internal[:], nil
}

// NewNCCLRank opens this process's communicator, rank of nranks
// processes with one GPU each (ncclCommInitRank with rank 0's id), as the
// Reducer of a data-parallel run across machines.
func NewNCCLRank(be kernels.TrainBackend, id []byte, nranks, rank int) (*NCCL, error) {
	if err := loadNCCL(); err != nil {
		return nil, err
	}
	g, ok := be.(*Backend)
	if !ok {
		return nil, fmt.Errorf("NCCL: the rank's device is %s, not a GPU", be.Name())
	}
	var uid ncclUniqueID
	if len(id) != len(uid.Internal) {
		return nil, fmt.Errorf("NCCL: a unique id of %d bytes, want %d (rank 0's ncclGetUniqueId)", len(id), len(uid.Internal))
	}
	copy(uid.Internal[:], id)
	n := &NCCL{comms: make([]uintptr, 1), devs: []*Backend{g}, ranks: nranks}
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	g.bind()
	if r := nccl.CommInitRank(&n.comms[0], int32(nranks), uid, int32(rank)); r != 0 {
		return nil, fmt.Errorf("ncclCommInitRank (rank %d of %d): %s", rank, nranks, goString(nccl.GetErrorString(r)))
	}
	return n, nil
}

// Name implements Reducer.
func (n *NCCL) Name() string {
	if n.ranks > 1 {
		return fmt.Sprintf("NCCL across %d ranks", n.ranks)
	}
	return "NCCL"
}

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
