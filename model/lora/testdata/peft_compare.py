"""Compare agemem's LoRA logits with PEFT applying the same adapter.

Usage: python3 peft_compare.py DIR   (DIR written by TestExportForPEFT in
model/lora and TestExportTrainedAdapterForPEFT in model/train)
PEFT loads the base with transformers and the adapter with
PeftModel.from_pretrained (unmerged: it adds scale·B·A x at run time); our
numbers come from the merged checkpoint run by the Go engine (tiny-*), or
from the engine with a trained adapter applied unmerged (trained-*).
"""
import json
import os
import sys

import peft
import torch
from peft import PeftModel
from transformers import AutoModelForCausalLM

root = sys.argv[1]
print("peft", peft.__version__)
worst = 0.0
for name in sorted(os.listdir(root)):
    d = os.path.join(root, name)
    ours = json.load(open(os.path.join(d, "agemem_logits.json")))
    base = AutoModelForCausalLM.from_pretrained(os.path.join(d, "base"), dtype=torch.float32, attn_implementation="eager")
    with torch.no_grad():
        ids = torch.tensor([ours["tokens"]])
        plain = base(ids).logits[0].double()
        model = PeftModel.from_pretrained(base, os.path.join(d, "adapter")).eval()
        ref = model(ids).logits[0].double()
    got = torch.tensor(ours["logits"], dtype=torch.float64).view(len(ours["tokens"]), ours["vocab"])
    rel = ((got - ref).abs().max(dim=1).values / ref.abs().max(dim=1).values).max().item()
    moved = (ref - plain).abs().max().item()
    worst = max(worst, rel)
    print(f"{name:12s} PEFT vs agemem: max rel {rel:.2e}; the adapter moves logits by up to {moved:.2e}")
print(f"worst relative error {worst:.3e}")
sys.exit(0 if worst < 1e-4 else 1)
