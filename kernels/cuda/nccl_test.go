package cuda

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/ebitengine/purego"
)

// TestNCCLUniqueIDCrossesByValue: ncclCommInitRank takes the 128-byte
// ncclUniqueId by value. The binding's Go signature (commInitRank) is
// called on a C function of the same signature, built here, which must
// receive the id's bytes, nranks and rank intact: what the multi-process
// NCCL path needs of purego, checked without a GPU.
func TestNCCLUniqueIDCrossesByValue(t *testing.T) {
	cxx, err := exec.LookPath("g++")
	if err != nil {
		if os.Getenv("AGEMEM_REQUIRE_CXX") != "" {
			t.Fatal("a C++ compiler is required here (AGEMEM_REQUIRE_CXX) but g++ is not on the PATH")
		}
		t.Skip("no C compiler (g++) to build the ABI check")
	}
	lib := filepath.Join(t.TempDir(), "nccl_abi.so")
	if out, err := exec.Command(cxx, "-x", "c", "-shared", "-fPIC", "-O1", "-o", lib, "testdata/nccl_abi.c").CombinedOutput(); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	h, err := purego.Dlopen(lib, purego.RTLD_NOW)
	if err != nil {
		t.Fatal(err)
	}
	var call commInitRank
	purego.RegisterLibFunc(&call, h, "check_init_rank")
	var id ncclUniqueID
	var want uint32
	for i := range id.Internal {
		id.Internal[i] = byte(i*7 + 3)
		want = want*31 + uint32(id.Internal[i])
	}
	var comm uintptr
	got := call(&comm, 12, id, 5)
	if uint32(got) != want&0x7fffffff {
		t.Fatalf("the C side summed the id to %#x, want %#x: the struct did not cross by value", got, want&0x7fffffff)
	}
	if comm != 12<<32|5 {
		t.Fatalf("nranks and rank after the id arrived as %#x, want %#x", comm, 12<<32|5)
	}
}
