// Package cuda is the CUDA backend: the same kernels.Backend as the CPU, on
// an NVIDIA GPU. Nothing CUDA is needed at build time: the driver
// (libcuda.so.1), NVRTC and cuBLAS are opened at run time with purego,
// trying the sonames of CUDA 13, 12 and 11, and the kernels are CUDA C
// sources embedded in the binary, compiled by NVRTC for the device on first
// use.
package cuda

import (
	"errors"
	"fmt"
	"strings"
	"sync"
	"unsafe"

	"github.com/ebitengine/purego"
)

// ErrNoDevice is returned when no CUDA driver or device can be found.
var ErrNoDevice = errors.New("no CUDA device found")

type cuResult int32

// driver holds the CUDA driver API entry points.
type driver struct {
	Init                   func(flags uint32) cuResult
	DeviceGetCount         func(n *int32) cuResult
	DeviceGet              func(dev *int32, ordinal int32) cuResult
	DeviceGetAttribute     func(v *int32, attr int32, dev int32) cuResult
	DeviceGetName          func(name *byte, n int32, dev int32) cuResult
	DevicePrimaryCtxRetain func(ctx *uintptr, dev int32) cuResult
	CtxSetCurrent          func(ctx uintptr) cuResult
	CtxSynchronize         func() cuResult
	MemAlloc               func(ptr *uint64, size uint64) cuResult
	MemFree                func(ptr uint64) cuResult
	MemsetD8               func(ptr uint64, v uint8, n uint64) cuResult
	MemcpyHtoD             func(dst uint64, src unsafe.Pointer, n uint64) cuResult
	MemcpyDtoH             func(dst unsafe.Pointer, src uint64, n uint64) cuResult
	MemcpyDtoD             func(dst, src uint64, n uint64) cuResult
	MemsetD8Async          func(ptr uint64, v uint8, n uint64, stream uintptr) cuResult
	MemcpyHtoDAsync        func(dst uint64, src unsafe.Pointer, n uint64, stream uintptr) cuResult
	MemcpyDtoHAsync        func(dst unsafe.Pointer, src uint64, n uint64, stream uintptr) cuResult
	MemcpyDtoDAsync        func(dst, src uint64, n uint64, stream uintptr) cuResult
	MemAllocHost           func(p *unsafe.Pointer, size uint64) cuResult
	StreamCreate           func(stream *uintptr, flags uint32) cuResult
	StreamSynchronize      func(stream uintptr) cuResult
	ModuleLoadData         func(mod *uintptr, image unsafe.Pointer) cuResult
	ModuleGetFunction      func(fn *uintptr, mod uintptr, name *byte) cuResult
	LaunchKernel           func(fn uintptr, gx, gy, gz, bx, by, bz, shared uint32, stream uintptr, params *unsafe.Pointer, extra *unsafe.Pointer) cuResult
	FuncSetAttribute       func(fn uintptr, attr int32, v int32) cuResult
	GetErrorString         func(r cuResult, s **byte) cuResult
	MemGetInfo             func(free, total *uint64) cuResult
}

type nvrtcLib struct {
	CreateProgram     func(prog *uintptr, src, name *byte, nh int32, headers, includes **byte) int32
	CompileProgram    func(prog uintptr, nopt int32, opts **byte) int32
	GetPTXSize        func(prog uintptr, n *uint64) int32
	GetPTX            func(prog uintptr, ptx *byte) int32
	GetCUBINSize      func(prog uintptr, n *uint64) int32
	GetCUBIN          func(prog uintptr, cubin *byte) int32
	GetProgramLogSize func(prog uintptr, n *uint64) int32
	GetProgramLog     func(prog uintptr, log *byte) int32
	DestroyProgram    func(prog *uintptr) int32
	Version           func(major, minor *int32) int32
}

type cublasLib struct {
	Create    func(h *uintptr) int32
	SetStream func(h uintptr, stream uintptr) int32
	Sgemm     func(h uintptr, ta, tb int32, m, n, k int32, alpha *float32, a uint64, lda int32, b uint64, ldb int32, beta *float32, c uint64, ldc int32) int32
	// GemmEx runs mixed-type GEMMs: bf16 inputs, f32 output and accumulation.
	GemmEx func(h uintptr, ta, tb int32, m, n, k int32, alpha unsafe.Pointer, a uint64, atype, lda int32, b uint64, btype, ldb int32, beta unsafe.Pointer, c uint64, ctype, ldc int32, compute, algo int32) int32
}

