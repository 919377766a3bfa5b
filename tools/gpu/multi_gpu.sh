#!/usr/bin/env bash
# Tensor parallelism on a multi-GPU device kind (nvidia-h200-x2 / -x4), in one device call from
# the repository root (carry [".deb/bundle"]): find NCCL, build with it, run the 2-GPU
# conformance test (tests/cuda/test_tensor_parallel.cpp), then decode benchmarks with --tp 1 and
# --tp N on the random-weight Llama-2-7B shape. Logs and JSON go to $OUT.
#
#   bash tools/gpu/multi_gpu.sh                      # tp 1 and 2, contexts 32768,131072
#   QS_TP="1 2 4" QS_TP_CONTEXTS=131072 bash tools/gpu/multi_gpu.sh
#
# Environment: QS_TP (world sizes to bench, default "1 2"), QS_TP_CONTEXTS (default
# 32768,131072), QS_TP_MODES (default ar-fp16,ar-int8,quantspec), QS_TP_TOKENS (default 32),
# OUT. NVLink multicast stays off (NCCL_NVLS_ENABLE=0, the device README's rule; the
# communicator sets it too).
set -uo pipefail
source "$(dirname "$0")/lib.sh"
qs_gpu_setup
export NCCL_NVLS_ENABLE=0

{
  nvidia-smi -L
  nvidia-smi topo -m
} >"$out/topology.txt" 2>&1
cat "$out/topology.txt"

# NCCL: the system's, or a pip wheel's (nvidia-nccl-cu*), whichever is found first.
nccl_lib=$(find /usr /opt /usr/local -name 'libnccl.so*' 2>/dev/null | head -1)
if [[ -n $nccl_lib ]]; then
  nccl_dir=$(dirname "$nccl_lib")
  nccl_inc=$(find "$nccl_dir/.." /usr/include /usr/local/cuda/include -maxdepth 2 -name nccl.h \
    2>/dev/null | head -1)
  echo "multi_gpu: NCCL library $nccl_lib, header ${nccl_inc:-not found}"
  [[ -e $nccl_dir/libnccl.so ]] || { mkdir -p /tmp/qs-nccl && ln -sf "$nccl_lib" /tmp/qs-nccl/libnccl.so && nccl_dir=/tmp/qs-nccl; }
  export QS_CMAKE_EXTRA="-DQS_NCCL_LIBRARY=$nccl_dir/libnccl.so ${nccl_inc:+-DQS_NCCL_INCLUDE_DIR=$(dirname "$nccl_inc")}"
  export LD_LIBRARY_PATH="$(dirname "$nccl_lib")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
else
  echo "multi_gpu: no libnccl found; the build reports tensor parallelism over GPUs as unavailable"
fi

tools/gpu/build_on_device.sh test_cuda quantspec >"$out/build.log" 2>&1 || {
  tail -20 "$out/build.log"
  exit 1
}
grep -E "NCCL" "$out/build.log"
source "$build/env.sh"

timeout 300 "$build/tests/test_cuda" --gtest_filter='CudaTensorParallel.*' >"$out/tp-test.log" 2>&1
echo "tp test rc $?"
grep -E "OK|FAILED|SKIPPED|max rel error|error" "$out/tp-test.log" | head -20

qs_make_model llama2-7b || exit 1
for tp in ${QS_TP:-1 2}; do
  echo "== --tp $tp"
  timeout 900 "$qs" bench -m /tmp/qs-llama2-7b --device cuda --tp "$tp" \
    --contexts "${QS_TP_CONTEXTS:-32768,131072}" --modes "${QS_TP_MODES:-ar-fp16,ar-int8,quantspec}" \
    --gammas 4 -n "${QS_TP_TOKENS:-32}" -o "$out/tp$tp.json" 2>"$out/tp$tp.err" | tee "$out/tp$tp.txt"
  grep -E "error" "$out/tp$tp.err" | head -3
done
