"""PyTorch anchors for BenchmarkCUDAPaperStep and BenchmarkCUDAPaperDecode.

Usage: python3 peft_anchor.py [SHAPE,...]  (qwen2.5-7b-shape,qwen3-4b-shape)

The same shapes with random bf16 weights: one GRPO update as TRL's
GRPOTrainer runs it with PEFT (LoRA r 16, alpha 32, dropout 0.05 on all
seven projections, adapters in float32), gradient checkpointing and SDPA
attention, K rollouts of CTX + RESP tokens one micro-batch each (logits only
for the response, as logits_to_keep does), then clipped AdamW; and greedy
`generate` of 64 tokens after a 512-token prompt for 1 and 8 sequences.
Prints tokens/s and the peak memory (allocated and reserved).
$AGEMEM_PAPER_K, $AGEMEM_PAPER_CTX, $AGEMEM_PAPER_RESP as the benchmark.
"""
import os
import sys
import time

import torch
from peft import LoraConfig, get_peft_model
from transformers import AutoModelForCausalLM, Qwen2Config, Qwen3Config

SHAPES = {
    "qwen2.5-7b-shape": lambda: Qwen2Config(hidden_size=3584, num_hidden_layers=28, num_attention_heads=28,
                                            num_key_value_heads=4, intermediate_size=18944, vocab_size=152064,
                                            tie_word_embeddings=False, rope_theta=1e6, rms_norm_eps=1e-6,
                                            max_position_embeddings=32768),
    "qwen3-4b-shape": lambda: Qwen3Config(hidden_size=2560, num_hidden_layers=36, num_attention_heads=32,
                                          num_key_value_heads=8, head_dim=128, intermediate_size=9728,
                                          vocab_size=151936, tie_word_embeddings=True, rope_theta=1e6,
                                          rms_norm_eps=1e-6, max_position_embeddings=40960),
}
K = int(os.environ.get("AGEMEM_PAPER_K", 8))
CTX = int(os.environ.get("AGEMEM_PAPER_CTX", 8192))
RESP = int(os.environ.get("AGEMEM_PAPER_RESP", 2048))
GIB = 2**30


def build(shape):
    cfg = SHAPES[shape]()
    with torch.device("cuda"):
        model = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16, attn_implementation="sdpa")
    return model


def rollout(i, vocab):
    ids = torch.tensor([[(j * 7919 + i * 104729) % vocab for j in range(CTX + RESP)]], device="cuda")
    coef = torch.full((RESP,), (1 - 2 * (i % 2)) / (K * RESP), device="cuda")
    return ids, coef


def micro_step(model, i, vocab):
    ids, coef = rollout(i, vocab)
    logits = model(input_ids=ids, logits_to_keep=RESP + 1).logits[0, :-1].float()
    logp = torch.log_softmax(logits, dim=-1).gather(1, ids[0, CTX:, None])[:, 0]
    (logp * coef).sum().backward()


def train(shape):
    model = build(shape)
    vocab = model.config.vocab_size
    model.config.use_cache = False
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model = get_peft_model(model, LoraConfig(r=16, lora_alpha=32, lora_dropout=0.05, task_type="CAUSAL_LM",
                                             target_modules=["q_proj", "k_proj", "v_proj", "o_proj",
                                                             "gate_proj", "up_proj", "down_proj"]))
    model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=1e-5, weight_decay=0.01, fused=True)
    micro_step(model, 0, vocab)  # warm-up
    opt.zero_grad(set_to_none=False)
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    t = time.perf_counter()
    for i in range(K):
        micro_step(model, i, vocab)
    torch.nn.utils.clip_grad_norm_(params, 1.0)
    opt.step()
    opt.zero_grad(set_to_none=False)
    torch.cuda.synchronize()
    dt = time.perf_counter() - t
    n = sum(p.numel() for p in params)
    print(f"torch+peft {shape}: GRPO update K {K} x ({CTX}+{RESP}) tokens, LoRA {n} params: "
          f"{K * (CTX + RESP) / dt:.0f} tok/s, {dt:.1f} s/step, peak allocated {torch.cuda.max_memory_allocated() / GIB:.2f} GiB, "
          f"reserved {torch.cuda.max_memory_reserved() / GIB:.2f} GiB", flush=True)
    del model, opt, params
    torch.cuda.empty_cache()


@torch.no_grad()
def decode(shape):
    model = build(shape).eval()
    vocab = model.config.vocab_size
    for batch in (1, 8):
        ids = torch.tensor([[(i * 7919 + s * 13) % vocab for i in range(512)] for s in range(batch)], device="cuda")
        model.generate(ids, max_new_tokens=8, min_new_tokens=8, do_sample=False)
        torch.cuda.synchronize()
        t = time.perf_counter()
        model.generate(ids, max_new_tokens=64, min_new_tokens=64, do_sample=False)
        torch.cuda.synchronize()
        dt = time.perf_counter() - t
        # generate's time includes the prefill: subtract a measured one.
        t = time.perf_counter()
        model(ids)
        torch.cuda.synchronize()
        pre = time.perf_counter() - t
        print(f"transformers generate {shape} batch {batch}: {batch * 64 / (dt - pre):.0f} tok/s "
              f"(prefill {pre * 1e3:.0f} ms subtracted)", flush=True)
    del model
    torch.cuda.empty_cache()


if __name__ == "__main__":
    print(f"torch {torch.__version__}", flush=True)
    for shape in (sys.argv[1] if len(sys.argv) > 1 else ",".join(SHAPES)).split(","):
        what = os.environ.get("AGEMEM_ANCHOR", "train,decode")
        if "train" in what:
            train(shape)
        if "decode" in what:
            decode(shape)
