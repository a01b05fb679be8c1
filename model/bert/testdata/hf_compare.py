"""Compare agemem's sentence embeddings with Hugging Face transformers.

Usage: python3 hf_compare.py DIR   (DIR written by TestExportForTransformers)
Each encoder directory holds config.json, model.safetensors, vocab.txt and
our embeddings of the same sentences in every pooling. transformers loads it
as a user would (AutoModel, float32, eager attention) and runs our token ids
as one padded batch with an attention mask; the poolings are computed as
sentence-transformers and SimCSE define them. Where sentence-transformers is
installed, its mean-pooling pipeline is compared as well.
"""
import json
import os
import sys

import torch
import transformers
from transformers import AutoModel

root = sys.argv[1]
print("transformers", transformers.__version__, "torch", torch.__version__)
worst = 0.0
for name in sorted(os.listdir(root)):
    d = os.path.join(root, name)
    ours = json.load(open(os.path.join(d, "agemem_embeddings.json")))
    model = AutoModel.from_pretrained(d, torch_dtype=torch.float32, attn_implementation="eager").eval()
    ids = ours["ids"]
    n = max(len(s) for s in ids)
    pad = model.config.pad_token_id or 0
    batch = torch.tensor([s + [pad] * (n - len(s)) for s in ids])
    mask = torch.tensor([[1] * len(s) + [0] * (n - len(s)) for s in ids])
    with torch.no_grad():
        out = model(input_ids=batch, attention_mask=mask)
    h = out.last_hidden_state.double()
    ref = {
        "cls": h[:, 0],
        "cls_mlp": out.pooler_output.double(),
        "mean": (h * mask[..., None]).sum(1) / mask.sum(1, keepdim=True),
    }
    for pool, r in ref.items():
        r = torch.nn.functional.normalize(r, dim=-1)
        got = torch.tensor(ours[pool], dtype=torch.float64)
        err = (got - r).abs().max().item()
        worst = max(worst, err)
        print(f"{name:8s} {type(model).__name__:12s} {pool:8s} max|diff| {err:.3e}")
    try:
        from sentence_transformers import SentenceTransformer, models
    except ImportError:
        print("sentence-transformers not installed: its pipeline not compared")
        continue
    st = SentenceTransformer(modules=[models.Transformer(d), models.Pooling(model.config.hidden_size, "mean"), models.Normalize()])
    emb = st.encode(ours["texts"], convert_to_tensor=True).double().cpu()
    err = (torch.tensor(ours["mean"], dtype=torch.float64) - emb).abs().max().item()
    worst = max(worst, err)
    print(f"{name:8s} SentenceTransformer mean     max|diff| {err:.3e} (its own tokenizer)")
print(f"worst absolute difference {worst:.3e}")
sys.exit(0 if worst < 1e-5 else 1)
