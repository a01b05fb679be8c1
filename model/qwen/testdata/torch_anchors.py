"""PyTorch anchors for the CUDA benchmarks, on the same machine and model.

Usage: python3 torch_anchors.py DIR   (DIR/q05 written by BenchmarkCUDA)
Prints torch.matmul TFLOP/s (f32 with TF32 off, and bf16) at 4096^3 and the
prefill and greedy-decode tokens/s of transformers on the same checkpoint
(bf16, SDPA attention, KV cache), torch top-k over 1M x 768 vectors, a
BertModel's sentences/s (the encoder anchor) and the training steps.
"""
import sys
import time

import torch
from transformers import AutoModelForCausalLM

torch.backends.cuda.matmul.allow_tf32 = False
for dtype, n in ((torch.float32, 4096), (torch.bfloat16, 8192)):
    a = torch.randn(n, n, device="cuda", dtype=dtype)
    b = torch.randn(n, n, device="cuda", dtype=dtype)
    a @ b
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(10):
        a @ b
    torch.cuda.synchronize()
    print(f"torch.matmul {dtype} {n}^3: {2 * n**3 * 10 / (time.perf_counter() - t) / 1e12:.1f} TFLOP/s")

# Top-10 over 1,000,000 x 768 float32 vectors, 32 queries a batch.
X = torch.nn.functional.normalize(torch.randn(1_000_000, 768, device="cuda"), dim=1)
Q = torch.nn.functional.normalize(torch.randn(32, 768, device="cuda"), dim=1)
torch.topk(Q @ X.T, 10)
torch.cuda.synchronize()
t = time.perf_counter()
for _ in range(20):
    torch.topk(Q @ X.T, 10)
torch.cuda.synchronize()
print(f"torch top-10 over 1M x 768: {32 * 20 / (time.perf_counter() - t):.0f} queries/s")

# Single-query top-10 over the same index (BenchmarkIndexSearchGPU's case,
# the query uploaded and the result read back each time).
q1 = torch.nn.functional.normalize(torch.randn(768), dim=0)
torch.topk(X @ q1.cuda(), 10).indices.cpu()
t = time.perf_counter()
for _ in range(200):
    torch.topk(X @ q1.cuda(), 10).indices.cpu()
print(f"torch single-query top-10 over 1M x 768: {200 / (time.perf_counter() - t):.0f} queries/s")

# Encoder anchor for BenchmarkEncoder/cuda: a BERT-base-shaped BertModel
# (random weights, float32, TF32 off), 64 sentences of 16 tokens, CLS
# vectors read back to the host.
from transformers import BertConfig, BertModel

for name, cfg in (("bert-base-shape", BertConfig(hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072)),
                  ("tiny-demo-shape", BertConfig(hidden_size=128, num_hidden_layers=2, num_attention_heads=4, intermediate_size=512, max_position_embeddings=128))):
    enc = BertModel(cfg).cuda().eval()
    ids = torch.randint(5, cfg.vocab_size, (64, 16), device="cuda")
    with torch.no_grad():
        enc(input_ids=ids).last_hidden_state[:, 0].cpu()
        t = time.perf_counter()
        for _ in range(20):
            enc(input_ids=ids).last_hidden_state[:, 0].cpu()
    print(f"transformers BertModel {name}, 64 x 16 tokens: {64 * 20 / (time.perf_counter() - t):.0f} sentences/s")
del X, Q

model = AutoModelForCausalLM.from_pretrained(sys.argv[1] + "/q05", dtype=torch.bfloat16).cuda().eval()
ids = torch.tensor([[(i * 7919) % model.config.vocab_size for i in range(128)]], device="cuda")
with torch.no_grad():
    model(ids)
    torch.cuda.synchronize()
    t = time.perf_counter()
    model(ids)
    torch.cuda.synchronize()
    print(f"transformers prefill: {128 / (time.perf_counter() - t):.0f} tok/s")
    model.generate(ids, max_new_tokens=8, do_sample=False, min_new_tokens=8)
    torch.cuda.synchronize()
    t = time.perf_counter()
    out = model.generate(ids, max_new_tokens=64, do_sample=False, min_new_tokens=64)
    torch.cuda.synchronize()
    n_new = out.shape[1] - ids.shape[1]
    print(f"transformers generate (greedy, KV cache): {n_new / (time.perf_counter() - t):.0f} tok/s")

# Training anchor for BenchmarkCUDATrain: one full fine-tuning step in
# float32 (TF32 off, fused AdamW, gradient clipping), 2 x 512 tokens.
del model
torch.cuda.empty_cache()
model = AutoModelForCausalLM.from_pretrained(sys.argv[1] + "/q05", dtype=torch.float32).cuda().train()
opt = torch.optim.AdamW(model.parameters(), lr=1e-5, weight_decay=0.01, fused=True)
ids = torch.tensor([[(i * 7919 + s * 13) % model.config.vocab_size for i in range(512)] for s in range(2)], device="cuda")


def train_step(dtype):
    with torch.autocast("cuda", dtype=torch.bfloat16, enabled=dtype == "bf16"):
        loss = model(ids, labels=ids).loss
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    opt.zero_grad(set_to_none=False)


# f32, then bf16 autocast (tensor-core matmuls, f32 master weights).
for dtype, label in (("f32", "f32"), ("bf16", "bf16-autocast")):
    train_step(dtype)
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    t = time.perf_counter()
    for _ in range(5):
        train_step(dtype)
    torch.cuda.synchronize()
    print(f"torch {label} training step (2 x 512 tokens, AdamW): {1024 * 5 / (time.perf_counter() - t):.0f} tok/s, "
          f"peak memory {torch.cuda.max_memory_allocated() / 2**30:.1f} GiB")
