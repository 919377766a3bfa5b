#!/usr/bin/env bash
# Issue #9's matrix for one model shape on the GPU machine (after tools/gpu/check.sh's build
# stage): one `quantspec bench` process per mode (a JSON each, so a mode that fails or a call
# that runs out of time loses only its own cells), every context in it, then the merged report.
# A mode is skipped (and said so) once QS_MATRIX_DEADLINE seconds have passed, so that a device
# call can stop cleanly before its limit.
#
#   bash tools/gpu/bench_matrix.sh llama2-7b
#   QS_MATRIX_MODES=ar-fp16,snapkv QS_MATRIX_CONTEXTS=131072 bash tools/gpu/bench_matrix.sh llama2-7b
#
# Environment: QS_MATRIX_CONTEXTS (default 4096,8192,16384,32768,65536,131072), QS_MATRIX_MODES
# (default ar-fp16,ar-int8,quantspec,streamingllm,snapkv), QS_MATRIX_TOKENS (default 256; a list
# such as 256,2048 as in bench_e2e.sh), QS_MATRIX_GAMMAS (default 3), QS_MATRIX_DEADLINE
# (seconds; default none), QS_MATRIX_HF (set: also HF transformers' compiled decode over the same
# contexts, tools/hf_decode_bench.py --static --repeats 1, into OUT/n<N>/<shape>-hf/ and the
# report), OUT. Writes OUT/n<N>/<shape>-<mode>/e2e-<shape>.json per generation length N, the
# tables of every mode in OUT/tables-<shape>-n<N>.txt and the merged report
# OUT/report-<shape>-n<N>.md.
set -uo pipefail

shape=${1:?usage: bench_matrix.sh SHAPE}
out=${OUT:-$(cd "$(dirname "$0")/../.." && pwd)/out}
mkdir -p "$out"
contexts=${QS_MATRIX_CONTEXTS:-4096,8192,16384,32768,65536,131072}
modes=${QS_MATRIX_MODES:-ar-fp16,ar-int8,quantspec,streamingllm,snapkv}
deadline=${QS_MATRIX_DEADLINE:-}
tokens=${QS_MATRIX_TOKENS:-256}
for n in ${tokens//,/ }; do
  for mode in ${modes//,/ }; do
    if [[ -n $deadline ]] && ((SECONDS > deadline)); then
      echo "bench_matrix: skipped $shape $mode, $n tokens (deadline: $SECONDS s > $deadline s)"
      continue
    fi
    dir=$out/n$n/$shape-$mode
    mkdir -p "$dir"
    OUT=$dir QS_E2E=$shape QS_E2E_CONTEXTS=$contexts QS_E2E_MODES=$mode \
      QS_E2E_GAMMAS=${QS_MATRIX_GAMMAS:-3} QS_E2E_TOKENS=$n \
      QS_PREFILL_MATMUL=${QS_PREFILL_MATMUL:-bf16} bash "$(dirname "$0")/bench_e2e.sh"
    rc=$?
    cat "$dir"/e2e-*.txt >>"$out/tables-$shape-n$n.txt" 2>/dev/null
    # A cell's error (e.g. out of memory) is in the table and its .err file; bench_e2e fails only
    # when it cannot run at all.
    echo "bench_matrix: $shape $mode, $n tokens: $( ((rc == 0)) && echo ran || echo "FAILED (rc $rc)") at $SECONDS s"
  done
  if [[ -n ${QS_MATRIX_HF:-} ]]; then
    if [[ -n $deadline ]] && ((SECONDS > deadline)); then
      echo "bench_matrix: skipped $shape hf, $n tokens (deadline: $SECONDS s > $deadline s)"
    else
      dir=$out/n$n/$shape-hf
      mkdir -p "$dir"
      (cd "$(dirname "$0")/../.." && source tools/gpu/lib.sh && qs_make_model "$shape")
      python3 "$(dirname "$0")/../hf_decode_bench.py" --model "/tmp/qs-$shape" --contexts "$contexts" \
        --tokens "$n" --device cuda --dtype bfloat16 --static --repeats 1 \
        -o "$dir/hf-$shape.json" >"$dir/hf-$shape.txt" 2>"$dir/hf-$shape.err"
      rc=$?
      cat "$dir/hf-$shape.txt" >>"$out/tables-$shape-n$n.txt"
      echo "bench_matrix: $shape hf, $n tokens: $( ((rc == 0)) && echo ran || echo "FAILED (rc $rc)") at $SECONDS s"
    fi
  fi
  shopt -s nullglob
  files=("$out/n$n/$shape"-*/e2e-*.json "$out/n$n/$shape"-hf/hf-*.json)
  if ((${#files[@]})); then
    python3 "$(dirname "$0")/../bench_report.py" "${files[@]}" --merge "$shape" \
      --markdown "$out/report-$shape-n$n.md" || echo "bench_matrix: no report for $n tokens"
  fi
done
