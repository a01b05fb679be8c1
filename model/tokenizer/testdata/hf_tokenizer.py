"""Compare agemem's Qwen3 token ids with Hugging Face's tokenizer.

Usage: python3 hf_tokenizer.py DIR   (DIR written by TestExportForHFTokenizers)
"""
import json
import sys

from transformers import AutoTokenizer

d = sys.argv[1]
tok = AutoTokenizer.from_pretrained(d)
data = json.load(open(d + "/agemem_ids.json"))
bad = 0
for text, ours in zip(data["texts"], data["ids"]):
    ref = tok.encode(text, add_special_tokens=False)
    if ref != ours:
        bad += 1
        if bad <= 5:
            print("DIFF", repr(text), "\n ours", ours, "\n  ref", ref)
print(f"{type(tok).__name__}: {len(data['texts']) - bad} of {len(data['texts'])} texts give identical ids")
sys.exit(1 if bad else 0)