func open(names []string) (uintptr, string, error) {
	var errs []string
	for _, n := range names {
		h, err := purego.Dlopen(n, purego.RTLD_NOW|purego.RTLD_GLOBAL)
		if err == nil {
			return h, n, nil
		}
		errs = append(errs, err.Error())
	}
	return 0, "", fmt.Errorf("none of %s could be loaded (%s)", strings.Join(names, ", "), strings.Join(errs, "; "))
}

// bind registers every field of fns (a pointer to a struct of funcs) as
// symbol prefix+FieldName(+suffix where the API versioned it).
func bind(lib uintptr, fns any, symbol func(field string) string) error {
	v := reflectFuncs(fns)
	for _, f := range v {
		sym := symbol(f.name)
		addr, err := purego.Dlsym(lib, sym)
		if err != nil {
			return fmt.Errorf("symbol %s: %w", sym, err)
		}
		purego.RegisterFunc(f.ptr, addr)
	}
	return nil
}

var (
	loadOnce sync.Once
	libs     struct {
		cu        driver
		nvrtc     nvrtcLib
		blas      cublasLib
		names     []string
		nvrtcName string
		loadErr   error
	}
)

// driverVersioned are driver symbols whose current version has a _v2 suffix.
var driverVersioned = map[string]bool{"MemAlloc": true, "MemFree": true, "MemsetD8": true, "MemcpyHtoD": true,
	"MemcpyDtoH": true, "MemcpyDtoD": true, "MemGetInfo": true, "MemAllocHost": true,
	"MemcpyHtoDAsync": true, "MemcpyDtoHAsync": true, "MemcpyDtoDAsync": true}

func loadLibs() error {
	loadOnce.Do(func() {
		cu, n1, err := open([]string{"libcuda.so.1", "libcuda.so"})
		if err != nil {
			libs.loadErr = fmt.Errorf("%w: %v", ErrNoDevice, err)
			return
		}
		if err := bind(cu, &libs.cu, func(f string) string {
			if driverVersioned[f] {
				return "cu" + f + "_v2"
			}
			return "cu" + f
		}); err != nil {
			libs.loadErr = err
			return
		}
		if err := loadNVRTC(); err != nil {
			libs.loadErr = err
			return
		}
		bl, n3, err := open([]string{"libcublas.so.13", "libcublas.so.12", "libcublas.so.11", "libcublas.so"})
		if err != nil {
			libs.loadErr = err
			return
		}
		if err := bind(bl, &libs.blas, func(f string) string {
			if f == "GemmEx" {
				return "cublasGemmEx"
			}
			return "cublas" + f + "_v2"
		}); err != nil {
			libs.loadErr = err
			return
		}
		libs.names = []string{n1, libs.nvrtcName, n3}
	})
	return libs.loadErr
}

func (r cuResult) err(op string) error {
	if r == 0 {
		return nil
	}
	var s *byte
	msg := fmt.Sprintf("CUDA error %d", int(r))
	if libs.cu.GetErrorString != nil && libs.cu.GetErrorString(r, &s) == 0 && s != nil {
		msg = goString(s)
	}
	return fmt.Errorf("%s: %s", op, msg)
}

func goString(p *byte) string {
	if p == nil {
		return ""
	}
	var b []byte
	for ptr := unsafe.Pointer(p); *(*byte)(ptr) != 0; ptr = unsafe.Add(ptr, 1) {
		b = append(b, *(*byte)(ptr))
	}
	return string(b)
}

func cstr(s string) *byte {
	b := append([]byte(s), 0)
	return &b[0]
}

// loadNVRTC opens only NVRTC: enough to compile kernels without a GPU.
func loadNVRTC() error {
	if libs.nvrtc.CompileProgram != nil {
		return nil
	}
	nv, name, err := open([]string{"libnvrtc.so.13", "libnvrtc.so.12", "libnvrtc.so.11.2", "libnvrtc.so"})
	if err != nil {
		return err
	}
	libs.nvrtcName = name
	return bind(nv, &libs.nvrtc, func(f string) string { return "nvrtc" + f })
}
