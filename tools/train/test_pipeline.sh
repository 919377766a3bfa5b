#!/usr/bin/env bash
# End-to-end CPU smoke test of the training pipeline with a tiny model (about 2 minutes):
# prepare_data.py on a corpus subset, train.py for a few steps through run_gpu.sh's code path
# (tar parts in $OUT), then unpack the tar and reload it as a user would.
# Needs .train/corpus from build_corpus.py. Usage: tools/train/test_pipeline.sh [--compile on]
set -euo pipefail
cd "$(dirname "$0")/../.."
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
[[ -f .train/corpus/docs.jsonl ]] || { echo "run tools/train/build_corpus.py first"; exit 1; }

python3 tools/train/prepare_data.py --corpus .train/corpus --out "$work/data" --max-docs 60 \
  --vocab-size 1024 --min-doc-tokens 1024
mkdir -p "$work/out"
python3 tools/train/train.py --data "$work/data" --name qs-test --export-dir "$work/export" \
  --out-tar "$work/out/qs-test.tar" --hidden-size 64 --intermediate-size 128 --num-layers 2 \
  --num-heads 4 --num-kv-heads 2 --head-dim 16 --seq-len 256 --batch 4 --max-steps 40 \
  --warmup-steps 5 --lr 3e-3 --time-budget-s 300 --compile off --eval-every-s 0 \
  --max-eval-windows 8 --sample-tokens 8 "$@" 2>&1 | tee "$work/log.txt"

cat "$work"/out/qs-test.tar.part* > "$work/m.tar"
mkdir "$work/model"
tar -xf "$work/m.tar" -C "$work/model"
python3 - "$work/model" <<'EOF'
import json, math, os, sys
import numpy as np, torch
from tokenizers import Tokenizer
from transformers import AutoModelForCausalLM
d = sys.argv[1]
need = {"config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
        "README.md", "metrics.json", "heldout.u16"}
files = set(os.listdir(d))
assert need <= files, need - files
assert any(f.endswith(".safetensors") for f in files), files
assert all(os.path.getsize(os.path.join(d, f)) <= 15_000_000 for f in files)
m = json.load(open(os.path.join(d, "metrics.json")))
tok = Tokenizer.from_file(os.path.join(d, "tokenizer.json"))
model = AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32).eval()
cfg = json.load(open(os.path.join(d, "config.json")))
assert cfg["dtype"] == "bfloat16" and cfg["num_key_value_heads"] < cfg["num_attention_heads"]
# Recompute the held-out perplexity from heldout.u16 exactly as documented.
toks = np.fromfile(os.path.join(d, "heldout.u16"), dtype="<u2").astype(np.int64)
T = m["training"]["seq_len"]
nll, n = 0.0, 0
with torch.no_grad():
    for s in range(0, len(toks) - 1, T):
        L = min(T, len(toks) - 1 - s)
        ids = torch.from_numpy(toks[s:s + L])[None]
        tgt = torch.from_numpy(toks[s + 1:s + L + 1])
        lp = torch.log_softmax(model(input_ids=ids).logits[0].double(), -1)
        nll -= lp.gather(1, tgt[:, None]).sum().item()
        n += L
ppl = math.exp(nll / n)
ref = m["results"]["heldout"]["ppl"]
print(f"reloaded: {len(files)} files; held-out ppl recomputed {ppl:.4f} vs metrics {ref:.4f}")
assert n == m["results"]["heldout"]["tokens"], (n, m["results"]["heldout"]["tokens"])
assert abs(ppl / ref - 1) < 1e-4, (ppl, ref)
ids = tok.encode("The book").ids
assert ids[0] == cfg["bos_token_id"]
print("pipeline OK")
EOF
