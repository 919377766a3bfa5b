#!/usr/bin/env bash
# On the GPU machine: recompute the HF goldens of the committed tiny test models with that
# machine's torch + transformers on CUDA (TF32 off, float32) and compare them with the committed
# goldens (made by tools/make_test_models.py). One line per model: max |logit diff| / max |logit|
# for both sequences, and whether the 64-token greedy continuation agrees.
set -euo pipefail
cd "$(dirname "$0")/../.."
python3 - <<'PY'
import json
import numpy as np
import torch
import transformers
from transformers import AutoModelForCausalLM
torch.backends.cuda.matmul.allow_tf32 = False
torch.backends.cudnn.allow_tf32 = False
dev = "cuda" if torch.cuda.is_available() else "cpu"
for name in ("llama3-tiny", "llama2-tiny", "mistral-tiny", "qwen2-tiny", "qwen2-yarn-tiny"):
    g = f"tests/data/golden/{name}"
    m = AutoModelForCausalLM.from_pretrained(f"models/test/{name}", dtype=torch.float32).to(dev).eval()
    rel = []
    for n in (40, 300):
        ids = torch.tensor(np.load(f"{g}/ids_{n}.npy")[None, :], dtype=torch.long, device=dev)
        with torch.no_grad():
            got = m(ids).logits[0].float().cpu().numpy()
        ref = np.load(f"{g}/logits_{n}.npy")
        got = got[:, :ref.shape[1]]  # the 300-token golden keeps the first columns
        rel.append(float(np.abs(got - ref).max() / np.abs(ref).max()))
    gj = json.load(open(f"{g}/greedy.json"))
    seq = torch.tensor([gj["prompt_ids"]], dtype=torch.long, device=dev)
    out = []
    with torch.no_grad():
        for _ in range(len(gj["greedy_ids"])):
            nxt = int(m(seq).logits[0, -1].argmax())
            out.append(nxt)
            seq = torch.cat([seq, torch.tensor([[nxt]], device=dev)], dim=1)
    print(f"GOLDEN {name}: rel diff 40={rel[0]:.2e} 300={rel[1]:.2e} "
          f"greedy_same={out == gj['greedy_ids']} (transformers {transformers.__version__}, "
          f"torch {torch.__version__}, {dev})")
PY
