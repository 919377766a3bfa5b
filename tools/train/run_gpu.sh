#!/usr/bin/env bash
# The one GPU call that trains the bundled model (issue #4). Pass to the device tool's `run`:
#   command:   bash tools/train/run_gpu.sh
#   carry:     [".train/gpu"]          (made by build_corpus.py + prepare_data.py, ~19 MB)
#   timeout_s: 600
# It trains for BUDGET seconds (default 450, compilation included), evaluates, exports and
# leaves in $OUT: qs-tiny-16k.tar.partNN (<= 15 MB each) and train_log.txt. The last line it
# prints is the SUMMARY (or FAILED). Unpack here with:
#   cat <files_at>/qs-tiny-16k.tar.part* > /tmp/m.tar && mkdir -p models/qs-tiny-16k &&
#   tar -xf /tmp/m.tar -C models/qs-tiny-16k
# Extra arguments go to train.py (e.g. --seq-len 8192).
set -uo pipefail
: "${OUT:?OUT must name the folder whose files come back}"
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 HF_HUB_DISABLE_PROGRESS_BARS=1
export TOKENIZERS_PARALLELISM=false
name=qs-tiny-16k
date -u +"start %FT%TZ"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
python3 -c 'import torch, transformers, tokenizers; print("torch", torch.__version__,
  "transformers", transformers.__version__, "tokenizers", tokenizers.__version__)'
python3 tools/train/train.py --data .train/gpu --name "$name" --export-dir "/tmp/$name" \
  --out-tar "$OUT/$name.tar" --time-budget-s "${BUDGET:-450}" "$@" 2>&1 | tee "$OUT/train_log.txt"
rc=${PIPESTATUS[0]}
date -u +"end %FT%TZ"
ls -l "$OUT"
grep '^SUMMARY' "$OUT/train_log.txt" || echo "FAILED rc=$rc (see train_log.txt)"
exit "$rc"
