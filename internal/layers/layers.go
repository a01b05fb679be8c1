// Package layers states the order the toolkit's packages build on each
// other, which its test holds every import to: the tree draws the
// architecture only while the arrows point one way.
package layers

import "strings"

// Order lists the layers from the bottom; a package may import packages
// of lower layers, and packages of its own top-level folder in its own
// layer (model/sft on model/train). Paths are relative to the module.
var Order = [][]string{
	{"internal"},                  // small helpers
	{"kernels"},                   // compute backends
	{"embed"},                     // the embedder interface, feature hashing, the vector index
	{"model", "internal/testkit"}, // tensors, Qwen/BERT, tokenizers, templates, the engine, trainers
	{"llm", "internal/qwentest"},  // the chat-model interface; test models above the model layer
	{"llm/native", "llm/ollama", "llm/openai"}, // its backends
	{"memtools"}, // AgeMem's runtime: stores, context, the six tools
	{"agent"},    // the function-calling loop, MCP, tool catalogues
	{"bench"},    // benchmarks: loaders, generators, scorers
	{"env"},      // AgeMem's environments and its pretraining data
	{"rl"},       // rollouts, reward, GRPO
	{"papers"},   // MemTool, MemToolAgent, FitText, TA-Mem
	{"console"},  // the web console's pages and charts (serve and agemem-train host it)
	{"serve"},    // the HTTP server
	{"setup"},    // configuration and the composition root
	{"eval"},     // evaluation tables
	{"cmd"},      // the binaries: flag parsing and calls
}

// Of is the layer of a module-relative package path (-1: none listed),
// and the folder it is named under: the longest prefix listed.
func Of(pkg string) (layer int, folder string) {
	layer = -1
	for i, names := range Order {
		for _, n := range names {
			if (pkg == n || strings.HasPrefix(pkg, n+"/")) && len(n) > len(folder) {
				layer, folder = i, n
			}
		}
	}
	return layer, folder
}

// Allowed reports whether package from may import package to.
func Allowed(from, to string) bool {
	lf, ff := Of(from)
	lt, ft := Of(to)
	if lf < 0 || lt < 0 {
		return false
	}
	top := func(p string) string { return strings.SplitN(p, "/", 2)[0] }
	return lt < lf || (lt == lf && top(ff) == top(ft))
}
