#!/usr/bin/env bash
# Every kernel's share of a running decode step (runs ON the GPU machine): builds quantspec with
# -DQS_KERNEL_TRACE into its own folder (launch.cuh; never the default build), runs a short
# `quantspec bench` per mode and prints tools/gpu/kernel_trace.py's per-layer table of each.
#
#   QS_TRACE_MODEL=llama2-7b QS_TRACE_CONTEXT=131072 QS_TRACE_MODES=quantspec,ar-fp16 \
#     bash tools/gpu/trace_decode.sh
#
# Environment: QS_TRACE_MODEL (a shape of make_synthetic_model.py, default llama2-7b),
# QS_TRACE_CONTEXT (default 131072), QS_TRACE_MODES (default quantspec,ar-fp16,ar-int8),
# QS_TRACE_TOKENS (default 16), QS_TRACE_BUILD (default build-trace), OUT. Writes
# OUT/trace-<model>-<context>-<mode>.txt.gz (the records), -run.txt (the bench's output) and
# -summary.txt.
set -uo pipefail

source "$(dirname "$0")/lib.sh"
qs_gpu_setup || exit 1
model=${QS_TRACE_MODEL:-llama2-7b}
context=${QS_TRACE_CONTEXT:-131072}
tokens=${QS_TRACE_TOKENS:-16}
trace_build=${QS_TRACE_BUILD:-$repo/build-trace}
QS_GPU_BUILD=$trace_build QS_CMAKE_EXTRA="-DCMAKE_CUDA_FLAGS=-DQS_KERNEL_TRACE" \
  bash "$repo/tools/gpu/build_on_device.sh" quantspec >"$out/build-trace.log" 2>&1 ||
  { tail -20 "$out/build-trace.log"; exit 1; }
qs_make_model "$model" || exit 1
modes=${QS_TRACE_MODES:-quantspec,ar-fp16,ar-int8}
# kernel_trace.py splits forwards where the host waited; a chained round queues its draft steps
# and verification without a wait, so the trace runs rounds step by step unless told otherwise.
export QS_CHAINED_ROUNDS=${QS_CHAINED_ROUNDS:-0}
for mode in ${modes//,/ }; do
  base=$out/trace-$model-$context-$mode
  QS_KERNEL_TRACE_FILE=$base.txt "$trace_build/quantspec" bench -m "/tmp/qs-$model" --device cuda \
    --contexts "$context" --modes "$mode" --gammas 3 -n "$tokens" >"$base-run.txt" 2>&1
  grep -h "^ar-\|^quantspec \|^streamingllm \|^snapkv " "$base-run.txt"
  python3 "$repo/tools/gpu/kernel_trace.py" "$base.txt" --names llama >"$base-summary.txt" 2>&1
  cat "$base-summary.txt"
  gzip -f "$base.txt"
done
