"""The PyTorch anchor of BenchmarkSimCSEStep: one unsupervised SimCSE step
as Gao et al.'s code runs it (transformers' BertModel in training mode,
hidden and attention dropout 0.1, each of 64 sentences encoded twice in
one batch, mean pooling here as in the Go benchmark, cosine similarity over
temperature 0.05, cross-entropy, AdamW) on the BERT-base shape with random
weights, float32 (and under bf16 autocast), 64 sentences of 32 tokens: the
same work as `BenchmarkSimCSEStep/cuda/bert-base-shape` (and cuda-bf16).

Usage: python3 simcse_anchor.py [STEPS]   (prints ms/step and sentences/s)
"""
import sys
import time

import torch
import torch.nn.functional as F
from transformers import BertConfig, BertModel

steps = int(sys.argv[1]) if len(sys.argv) > 1 else 10
torch.manual_seed(0)
dev = "cuda"
cfg = BertConfig(vocab_size=30005, hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072,
                 max_position_embeddings=512, hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1)
for attn, amp in (("eager", False), ("sdpa", False), ("sdpa", True)):
    try:
        cfg._attn_implementation = attn
        model = BertModel(cfg, add_pooling_layer=False).to(dev).train()
    except Exception as e:  # a transformers without that attention for BERT
        print(f"{attn} attention: {e}")
        continue
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5, weight_decay=0.01)
    n, t = 64, 32
    ids = torch.randint(5, 30005, (n, t), device=dev).repeat(2, 1)
    mask = torch.ones_like(ids)

    def step():
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=amp):
            h = model(input_ids=ids, attention_mask=mask).last_hidden_state.float()
        z = F.normalize((h * mask[..., None]).sum(1) / mask.sum(1, keepdim=True), dim=-1)
        logits = z[:n] @ z[n:].T / 0.05
        loss = F.cross_entropy(logits, torch.arange(n, device=dev))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)

    for _ in range(3):
        step()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(steps):
        step()
    torch.cuda.synchronize()
    sec = (time.perf_counter() - t0) / steps
    kind = "bf16 autocast" if amp else "f32"
    print(f"pytorch simcse bert-base-shape ({attn} attention, {kind}, torch {torch.__version__}): {sec * 1e3:.1f} ms/step, {n / sec:.0f} sentences/s")
