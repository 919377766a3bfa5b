#!/usr/bin/env bash
# Where the GPU time goes (runs ON the GPU machine, after tools/gpu/check.sh's build stage):
#   kernels   Nsight Compute (throughput, occupancy, launch, warp-state and scheduler sections;
#             cold L2, clocks left alone) on a few calls of each
#             QuantSpec kernel at 32K (bench_ops --profile: the quantized attention draft/target
#             kernels, the 4-bit GEMV): throughput, occupancy, warp stall reasons.
#   decode    every kernel of a few decoding steps of `quantspec bench` (QS_PROFILE_DECODE=<ctx>:
#             the engine brackets decoding of prompts of >= ctx tokens, not the bench's warm-up,
#             for `ncu --profile-from-start off`), timed by ncu with warm
#             caches; tools/gpu/ncu_summary.py sums them per kernel and per step, to set against
#             the step's wall time (the rest is host time: launches, syncs, sampling).
#
#   QS_PROFILE="kernels decode" bash tools/gpu/profile.sh
#
# Environment: QS_PROFILE (stages, default both), QS_PROFILE_MODEL (decode: a shape of
# make_synthetic_model.py, default llama2-7b), QS_PROFILE_CONTEXT (default 32768),
# QS_PROFILE_MODES (default ar-fp16,ar-int8,quantspec), QS_PROFILE_KERNELS (ncu -k regex),
# QS_PROFILE_SECTIONS (bench_ops sections of the kernels stage, default quantkv,w4mm), OUT.
set -uo pipefail

source "$(dirname "$0")/lib.sh"
qs_gpu_setup
qs_find_ncu || exit 1
ncu_common=(--clock-control none --target-processes all)

for stage in ${QS_PROFILE:-kernels decode}; do
  case $stage in
    kernels)
      regex=${QS_PROFILE_KERNELS:-attention_quant_kernel|quant_combine|gemv_q4}
      t0=$SECONDS
      # `--set full` replays each kernel ~38 times: 4 minutes were not enough for this list.
      timeout 300 "$ncu_bin" "${ncu_common[@]}" --cache-control all --section SpeedOfLight \
        --section Occupancy --section LaunchStats --section WarpStateStats \
        --section SchedulerStats --section MemoryWorkloadAnalysis \
        --section InstructionStats -k "regex:$regex" "$build/bench/cuda/bench_ops" --quick \
        --profile --sections "${QS_PROFILE_SECTIONS:-quantkv,w4mm}" >"$out/ncu-kernels.txt" 2>&1
      echo "kernels: rc $?, $((SECONDS - t0)) s, $(grep -c '^==PROF== Profiling' "$out/ncu-kernels.txt") kernels profiled"
      ;;
    decode)
      model=${QS_PROFILE_MODEL:-llama2-7b}
      qs_make_model "$model" || continue
      ctx=${QS_PROFILE_CONTEXT:-32768}
      for mode in ${QS_PROFILE_MODES:-ar-fp16 ar-int8 quantspec}; do
        t0=$SECONDS
        # Wall time of the same steps without the profiler, then the profiled run.
        "$qs" bench -m "/tmp/qs-$model" --device cuda --contexts "$ctx" --modes "$mode" \
          --gammas 4 -n 16 --repeats 1 -o "$out/wall-$mode.json" >"$out/wall-$mode.txt" 2>&1
        QS_PROFILE_DECODE=$ctx timeout 300 "$ncu_bin" "${ncu_common[@]}" --cache-control none \
          --profile-from-start off --metrics gpu__time_duration.sum --csv \
          --log-file "$out/ncu-decode-$mode.csv" \
          "$qs" bench -m "/tmp/qs-$model" --device cuda --contexts "$ctx" --modes "$mode" \
          --gammas 4 -n 6 --repeats 1 >"$out/ncu-decode-$mode.txt" 2>&1
        echo "decode $mode: rc $?, $((SECONDS - t0)) s"
        python3 tools/gpu/ncu_summary.py "$out/ncu-decode-$mode.csv" --wall "$out/wall-$mode.json" |
          tee "$out/summary-$mode.txt"
      done
      ;;
    *) echo "profile: unknown stage $stage" >&2 ;;
  esac
done
