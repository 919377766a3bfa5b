#!/usr/bin/env bash
# End-to-end decode benchmarks on the GPU machine (runs THERE, after tools/gpu/check.sh's build
# stage): `quantspec bench --device cuda` on the bundled trained model (a real acceptance rate)
# and on seeded random-weight models of the Llama-2-7B and Llama-3.1-8B shapes (real memory
# traffic). JSON per model and the tables go to $OUT.
# padded-llama2-7b / padded-llama3.1-8b (not in the default list; name them in QS_E2E): the
# bundled model padded to those shapes by tools/pad_model.py (the same function, so its real
# acceptance, at 7B/8B weight and KV bytes), made in /tmp/qs-padded-<shape> unless present
# (~1 min, 13.5 / 16 GB of disk each) and benched on held-out text. padded-llama2-7b-hd128 /
# padded-llama3.1-8b-hd128: the same with the real models' head_dim 128 (pad_model.py's doubled
# heads), so attention runs the kernels the 7B/8B shapes use.
#
#   bash tools/gpu/bench_e2e.sh                 # default llama2-7b llama3.1-8b
#   QS_E2E="default llama3.1-8b" bash tools/gpu/bench_e2e.sh
#   QS_E2E="padded-llama2-7b padded-llama3.1-8b" bash tools/gpu/bench_e2e.sh
#
# Environment: QS_E2E (models to run: default llama2-7b llama3.1-8b padded-llama2-7b
# padded-llama3.1-8b padded-llama2-7b-hd128 padded-llama3.1-8b-hd128; default: the first three), QS_E2E_TOKENS (generated tokens per run,
# default 128; a list such as "256,2048" runs each into e2e-<model>-n<N>.*), QS_E2E_GAMMAS
# (default 2,4,6), QS_E2E_MODES, QS_E2E_CONTEXTS (one list for every model instead of the
# defaults below), QS_E2E_HF (set: also time HF transformers on the same model and contexts,
# tools/hf_decode_bench.py; QS_E2E_HF_REPEATS timed runs per length, default 3), OUT.
set -uo pipefail

source "$(dirname "$0")/lib.sh"
qs_gpu_setup
[[ -x $qs ]] || { echo "bench_e2e: $qs missing (build stage)" >&2; exit 1; }
export QS_COMMIT=${QS_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}
tokens=${QS_E2E_TOKENS:-128}
gammas=${QS_E2E_GAMMAS:-2,4,6}
modes=${QS_E2E_MODES:-ar-fp16,ar-int8,quantspec}

# Contexts per model. Llama-2-7B at 128K: 64 GiB of f16 rows for the fp16 baseline (the prefill
# of the hierarchical cache passes through them too); the cache allocates them once.
declare -A contexts=(
  [default]=1024,4096,16000
  [llama2-7b]=4096,32768,131072
  [llama3.1-8b]=4096,32768,131072
  # The padded models are the bundled one, trained at 16K context.
  [padded-llama2-7b]=4096,16000
  [padded-llama3.1-8b]=4096,16000
  [padded-llama2-7b-hd128]=4096,16000
  [padded-llama3.1-8b-hd128]=4096,16000
)

for name in ${QS_E2E:-default llama2-7b llama3.1-8b}; do
  if [[ $name == default ]]; then
    dir=models/default
    extra=(--prompt-tokens models/default/heldout.u16)
  else
    dir=/tmp/qs-$name
    qs_make_model "$name" || continue
    extra=()
    # The padded models are the bundled one: its held-out text.
    [[ $name == padded-* ]] && extra=(--prompt-tokens models/default/heldout.u16)
  fi
  ctx=${QS_E2E_CONTEXTS:-${contexts[$name]}}
  lengths=(${tokens//,/ })
  for n in "${lengths[@]}"; do
    # One report per generation length; the file names carry it when there are several.
    tag=$name
    ((${#lengths[@]} > 1)) && tag=$name-n$n
    echo "== $name: contexts $ctx, modes $modes, gammas $gammas, $n tokens =="
    "$qs" bench -m "$dir" --device cuda --contexts "$ctx" --modes "$modes" \
      --gammas "$gammas" -n "$n" "${extra[@]}" -o "$out/e2e-$tag.json" \
      2>"$out/e2e-$tag.err" | tee "$out/e2e-$tag.txt"
    grep -E "error" "$out/e2e-$tag.err" | head -3
    if [[ -n ${QS_E2E_HF:-} && $name != default ]]; then
      # The "what people use today" row: HF transformers, bf16, static cache + compiled decode.
      python3 tools/hf_decode_bench.py --model "$dir" --contexts "$ctx" --tokens "$n" \
        --device cuda --dtype bfloat16 --static --repeats "${QS_E2E_HF_REPEATS:-3}" -o "$out/hf-$tag.json" 2>"$out/hf-$tag.err" |
        tee "$out/hf-$tag.txt"
    fi
  done
done
