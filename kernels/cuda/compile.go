package cuda

import (
	"crypto/sha256"
	"embed"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"time"
)

// The kernels' CUDA C, one file per op family (each forward beside its
// backward), compiled together: common.cuh first, then the .cu files in
// name order.
//
//go:embed common.cuh *.cu
var sourceFiles embed.FS

var source = func() string {
	var b strings.Builder
	head, _ := sourceFiles.ReadFile("common.cuh")
	b.Write(head)
	entries, _ := sourceFiles.ReadDir(".")
	var names []string
	for _, e := range entries {
		if strings.HasSuffix(e.Name(), ".cu") {
			names = append(names, e.Name())
		}
	}
	sort.Strings(names)
	for _, n := range names {
		src, _ := sourceFiles.ReadFile(n)
		b.WriteString("\n// ---- " + n + "\n")
		b.Write(src)
	}
	return b.String()
}()

var kernelDecl = regexp.MustCompile(`extern "C" __global__ void (?:__launch_bounds__\([^)]*\) )?(\w+)\(`)

// kernelNames lists the kernels a source defines, as launch names them.
func kernelNames(src string) []string {
	var out []string
	for _, m := range kernelDecl.FindAllStringSubmatch(src, -1) {
		out = append(out, m[1])
	}
	return out
}

// Compile compiles the embedded kernels for arch (e.g. "90") and returns the
// PTX; CI uses it without a GPU to check that every kernel compiles.
func Compile(arch string) ([]byte, error) {
	if err := loadNVRTC(); err != nil {
		return nil, err
	}
	return compileSource(arch)
}

func compileSource(arch string) ([]byte, error) {
	ptx, _, err := nvrtcCompile("compute_"+arch, false)
	return ptx, err
}

// Assemble compiles the kernels to machine code for sm_arch (NVRTC runs
// ptxas, which checks the inline PTX that compiling to PTX only copies)
// and returns ptxas's report of each kernel's registers and spills. It
// needs only libnvrtc, not a GPU.
func Assemble(arch string) (report string, err error) {
	if err := loadNVRTC(); err != nil {
		return "", err
	}
	_, log, err := nvrtcCompile("sm_"+arch, true)
	return log, err
}

// nvrtcCompile compiles source for target (compute_XX: PTX; sm_XX with
// cubin: machine code, ptxas verbose) and returns it with the log.
func nvrtcCompile(target string, cubin bool) ([]byte, string, error) {
	nv := &libs.nvrtc
	src := source
	if cubin {
		// NVRTC 13 caches what ptxas made (keyed by the PTX, as the
		// driver's JIT cache), and a hit returns the cubin without ptxas's
		// report. CUDA_CACHE_DISABLE would turn that off, but a static Go
		// binary's os.Setenv never reaches the C library's getenv, so the
		// PTX is made unique instead: a variable no kernel reads.
		src += fmt.Sprintf("\n__device__ int agemem_assemble_nonce = %d;\n", time.Now().UnixNano()&0x7fffffff)
	}
	var prog uintptr
	if r := nv.CreateProgram(&prog, cstr(src), cstr("agemem.cu"), 0, nil, nil); r != 0 {
		return nil, "", fmt.Errorf("nvrtcCreateProgram: %d", r)
	}
	defer nv.DestroyProgram(&prog)
	opts := []*byte{cstr("--gpu-architecture=" + target), cstr("--std=c++14")}
	if cubin {
		opts = append(opts, cstr("--ptxas-options=-v"))
	}
	r := nv.CompileProgram(prog, int32(len(opts)), &opts[0])
	var logSize uint64
	nv.GetProgramLogSize(prog, &logSize)
	log := ""
	if logSize > 1 {
		buf := make([]byte, logSize)
		nv.GetProgramLog(prog, &buf[0])
		log = string(buf[:logSize-1])
	}
	if r != 0 {
		return nil, log, fmt.Errorf("NVRTC could not compile the kernels for %s:\n%s", target, log)
	}
	var n uint64
	get, getSize := nv.GetPTX, nv.GetPTXSize
	if cubin {
		get, getSize = nv.GetCUBIN, nv.GetCUBINSize
	}
	getSize(prog, &n)
	out := make([]byte, n)
	get(prog, &out[0])
	return out, log, nil
}

func (b *Backend) compile() ([]byte, error) {
	var maj, min int32
	libs.nvrtc.Version(&maj, &min)
	h := sha256.Sum256([]byte(fmt.Sprintf("%s|sm_%s|nvrtc %d.%d", source, b.arch, maj, min)))
	dir, err := os.UserCacheDir()
	if err == nil {
		dir = filepath.Join(dir, "agemem", "cuda")
	}
	path := filepath.Join(dir, hex.EncodeToString(h[:8])+".ptx")
	if ptx, err := os.ReadFile(path); err == nil && len(ptx) > 0 {
		return ptx, nil
	}
	ptx, err := compileSource(b.arch)
	if err != nil {
		return nil, err
	}
	if dir != "" && os.MkdirAll(dir, 0o755) == nil {
		os.WriteFile(path, ptx, 0o644)
	}
	return ptx, nil
}
