#!/usr/bin/env bash
# Why a kernel waits (runs ON the GPU machine, after tools/gpu/check.sh's build stage): Nsight
# Compute's warp stall reasons (cycles per issued instruction, by reason) and the L2 / DRAM
# traffic of the first COUNT launches of kernels matching REGEX in `bench_ops --sections
# SECTIONS --quick --profile`, cold L2, clocks left alone. One table per launch on stdout.
#
#   bash tools/gpu/ncu_stalls.sh REGEX SECTIONS [COUNT]
#   bash tools/gpu/ncu_stalls.sh attention_decode_tc_kernel attn 1
set -uo pipefail

source "$(dirname "$0")/lib.sh"
qs_gpu_setup
regex=$1 sections=$2 count=${3:-1}
qs_find_ncu || exit 1

stalls=(long_scoreboard short_scoreboard mio_throttle math_pipe_throttle wait barrier
  not_selected selected dispatch_stall lg_throttle no_instruction branch_resolving drain membar
  misc sleeping tex_throttle imc_miss)
metrics=gpu__time_duration.sum,dram__bytes_read.sum,lts__t_sectors.sum
metrics+=,lts__t_sectors_srcunit_tex_op_read.sum,lts__t_sectors_srcunit_tex_op_read_lookup_hit.sum
metrics+=,lts__t_requests_srcunit_tex_op_read.sum,lts__t_sectors_srcunit_ltcfabric.sum
metrics+=,lts__throughput.avg.pct_of_peak_sustained_elapsed,smsp__issue_active.avg.per_cycle_active
metrics+=,smsp__warps_active.avg.per_cycle_active
# QS_NCU_EXTRA: more metrics, comma-separated (e.g. L1 hit counts, launch__shared_mem_config_size)
[[ -n ${QS_NCU_EXTRA:-} ]] && metrics+=,$QS_NCU_EXTRA
for s in "${stalls[@]}"; do metrics+=,smsp__average_warps_issue_stalled_${s}_per_issue_active.ratio; done

timeout 240 "$ncu_bin" --clock-control none --cache-control all --metrics "$metrics" \
  -k "regex:$regex" -c "$count" "$build/bench/cuda/bench_ops" --quick --profile \
  --sections "$sections" 2>&1 | grep -vE '^\| |^==PROF==|^device:|^$'
