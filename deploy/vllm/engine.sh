#!/usr/bin/env bash
# A vLLM rollout engine for agemem-train's rl.engines: the base model the
# trainer's rl.init names, LoRA on (adapters up to the trainer's lora.r),
# adapters loaded at run time through POST /v1/load_lora_adapter, which
# vLLM serves only with VLLM_ALLOW_RUNTIME_LORA_UPDATING set. vLLM loads
# adapters from paths, so the trainer must publish to a directory this
# host reads (rl.adapter_dir on a shared filesystem). Token ids come back
# with return_token_ids (vLLM 0.10.2 and later; older versions through
# return_tokens_as_token_ids, which the trainer also asks for).
# Start one per GPU: PORT=8001 CUDA_VISIBLE_DEVICES=1 deploy/vllm/engine.sh
set -euo pipefail
export VLLM_ALLOW_RUNTIME_LORA_UPDATING=True
exec vllm serve "${MODEL:-Qwen/Qwen2.5-7B-Instruct}" \
	--host 0.0.0.0 \
	--port "${PORT:-8000}" \
	--served-model-name agemem \
	--enable-lora \
	--max-lora-rank "${MAX_LORA_RANK:-64}" \
	--max-loras 2 \
	--enable-prefix-caching \
	--gpu-memory-utilization 0.90 \
	--max-model-len 10240 \
	--seed 0
