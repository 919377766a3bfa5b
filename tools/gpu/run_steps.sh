#!/usr/bin/env bash
# One device call as a list of steps (runs ON the GPU machine, from the repository root, with
# .deb/bundle carried): each step's output goes to its own log, a line per step with its time and
# status to steps.txt, and after every step everything is packed into $OUT/results.tgz, so a call
# that runs out of time still brings back what it measured (the device tool returns a few files
# only). A step starts only before the deadline.
#
#   bash tools/gpu/run_steps.sh build 'test CudaOpsTest.GateUpSwiglu*' \
#     'env QS_SWIGLU_MIXED=1 test TinyModels/*:*CudaEngine*' \
#     'ab QS_SWIGLU_MIXED 32768 quantspec,ar-fp16' 'ncu gemv_q4_persist_sub w4layer 12'
#
# Steps (words; an `env NAME=VALUE ...` prefix sets variables for that step only):
#   build                          tools/gpu/check.sh build prewait (test_cuda, bench_ops,
#                                  quantspec; then no read-only load before a PDL wait)
#   test FILTER                    test_cuda --gtest_filter=FILTER
#   memcheck FILTER                compute-sanitizer memcheck of test_cuda --gtest_filter=FILTER
#   bench SECTIONS [--quick]       bench_ops --sections SECTIONS [--quick]
#   ab SWITCH CONTEXT MODES [N [R]]  tools/gpu/ab_switch.sh llama2-7b, values 1,0, N tokens
#                                  (default 256), R rounds (default 1); QS_AB_SHAPE (the call's
#                                  environment or the step's env prefix): another shape
#   matrix SHAPE CONTEXTS MODES [N]  tools/gpu/bench_matrix.sh (N tokens, default 256)
#   ncu REGEX SECTIONS COUNT       tools/gpu/ncu_stalls.sh
#   trace SHAPE CONTEXT MODES      tools/gpu/trace_decode.sh
#   cli SHAPE TOKENS               tools/gpu/cli_long_context.sh (generate and chat over a
#                                  TOKENS-token document, the bundled model padded to SHAPE)
# Environment: QS_COMMIT (the tree's commit, for env.log), QS_STEPS_DEADLINE (seconds after the
# start past which no step starts; default 540), QS_STEPS_LIMIT (seconds after the start at which
# a running step is stopped; default 580, inside the device tool's 600), QS_STEPS_DRY=1 (print each step's command, run
# nothing: what tests/cli/test_run_steps.py checks), OUT (default ./out). Exit status: 2 if a
# step was malformed, else 1 if a step failed, else 0.
set -uo pipefail

repo=$(cd "$(dirname "$0")/../.." && pwd)
cd "$repo" || exit 1
out=${OUT:-$repo/out}
work=$(mktemp -d "${TMPDIR:-/tmp}/qs-steps.XXXXXX")
deadline=${QS_STEPS_DEADLINE:-540}
limit=${QS_STEPS_LIMIT:-580}
dry=${QS_STEPS_DRY:-}
build=${QS_GPU_BUILD:-$repo/build-gpu}
mkdir -p "$out"

log() { echo "[$SECONDS s] $*" | tee -a "$work/steps.txt"; }
pack() { [[ -n $dry ]] || tar czf "$out/results.tgz" -C "$work" . 2>/dev/null; }

