"""Compare agemem's Qwen logits with Hugging Face transformers.

Usage: python3 hf_compare.py DIR   (DIR written by TestExportForTransformers)
Each model directory holds config.json, model.safetensors and our logits for
the same tokens. transformers loads the directory as a user would
(AutoModelForCausalLM, float32) and the largest differences are printed.
"""
import json
import os
import sys

import torch
import transformers
from transformers import AutoModelForCausalLM

root = sys.argv[1]
print("transformers", transformers.__version__, "torch", torch.__version__)
worst = 0.0
for name in sorted(os.listdir(root)):
    d = os.path.join(root, name)
    ours = json.load(open(os.path.join(d, "agemem_logits.json")))
    model = AutoModelForCausalLM.from_pretrained(d, torch_dtype=torch.float32, attn_implementation="eager").eval()
    ids = torch.tensor([ours["tokens"]])
    with torch.no_grad():
        ref = model(ids).logits[0].double()
    got = torch.tensor(ours["logits"], dtype=torch.float64).view(len(ours["tokens"]), ours["vocab"])
    abs_err = (got - ref).abs().max().item()
    rel = ((got - ref).abs().max(dim=1).values / ref.abs().max(dim=1).values).max().item()
    argmax = (got.argmax(-1) == ref.argmax(-1)).float().mean().item()
    worst = max(worst, rel)
    print(f"{name:22s} {type(model).__name__:18s} max|diff| {abs_err:.3e}  max rel {rel:.3e}  argmax agree {argmax:.3f}")
print(f"worst relative error {worst:.3e}")
sys.exit(0 if worst < 1e-4 else 1)
