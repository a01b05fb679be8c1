#!/bin/bash
# GPU checks from the binaries `make gpu-bundle` puts in .gpu/, for a GPU
# machine with or without Go (make test-gpu runs `tests` here):
#
#   scripts/gpu.sh tests    the GPU tests of kernels/cuda, model/qwen,
#                           model/bert, model/train and model/simcse, then
#                           their benchmarks
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
#   scripts/gpu.sh sweep    the recipe's copy stage under a few learning
#                           rates, warm-ups and texts, $GPU_SWEEP_STEPS steps
#                           each (default 1000; about 75 s each on an H100):
#                           which one starts the 26M policy copying
#                           ($GPU_SWEEP_SET: more --set flags for every command)
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

# sweep: configs/gpu.yaml's copy pretraining from one random init under
# each variant; the held-out copy loss of each is the line to read. Sweep 1
# is the control: a 4-layer, 256-wide Qwen2 (3.7M parameters) whose run the
# CPU measured on 2026-11-27 from the same init, data and settings (lr 1e-3
# on fresh sentences: held-out copy loss 2.00, 1.45, 0.58, 0.18 at steps
# 250, 500, 750, 1,000; README, "The GPU recipe"): a GPU run far from it is
# a fault of the GPU path, not of the recipe. The others are the 26M
# policy on fresh sentences (the config's since that CPU run) at lr 1e-3,
# 5e-4 and 2.5e-4 (muP carries the 256-wide model's 1e-3 to 5e-4 at width
# 512), then on the 1,000-task file at 1e-3, the setting that stalled at
# 1.0-1.3 on three H100 runs (the model learnt the file's sentences).
sweep() {
	local B=$root/.gpu/agemem-train C="--config configs/gpu.yaml ${GPU_SWEEP_SET:-}" steps=${GPU_SWEEP_STEPS:-1000} i=0
	local w256="--set model.init.hidden_size=256 --set model.init.num_hidden_layers=4 --set model.init.num_attention_heads=4 --set model.init.num_key_value_heads=2 --set model.init.intermediate_size=768"
	cd "$root" || return
	# shellcheck disable=SC2086 # $w256 is several flags
	$B data synth --n 1000 --seed 1 --out data/synth.json &&
		$B tokenizer train $C --data data/synth.json --vocab-size 2048 --pretokenizer words --out runs/gpu/tok &&
		$B init-model $C --tokenizer runs/gpu/tok/tokenizer.json --dtype f32 --out runs/gpu/init &&
		$B init-model $C $w256 --tokenizer runs/gpu/tok/tokenizer.json --dtype f32 --out runs/gpu/init256 || return
	for v in "--set pretrain.init=runs/gpu/init256 --set pretrain.lr=1e-3 --set pretrain.text=synth" \
		"--set pretrain.lr=1e-3 --set pretrain.text=synth" \
		"--set pretrain.lr=5e-4 --set pretrain.warmup_steps=100 --set pretrain.text=synth" \
		"--set pretrain.lr=2.5e-4 --set pretrain.warmup_steps=100 --set pretrain.text=synth" \
		"--set pretrain.lr=1e-3 --set pretrain.text=data/synth.json"; do
		i=$((i + 1))
		echo "== sweep $i: $v"
		# shellcheck disable=SC2086 # $v is several flags
		$B pretrain $C --set pretrain.steps="$steps" --set pretrain.eval_every=250 $v --set pretrain.out=runs/gpu/sweep$i |
			grep -E "held-out|step ($steps|250|500|750)/"
		grep eval_loss runs/gpu/sweep$i/metrics.jsonl
	done
}

case ${1:-} in
tests | paper | simcse | recipe | sweep) "$@" 2>&1 | tee "$out/$1${2:+-$2}.log" ;;
*)
	echo "usage: scripts/gpu.sh tests|paper|simcse|recipe [base|rl]|sweep" >&2
	exit 2
	;;
esac