# The command of one step (words after any env prefix) as an array in `cmd`; returns 1 for a bad
# step.
step_command() {
  local kind=$1
  shift
  case $kind in
    build) cmd=(bash tools/gpu/check.sh build prewait) ;;
    test) (($# == 1)) || return 1
      cmd=("$build/tests/test_cuda" "--gtest_filter=$1") ;;
    memcheck) (($# == 1)) || return 1
      cmd=(compute-sanitizer --tool memcheck --error-exitcode 3 "$build/tests/test_cuda"
        "--gtest_filter=$1") ;;
    bench) (($# == 1)) || { (($# == 2)) && [[ $2 == --quick ]]; } || return 1
      cmd=("$build/bench/cuda/bench_ops" --sections "$1" "${@:2}") ;;
    ab) (($# >= 3 && $# <= 5)) || return 1
      cmd=(env "QS_AB_SWITCH=$1" "QS_AB_CONTEXT=$2" "QS_AB_MODES=$3" "QS_AB_TOKENS=${4:-256}"
        "QS_AB_REPEATS=${5:-1}" bash tools/gpu/ab_switch.sh "$ab_shape") ;;
    matrix) (($# == 3 || $# == 4)) || return 1
      cmd=(env "QS_MATRIX_CONTEXTS=$2" "QS_MATRIX_MODES=$3" "QS_MATRIX_TOKENS=${4:-256}"
        bash tools/gpu/bench_matrix.sh "$1") ;;
    ncu) (($# == 3)) || return 1
      cmd=(bash tools/gpu/ncu_stalls.sh "$1" "$2" "$3") ;;
    trace) (($# == 3)) || return 1
      cmd=(env "QS_TRACE_MODEL=$1" "QS_TRACE_CONTEXT=$2" "QS_TRACE_MODES=$3"
        bash tools/gpu/trace_decode.sh) ;;
    cli) (($# == 2)) || return 1
      cmd=(bash tools/gpu/cli_long_context.sh "$1" "$2") ;;
    *) return 1 ;;
  esac
}

[[ -f $build/env.sh ]] && source "$build/env.sh"  # a machine that has built already
log "start: $# steps, deadline ${deadline} s, commit ${QS_COMMIT:-unknown}"
n=0
status=0
for step in "$@"; do
  n=$((n + 1))
  read -r -a words <<<"$step"
  envs=()
  if [[ ${words[0]:-} == env ]]; then
    words=("${words[@]:1}")
    while ((${#words[@]})) && [[ ${words[0]} == *=* ]]; do
      envs+=("${words[0]}")
      words=("${words[@]:1}")
    done
  fi
  # The A/B shape: QS_AB_SHAPE from the step's env prefix, else from the call's environment.
  ab_shape=${QS_AB_SHAPE:-llama2-7b}
  for e in "${envs[@]}"; do [[ $e == QS_AB_SHAPE=* ]] && ab_shape=${e#QS_AB_SHAPE=}; done
  if ! step_command "${words[@]}"; then
    log "step $n: bad step '$step'"
    status=2
    continue
  fi
  if ((SECONDS > deadline || SECONDS >= limit)); then
    log "step $n skipped (deadline): $step"
    continue
  fi
  if [[ -n $dry ]]; then
    echo "step $n: env ${envs[*]} ${cmd[*]}"
    continue
  fi
  t0=$SECONDS
  # The step's own OUT: the scripts that write result files put them under it.
  timeout --kill-after=5 $((limit - SECONDS)) env "${envs[@]}" OUT="$work/step$n" \
    QS_COMMIT="${QS_COMMIT:-}" "${cmd[@]}" >"$work/step$n.log" 2>&1
  rc=$?
  ((rc != 0 && status == 0)) && status=1
  [[ -f $build/env.sh ]] && source "$build/env.sh"  # after the build step: the bundle's libraries
  log "step $n: rc $rc in $((SECONDS - t0)) s: $step"
  # The lines worth reading in the call's reply: test verdicts, sanitizer summaries, bench rows.
  grep -hE '^\[  (PASSED|FAILED) |^\[==========\] [0-9]+ tests|ERROR SUMMARY|^\| |^(ar-|quantspec |streamingllm |snapkv )|medians per arm|QS_[A-Z_]+=.* n=|^build |^cli: ' \
    "$work/step$n.log" | sort -u | head -40 | tee -a "$work/steps.txt"
  grep -hA5 'Failure$' "$work/step$n.log" | head -20 | tee -a "$work/steps.txt"
  pack
done
log "done"
pack
exit $status
