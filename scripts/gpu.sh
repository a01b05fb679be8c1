#!/bin/bash
# GPU checks from the binaries `make gpu-bundle` puts in .gpu/, for a GPU
# machine with or without Go (make test-gpu runs `tests` here):
#
#   scripts/gpu.sh tests    the GPU tests of kernels/cuda, model/qwen,
#                           model/bert, model/train and model/simcse, then
#                           their benchmarks (tests quick: the attention and
#                           elementwise kernels and the GPU training steps)
#   scripts/gpu.sh paper    the paper's GRPO step (7B and 4B shapes; its
#                           warm-up rollout's device time by kernel) beside
#                           PyTorch + PEFT (peft_anchor.py), then over a Q8_0
#                           base; decode beside the bandwidth bound and generate
#                           ($GPU_PAPER_SKIP: parts to leave out, e.g. decode,q8)
#   scripts/gpu.sh simcse   SimCSE's training step (BERT-base shape) on the
#                           GPU, its device time by kernel, beside PyTorch +
#                           transformers (simcse_anchor.py)
#   scripts/gpu.sh recipe   the GPU recipe (make demo-gpu with .gpu/agemem-train);
#                           recipe base, then recipe rl: its halves
#
# Each test binary runs in its package's folder (testdata) under a time
# limit ($GPU_LIMIT seconds each, default 300; killed with a goroutine dump),
# and everything is logged to $OUT (or .gpu/out). AGEMEM_PAPER_K (default 8),
# _CTX, _RESP and _SHAPES size the paper's step; GPURL passes settings to
# the recipe's GRPO (e.g. "--set rl.steps=10").
set -u
root=$(cd "$(dirname "$0")/.." && pwd)
out=${OUT:-$root/.gpu/out}
mkdir -p "$out"
# NVRTC, cuBLAS and NCCL where CUDA or PyTorch put them.
export LD_LIBRARY_PATH=$(find /usr/local /opt /usr/lib \( -name 'libnvrtc.so*' -o -name 'libcublas.so*' -o -name 'libnccl.so*' \) 2>/dev/null |
	xargs -r -n1 dirname | sort -u | tr '\n' :)${LD_LIBRARY_PATH:-}
export PYTHONUNBUFFERED=1 GOTRACEBACK=all
# make gpu-bundle gzips the binaries to fit a device call's carry; unpack
# each where its binary is missing or older.
for z in "$root"/.gpu/*.gz; do
	[ -e "$z" ] || continue
	b=${z%.gz}
	if [ ! -x "$b" ] || [ "$z" -nt "$b" ]; then
		gzip -dc "$z" >"$b.tmp" && chmod +x "$b.tmp" && mv "$b.tmp" "$b" || exit 1
	fi
done
limit=${GPU_LIMIT:-300}

# run PKG ARGS...: PKG's test binary with ARGS, in PKG's folder.
run() {
	local pkg=$1 start=$SECONDS
	shift
	(cd "$root/$pkg" && timeout -s QUIT "$limit" "$root/.gpu/$(basename "$pkg").test" -test.timeout "$((limit - 5))s" "$@")
	echo "== exit $? after $((SECONDS - start)) s: $pkg $*"
}

tests() {
	local pat='CUDA|Ops|Kernels|Trainer|Allocator|TopK|GPU|MMA|Profile|Decode|Paged'
	if [ "${1:-}" = quick ]; then
		# The tensor-core attention, the elementwise kernels and the
		# replica's GPU steps: about a minute.
		run kernels/cuda -test.count=1 -test.v -test.run 'MMA|Elementwise|Kernels|Ops'
		run model/train -test.count=1 -test.v -test.run 'GPU'
		return
	fi
	run kernels/cuda -test.count=1 -test.v -test.run "$pat"
	run model/qwen -test.count=1 -test.v -test.run "$pat"
	run model/bert -test.count=1 -test.v -test.run "$pat"
	run model/train -test.count=1 -test.v -test.run 'CUDA|GPU'
	run model/simcse -test.count=1 -test.v -test.run 'GPU'
	run model/qwen -test.run '^$' -test.bench CUDA -test.benchtime 3x
	run model/train -test.run '^$' -test.bench CUDATrain -test.benchtime 3x
	run kernels/cuda -test.run '^$' -test.bench 'GPU|TopK' -test.benchtime 20x
	run model/bert -test.run '^$' -test.bench 'Encoder/cuda' -test.benchtime 5x
}

# paper: the step, its anchor, decode, the step over Q8_0; parts named in
# $GPU_PAPER_SKIP (comma-separated: step, anchor, decode, q8) are left out,
# so a short lease can run what it needs.
paper() {
	want() { [[ ",${GPU_PAPER_SKIP:-}," != *",$1,"* ]]; }
	if want step; then
		AGEMEM_CUDA_PROFILE=1 run model/train -test.run '^$' -test.bench CUDAPaperStep -test.benchtime 1x -test.v
	fi
	if want anchor; then
		(cd "$root/model/train" && timeout "$limit" python3 testdata/peft_anchor.py "${AGEMEM_PAPER_SHAPES:-qwen2.5-7b-shape,qwen3-4b-shape}")
	fi
	if want decode; then
		run model/qwen -test.run '^$' -test.bench CUDAPaperDecode -test.benchtime 2x
	fi
	if want q8; then
		AGEMEM_PAPER_BASE=q8_0 run model/train -test.run '^$' -test.bench CUDAPaperStep -test.benchtime 1x -test.v
	fi
}

simcse() {
	AGEMEM_CUDA_PROFILE=1 run model/simcse -test.run '^$' -test.bench 'SimCSEStep/cuda' -test.benchtime 10x -test.v
	(cd "$root/model/simcse" && timeout "$limit" python3 testdata/simcse_anchor.py 10)
}

# recipe [base|rl]: make demo-gpu, or one of its halves (base-gpu: data to
# SFT; rl-gpu: GRPO and eval, on the runs/gpu the first left).
recipe() {
	local target=demo-gpu
	case ${1:-} in base | rl) target=$1-gpu ;; esac
	(cd "$root" && make $target BIN=.gpu GO=true GPURL="${GPURL:-}")
	cp "$root"/runs/gpu/eval.json "$root"/runs/gpu/eval.png "$out"/ 2>/dev/null
}

case ${1:-} in
tests | paper | simcse | recipe) "$@" 2>&1 | tee "$out/$1${2:+-$2}.log" ;;
*)
	echo "usage: scripts/gpu.sh tests [quick]|paper|simcse|recipe [base|rl]" >&2
	exit 2
	;;
esac
