#!/usr/bin/env bash
# The whole GPU check in one device call (runs ON the GPU machine, from the repository root):
# build, conformance tests, compute-sanitizer on a small subset, benchmarks. Full logs go to
# $OUT (the device tool brings them back); a short table is printed last.
#
#   device run: QS_COMMIT=<git rev-parse --short HEAD here> bash tools/gpu/check.sh
#               carry: [".deb/bundle"]   (the device copy's .git may lag the tree: name the commit)
#   bash tools/gpu/check.sh build test       # only some stages (build sass prewait test sanitize
#                                            # bench e2e oracle)
#
# Environment: QS_BENCH_ARGS (extra bench_ops arguments, e.g. "--quick"), QS_TEST_FILTER
# (gtest filter of the conformance run), OUT (log folder; default ./out).
set -uo pipefail

repo=$(cd "$(dirname "$0")/../.." && pwd)
cd "$repo"
out=${OUT:-$repo/out}
mkdir -p "$out"
stages=("$@")
((${#stages[@]})) || stages=(build sass prewait test sanitize bench e2e oracle)
want() { [[ " ${stages[*]} " == *" $1 "* ]]; }
build=${QS_GPU_BUILD:-$repo/build-gpu}
declare -A result seconds

timed() {  # name, command...: runs the command, its seconds into seconds[name]
  local name=$1 t0=$SECONDS
  shift
  "$@"
  local rc=$?
  seconds[$name]=$((SECONDS - t0))
  return $rc
}

run_stage() {  # name, timeout seconds, command...
  local name=$1 limit=$2
  shift 2
  timed "$name" timeout --kill-after=10 "$limit" "$@"
  local rc=$?
  if ((rc == 0)); then result[$name]=ok; elif ((rc == 124)); then result[$name]="TIMEOUT"; else result[$name]="FAILED (rc $rc)"; fi
  return $rc
}

{
  echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  # The device copy's .git can lag the tree it carries: QS_COMMIT (set in the run command) wins.
  echo "commit: ${QS_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)$(git diff --quiet 2>/dev/null || echo ' (+ uncommitted changes)')}"
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv 2>&1
  (command -v nvcc >/dev/null && nvcc --version | tail -2) || /usr/local/cuda/bin/nvcc --version | tail -2
  cmake --version | head -1
  # The machine's OS, C library and host compiler: whether binaries built off the device would run there.
  echo "os: $( (. /etc/os-release && echo "$PRETTY_NAME") 2>/dev/null || uname -sr); $(ldd --version 2>&1 | head -1); $(c++ --version 2>&1 | head -1)"
  echo "cores: $(nproc)"
} >"$out/env.log" 2>&1
cat "$out/env.log"

if want build; then
  run_stage build 300 bash -c "tools/gpu/build_on_device.sh test_cuda bench_ops quantspec 2>&1 | tee '$out/build.log' | grep -E 'error|warning|build_on_device' ; exit \${PIPESTATUS[0]}"
fi
[[ -f $build/env.sh ]] && source "$build/env.sh"

cuobjdump_bin=$(command -v cuobjdump || echo /usr/local/cuda/bin/cuobjdump)
sass_check() {
  local obj
  # Load / tensor-core / branch / local-memory instructions of each kernel, in program order:
  # are the 16-byte weight loads issued together, is anything spilled.
  for obj in "$build"/src/backend/cuda/CMakeFiles/qs_backend_cuda.dir/{gemv,attention,attention_quant,attention_prefill_tc,gemv_q4,kv_quantize}.cu.o; do
    "$cuobjdump_bin" -sass "$obj" | grep -E 'Function :|LDG|HMMA|BRA|LDL|STL|SHFL' |
      sed -E 's@^\s+/\*[0-9a-f]+\*/\s+@@; s@\s*/\*.*@@; s@ +@ @g'
  done >"$out/sass.txt" 2>&1
  # The wgmma prefill kernels' loops must not overwrite Q (a ptxas register allocation bug did,
  # session 17): a failure here explains a failing AttentionPrefillWgmmaTest before it runs.
  if python3 tools/gpu/wgmma_q_registers.py \
    "$build/src/backend/cuda/CMakeFiles/qs_backend_cuda.dir/attention_prefill_wgmma.cu.o" \
    --cuobjdump "$cuobjdump_bin" >>"$out/sass.txt" 2>&1; then
    result[sass]=ok
  else
    result[sass]="FAILED (wgmma Q registers, sass.txt)"
  fi
}

prewait_check() {
  local obj name
  # No kernel may read through the read-only path before its PDL wait (nvcc hoisted such loads of
  # h above it in session 49, and the consumers read h before the producer's +=): a failure names
  # the kernel before its tests fail. Every object at once.
  rm -rf "$out/prewait" && mkdir -p "$out/prewait"
  for obj in "$build"/src/backend/cuda/CMakeFiles/qs_backend_cuda.dir/*.cu.o; do
    name=$(basename "$obj" .cu.o)
    { python3 tools/gpu/sass_pre_wait.py "$obj" --cuobjdump "$cuobjdump_bin" \
        >"$out/prewait/$name.txt" 2>&1
      echo $? >"$out/prewait/$name.rc"; } &
  done
  wait
  cat "$out"/prewait/*.txt >"$out/sass_pre_wait.txt"
  result[prewait]=ok
  grep -qv '^0$' "$out"/prewait/*.rc && result[prewait]="FAILED (sass_pre_wait.txt)"
  rm -r "$out/prewait"
  grep -E '^(READ-ONLY|#)' "$out/sass_pre_wait.txt"
}

want sass && [[ -x $cuobjdump_bin ]] && timed sass sass_check
want prewait && [[ -x $cuobjdump_bin ]] && timed prewait prewait_check

if want test && [[ -x $build/tests/test_cuda ]]; then
  run_stage test ${QS_TEST_LIMIT:-300} bash -c "'$build/tests/test_cuda' --gtest_filter='${QS_TEST_FILTER:-*}' --gtest_output=xml:'$out/test_cuda.xml' >'$out/test_cuda.log' 2>&1"
fi

if want sanitize && [[ -x $build/tests/test_cuda ]]; then
  # Small cases of every kernel: memcheck (out-of-bounds, misaligned), then racecheck on the
  # kernels that share memory between threads. The sampling kernels (clusters of 8 blocks sharing
  # distributed shared memory) are in memcheck only: racecheck did not finish one sampling test in
  # 45 s (session 18) or in 100 s (session 33), which left the whole stage timed out.
  subset='CudaOpsTest.EmbeddingMatchesCpuExactly:CudaOpsTest.RmsNormMatchesCpu:CudaOpsTest.RopeMatchesCpu:CudaOpsTest.SwigluAndAddMatchCpu:CudaOpsTest.GemvEveryRowCountAndDtype:CudaOpsTest.GemvOddShapesUseTheFallback:CudaOpsTest.GemvEveryTuning:CudaOpsTest.AttentionSanitizerSubset:CudaOpsTest.QuantAttentionSanitizerSubset:CudaOpsTest.QuantizeKvOtherSupportedShapes:CudaOpsTest.QuantizeKvLayersEqualsOneCallPerLayer:CudaOpsTest.MatmulQ4OddAndShortShapes:CudaOpsTest.AttentionPrefillTcPaddedRowStride:CudaOpsTest.F16RowsDecodeTcSanitizerSubset:CudaOpsTest.F16RowsPrefillDirectEqualsConverted:CudaOpsTest.ArgmaxRowsMatchesTheHost:CudaOpsTest.AddRmsNormMatchesAddThenRmsNorm:CudaOpsTest.RopeQkMatchesTwoRopes:CudaOpsTest.StoreKvRowPairMatchesTwoStores:CudaOpsTest.MatmulQ4GroupMatchesCpu:CudaOpsTest.SnapKvScoresEdgeShapes:AttentionPrefillWgmmaTest.OneHotValuesShowTheWeights:CudaOpsTest.SampleRowsWithoutProbsBuffer:TinyModels/CudaModelTest.*'
  run_stage sanitize 150 bash -c "compute-sanitizer --tool memcheck --error-exitcode 3 '$build/tests/test_cuda' --gtest_filter='$subset' >'$out/sanitizer.log' 2>&1 && compute-sanitizer --tool racecheck --error-exitcode 3 '$build/tests/test_cuda' --gtest_filter='CudaOpsTest.AttentionSanitizerSubset:CudaOpsTest.SnapKvScoresEdgeShapes:CudaOpsTest.F16RowsDecodeTcSanitizerSubset:CudaOpsTest.GemvEveryRowCountAndDtype:CudaOpsTest.QuantAttentionSanitizerSubset:CudaOpsTest.QuantizeKvOtherSupportedShapes:CudaOpsTest.MatmulQ4OddAndShortShapes:CudaOpsTest.MatmulQ4GroupMatchesCpu:CudaOpsTest.AddRmsNormMatchesAddThenRmsNorm:AttentionPrefillWgmmaTest.OneHotValuesShowTheWeights' >>'$out/sanitizer.log' 2>&1"
fi

if want bench && [[ -x $build/bench/cuda/bench_ops ]]; then
  run_stage bench 140 bash -c "'$build/bench/cuda/bench_ops' ${QS_BENCH_ARGS:-} >'$out/bench.log' 2>&1"
fi

if want e2e && [[ -x $build/quantspec ]]; then
  run_stage e2e "${QS_E2E_LIMIT:-300}" bash -c "OUT='$out' tools/gpu/bench_e2e.sh >'$out/e2e.log' 2>&1"
fi

if want oracle && [[ -x $build/quantspec ]]; then
  run_stage oracle "${QS_ORACLE_LIMIT:-300}" bash -c "OUT='$out' tools/gpu/hf_oracle.sh >'$out/oracle.log' 2>&1"
fi

# --- short table ---------------------------------------------------------------------------------
echo
echo "== GPU check =="
for s in build sass prewait test sanitize bench e2e oracle; do
  [[ -n ${result[$s]:-} ]] && printf '%-9s %-16s %4ss\n' "$s" "${result[$s]}" "${seconds[$s]}"
done
if [[ -f $out/test_cuda.log ]]; then
  grep -E '^\[  (PASSED|FAILED) |^\[==========\] [0-9]+ tests' "$out/test_cuda.log" | tail -25
  grep -E '^\[ max rel error \]' "$out/test_cuda.log"
  grep -B2 -A6 -m3 'Failure' "$out/test_cuda.log" | head -40
  grep -E 'internal error|CUDA error' "$out/test_cuda.log" | head -5
fi
[[ -f $out/sanitizer.log ]] && grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|Invalid|Race' "$out/sanitizer.log" | head -12
[[ -f $out/bench.log ]] && sed -n '/== summary/,$p' "$out/bench.log"
[[ -f $out/bench.log ]] && grep -E 'internal error|CUDA error' "$out/bench.log" | head -3
[[ -f $out/e2e.log ]] && cat "$out/e2e.log"
[[ -f $out/oracle.log ]] && grep -E "ORACLE|hf_oracle" "$out/oracle.log"
exit 0
