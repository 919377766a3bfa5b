#!/usr/bin/env bash
# On the GPU machine (after the build stage of tools/gpu/check.sh): our logits vs HF
# transformers' on seeded random-weight models of the Llama-2-7B and Llama-3.1-8B shapes, at 4K
# and 32K tokens of context. Ours: `quantspec logits --device cuda --prefill-matmul exact` (bf16
# weights, f32 activations and KV). HF: LlamaForCausalLM (SDPA) in float32 (TF32 off: the same
# function, so the difference is summation order) and in bfloat16 (what people run: bf16-level
# error).
# One line per (shape, length): max |ours - HF| / max |HF| over the last 16 positions, and how
# often the argmax agrees.
#
#   QS_ORACLE="llama3.1-8b" QS_ORACLE_LENGTHS="4096 32768" bash tools/gpu/hf_oracle.sh
set -uo pipefail

source "$(dirname "$0")/lib.sh"
qs_gpu_setup
lengths=${QS_ORACLE_LENGTHS:-4096 32768}
last=16

for shape in ${QS_ORACLE:-llama2-7b llama3.1-8b}; do
  dir=/tmp/qs-$shape
  qs_make_model "$shape" || continue
  max_len=0
  for n in $lengths; do ((n > max_len)) && max_len=$n; done
  python3 -c "
import numpy as np, json
vocab = json.load(open('$dir/config.json'))['vocab_size']
np.random.default_rng(7).integers(0, min(vocab, 32000), $max_len).astype('<i4').tofile('$out/oracle-ids.i32')"
  for n in $lengths; do
    python3 -c "
import numpy as np
np.fromfile('$out/oracle-ids.i32', dtype='<i4')[:$n].tofile('$out/oracle-ids-$n.i32')"
    t0=$SECONDS
    "$qs" logits -m "$dir" --device cuda --ctx "$n" --prefill-chunk 4096 --prefill-matmul exact \
      --tokens "$out/oracle-ids-$n.i32" --token-dtype i32 --last $last \
      --out "$out/ours-$shape-$n.npy" 2>"$out/ours-$shape-$n.log" ||
      { echo "hf_oracle: ours failed ($shape $n)"; tail -3 "$out/ours-$shape-$n.log"; }
    echo "hf_oracle: ours $shape $n tokens in $((SECONDS - t0)) s (load + prefill + logits)"
  done
  python3 - "$dir" "$out" "$shape" $last $lengths <<'PY'
import sys, time
import numpy as np
import torch
from transformers import AutoModelForCausalLM
torch.backends.cuda.matmul.allow_tf32 = False
torch.backends.cudnn.allow_tf32 = False
d, out, shape, last = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
lengths = [int(x) for x in sys.argv[5:]]
ids_all = np.fromfile(f"{out}/oracle-ids.i32", dtype="<i4")
model = AutoModelForCausalLM.from_pretrained(d, dtype=torch.bfloat16, attn_implementation="sdpa").cuda().eval()
for dtype in ("bfloat16", "float32"):
    if dtype == "float32":
        model = model.float()
    for n in lengths:
        try:
            ours = np.load(f"{out}/ours-{shape}-{n}.npy")
        except OSError:
            continue
        ids = torch.tensor(ids_all[:n][None, :].astype(np.int64), device="cuda")
        t0 = time.time()
        with torch.no_grad():
            ref = model(ids, logits_to_keep=last).logits[0].float().cpu().numpy()
        torch.cuda.synchronize()
        rel = float(np.abs(ours - ref).max() / np.abs(ref).max())
        agree = float((ours.argmax(-1) == ref.argmax(-1)).mean())
        print(f"ORACLE {shape} n={n} HF {dtype}: max|ours-HF|/max|HF| = {rel:.2e}, "
              f"argmax agreement {agree:.3f} over the last {last} positions "
              f"(HF forward {time.time() - t0:.1f} s)", flush=True)
PY
done
